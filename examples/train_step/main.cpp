// A LibTorch training program whose step Crucible compiles: a small network
// trained on Fashion-MNIST with AdamW and gradient clipping, checkpointed the
// LibTorch way mid-run, then resumed into a new model and optimizer. The
// README and docs/training-step.md show its code; CI builds and runs it.
//   train_step [FASHION_MNIST_DIR]
// Exit code 0 when the resumed run's test accuracy is above 80%.
#include <crucible/data/fashion_mnist.h>
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/train_step.h>

#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/serialize.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace {

struct Net : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(784, 128));
    fc2 = register_module("fc2", torch::nn::Linear(128, 10));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2->forward(torch::relu(fc1->forward(x.flatten(1)))); }
};

// Trains `steps` batches of 64, from batch `first` on.
void train(crucible::pipeline::TrainStep& step, torch::optim::StepLR& scheduler,
           const crucible::data::FashionMnist& data, int64_t first, int64_t steps) {
  for (int64_t i = first; i < first + steps; ++i) {
    const int64_t start = i * 64 % (data.images.size(0) - 64);
    const at::Tensor loss = step({data.images.slice(0, start, start + 64), data.labels.slice(0, start, start + 64)});
    if (i % 100 == 0) std::printf("step %4lld  loss %.4f\n", static_cast<long long>(i), loss.item<double>());
    scheduler.step();
  }
}

// A compiled step over `model` and `optimizer` (the README's code).
crucible::pipeline::TrainStep compile(const std::shared_ptr<Net>& model, torch::optim::AdamW& optimizer) {
  // [snippet:compile]
  crucible::pipeline::TrainStepOptions options;
  options.clip_grad_norm = crucible::pipeline::ClipGradNorm{.max_norm = 1.0};
  crucible::pipeline::TrainStep step = crucible::pipeline::compile_train_step(
      model, optimizer,
      [model](torch::nn::Module&, const std::vector<at::Tensor>& batch) {
        return torch::nn::functional::cross_entropy(model->forward(batch[0]), batch[1]);
      },
      crucible::pipeline::Builder(), options);  // the inductor, with the core decompositions
  // [end]
  return step;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : crucible::data::kFashionMnistDir;
  const auto train_data = crucible::data::load_fashion_mnist(crucible::data::Split::Train, dir);
  const auto test_data = crucible::data::load_fashion_mnist(crucible::data::Split::Test, dir);
  const std::filesystem::path checkpoint = std::filesystem::temp_directory_path() / "crucible_train_step_example";
  std::filesystem::create_directories(checkpoint);

  torch::manual_seed(0);
  // [snippet:train]
  auto model = std::make_shared<Net>();
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  torch::optim::StepLR scheduler(optimizer, /*step_size=*/300, /*gamma=*/0.5);
  crucible::pipeline::TrainStep step = compile(model, optimizer);
  train(step, scheduler, train_data, 0, 400);  // forward, backward, clipping and AdamW: one compiled graph
  // The optimizer holds what the compiled steps did (AdamW's moments and
  // step counts), so a checkpoint is the LibTorch one.
  torch::save(model, (checkpoint / "model.pt").string());
  torch::save(optimizer, (checkpoint / "optimizer.pt").string());
  // [end]

  // Resumed in a new process's way: a new model and optimizer, loaded.
  auto resumed = std::make_shared<Net>();
  torch::optim::AdamW resumed_optimizer(resumed->parameters(), torch::optim::AdamWOptions(1e-3));
  torch::load(resumed, (checkpoint / "model.pt").string());
  torch::load(resumed_optimizer, (checkpoint / "optimizer.pt").string());
  torch::optim::StepLR resumed_scheduler(resumed_optimizer, 300, 0.5);
  crucible::pipeline::TrainStep resumed_step = compile(resumed, resumed_optimizer);
  train(resumed_step, resumed_scheduler, train_data, 400, 400);
  std::printf("gradient norm of the last step, before clipping: %.4f\n", resumed_step.grad_norm().item<double>());

  torch::NoGradGuard no_grad;
  const at::Tensor predicted = resumed->forward(test_data.images).argmax(1);
  const double accuracy = predicted.eq(test_data.labels).to(at::kDouble).mean().item<double>();
  std::printf("test accuracy %.2f%%\n", 100 * accuracy);
  std::filesystem::remove_all(checkpoint);
  return accuracy > 0.8 ? 0 : 1;
}
