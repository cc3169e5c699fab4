// A training step compiled with Crucible's defaults, in a program built with
// CMake against an installed Crucible (find_package(Crucible)): the
// inductor, which registered itself when the program loaded it, compiles
// forward, loss, backward and the Adam update into one graph. Five steps are
// checked against the same program run eagerly. Exit code 0 when they agree.
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/train_step.h>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/utils.h>

#include <iostream>
#include <vector>

int main() {
  using namespace crucible;
  torch::manual_seed(0);
  auto make = [] {
    torch::nn::Sequential m(torch::nn::Linear(16, 32), torch::nn::ReLU(), torch::nn::Linear(32, 4));
    m->to(at::kDouble);  // float64: the fused kernels' own summation order stays ~1e-15 relative
    return m;
  };
  torch::nn::Sequential compiled = make(), eager = make();
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < compiled->parameters().size(); ++i) eager->parameters()[i].copy_(compiled->parameters()[i]);
  }
  torch::optim::Adam compiled_opt(compiled->parameters(), 1e-2), eager_opt(eager->parameters(), 1e-2);
  auto loss_of = [](torch::nn::Sequential& m, const std::vector<at::Tensor>& batch) {
    return torch::nn::functional::cross_entropy(m->forward(batch[0]), batch[1]);
  };

  const std::string backend = pipeline::Builder().backend_name();
  pipeline::TrainStep step = pipeline::compile_train_step(
      compiled.ptr(), compiled_opt,
      [&](torch::nn::Module&, const std::vector<at::Tensor>& batch) { return loss_of(compiled, batch); });
  bool ok = backend == "inductor";
  for (int i = 0; i < 5; ++i) {
    const std::vector<at::Tensor> batch = {at::randn({8, 16}, at::kDouble), at::randint(0, 4, {8}, at::kLong)};
    const at::Tensor loss = step(batch);
    eager_opt.zero_grad();
    const at::Tensor expected = loss_of(eager, batch);
    expected.backward();
    eager_opt.step();
    ok = ok && at::allclose(loss, expected.detach(), /*rtol=*/1e-9, /*atol=*/1e-12);
  }
  for (size_t i = 0; i < eager->parameters().size(); ++i)
    ok = ok && at::allclose(compiled->parameters()[i], eager->parameters()[i], 1e-9, 1e-12);
  std::cout << "cmake consumer: 5 Adam steps compiled by the " << backend << " backend "
            << (ok ? "agree with eager" : "DIFFER from eager (or the default backend is not the inductor)") << "\n";
  return ok ? 0 : 1;
}
