// Programs shaped as the official LibTorch C++ examples write them
// (pytorch/examples, cpp/: mnist, dcgan, regression, custom-dataset,
// transfer-learning): their modules, losses, optimizers and loops, small
// sizes, in float64. Each is compiled with every builder of
// programs_testing.h (the interpreter, inductor, a fake-mode trace, pre-grad
// passes) and compared with the same program run eagerly from the same
// state: losses at every step, then parameters and buffers, as
// test_programs.cpp does.
#include <crucible/data/fashion_mnist.h>
#include <crucible/inductor/compile_fx_aot.h>
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/error.h>
#include <crucible/pipeline/train_step.h>

#include <ATen/ATen.h>
#include <torch/data.h>
#include <torch/nn.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <memory>
#include <string>
#include <vector>

#include "catch.h"
#include "data_dir.h"
#include "programs_testing.h"
#include "testing.h"

using namespace crucible::pipeline;
using namespace crucible::testing::programs;

namespace {

// The largest change of any parameter since `initial` (a clone of each).
double max_change(const std::vector<at::Tensor>& initial, const torch::nn::Module& m) {
  double moved = 0;
  const auto now = m.parameters();
  for (size_t i = 0; i < now.size(); ++i)
    moved = std::max(moved, (now[i].detach() - initial[i].to(now[i].device())).abs().max().item<double>());
  return moved;
}

std::vector<at::Tensor> clones(const torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

// Fashion-MNIST's test split as its files hold it (uint8 images [10000, 28,
// 28], labels), read once: the smaller split, and a few batches are all the
// programs take.
struct RawImages {
  at::Tensor images, labels;
};
const RawImages& raw_fashion_mnist() {
  static const RawImages raw = [] {
    const std::string dir = fashion_mnist_test_dir();
    return RawImages{crucible::data::read_idx(dir + "/t10k-images-idx3-ubyte.gz"),
                     crucible::data::read_idx(dir + "/t10k-labels-idx1-ubyte.gz").to(at::kLong)};
  }();
  return raw;
}

// A dataset as the custom-dataset example writes one: it holds the raw
// images and makes one example at a time in get() (pixels scaled to [0, 1],
// float64), for torch::data's samplers and transforms.
class FashionMnistDataset : public torch::data::datasets::Dataset<FashionMnistDataset> {
 public:
  FashionMnistDataset(int64_t begin, int64_t end) : begin_(begin), end_(end) {}
  torch::data::Example<> get(size_t index) override {
    const RawImages& raw = raw_fashion_mnist();
    const int64_t i = begin_ + static_cast<int64_t>(index);
    return {raw.images[i].unsqueeze(0).to(at::kDouble).div(255), raw.labels[i]};
  }
  std::optional<size_t> size() const override { return static_cast<size_t>(end_ - begin_); }

 private:
  int64_t begin_, end_;
};

// Every batch of a loader over images [begin, end), normalized and stacked
// as the MNIST example's loader does.
std::vector<Batch> mnist_batches(int64_t begin, int64_t end, int64_t batch_size) {
  namespace T = torch::data::transforms;
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      FashionMnistDataset(begin, end)
          .map(T::Normalize<>(crucible::data::kFashionMnistMean, crucible::data::kFashionMnistStd))
          .map(T::Stack<>()),
      batch_size);
  std::vector<Batch> out;
  for (torch::data::Example<>& b : *loader) out.push_back({b.data, b.target});
  return out;
}

// The MNIST example's network.
struct MnistNetImpl : torch::nn::Module {
  MnistNetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 10, 5)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(10, 20, 5)))),
        conv2_drop(register_module("conv2_drop", torch::nn::Dropout2d())),
        fc1(register_module("fc1", torch::nn::Linear(320, 50))),
        fc2(register_module("fc2", torch::nn::Linear(50, 10))) {}
  at::Tensor forward(at::Tensor x) {
    x = at::relu(at::max_pool2d(conv1->forward(x), 2));
    x = at::relu(at::max_pool2d(conv2_drop->forward(conv2->forward(x)), 2));
    x = x.view({-1, 320});
    x = at::relu(fc1->forward(x));
    x = at::dropout(x, /*p=*/0.5, /*train=*/is_training());
    return at::log_softmax(fc2->forward(x), /*dim=*/1);
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Dropout2d conv2_drop;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(MnistNet);

}  // namespace

TEST_CASE(
    "example programs: the MNIST example's Net (Dropout2d, dropout, log_softmax, NLL, SGD with momentum), "
    "then its evaluation in eval mode",
    "[pipeline][programs]") {
  const std::vector<Batch> train = mnist_batches(0, 24, 8);
  const Batch test = mnist_batches(100, 116, 16).at(0);
  REQUIRE(train.size() == 3);
  for_each_backend([&](const Builder& b) {
    LossFn loss = [](torch::nn::Module& m, const Batch& batch) {
      return torch::nn::functional::nll_loss(dynamic_cast<MnistNetImpl&>(m).forward(batch[0]), batch[1]);
    };
    Trained t = train_and_compare([] { return MnistNet().ptr(); }, sgd(0.01, 0.5), loss,
                                  [&](int64_t i) { return train.at(i); }, 3, b);
    if (!t.compiled) return;
    // The example's test(): eval mode, no grad; the summed loss and the
    // count of right answers, compiled with the builder (aot_module) and
    // with inductor's compile_fx.
    crucible::tracer::ModuleFn evaluate = [](torch::nn::Module& m, const std::vector<at::Tensor>& in) {
      const at::Tensor out = dynamic_cast<MnistNetImpl&>(m).forward(in[0]);
      return std::vector<at::Tensor>{
          out,
          torch::nn::functional::nll_loss(out, in[1],
                                          torch::nn::functional::NLLLossFuncOptions().reduction(torch::kSum)),
          out.argmax(1).eq(in[1]).sum()};
    };
    t.compiled->eval();
    t.eager->eval();
    torch::NoGradGuard no_grad;
    const at::Device device = crucible::testing::test_device();
    const std::vector<at::Tensor> in{test[0].to(device), test[1].to(device)};
    const std::vector<at::Tensor> expected = evaluate(*t.eager, in);
    std::vector<std::vector<at::Tensor>> got{b.compile(t.compiled, evaluate)(in)};
    if (b.backend_name() == "inductor") got.push_back(crucible::inductor::compile_fx(t.compiled, evaluate, in)(in));
    for (const std::vector<at::Tensor>& out : got) {
      REQUIRE(out.size() == 3);
      REQUIRE_LIKE_EAGER(out[0], expected[0], kRtol, kAtol);
      REQUIRE_LIKE_EAGER(out[1], expected[1], kRtol, kAtol);
      REQUIRE_LIKE_EAGER(out[2], expected[2], 0.0, 0.0);
    }
    require_same_state(*t.compiled, *t.eager);  // evaluation changed nothing
  });
}

namespace {

// The DCGAN example's networks, at 8x8 images: noise [N, 4, 1, 1] → [N, 8,
// 4, 4] → [N, 1, 8, 8]; the discriminator a Sequential, as the example's is.
constexpr int64_t kNoiseSize = 4;

struct DcganGeneratorImpl : torch::nn::Module {
  DcganGeneratorImpl()
      : conv1(register_module(
            "conv1", torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(kNoiseSize, 8, 4).bias(false)))),
        batch_norm1(register_module("batch_norm1", torch::nn::BatchNorm2d(8))),
        conv2(register_module(
            "conv2",
            torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(8, 1, 4).stride(2).padding(1).bias(false)))) {}
  at::Tensor forward(const at::Tensor& noise) {
    return at::tanh(conv2->forward(at::relu(batch_norm1->forward(conv1->forward(noise)))));
  }
  torch::nn::ConvTranspose2d conv1;
  torch::nn::BatchNorm2d batch_norm1;
  torch::nn::ConvTranspose2d conv2;
};
TORCH_MODULE(DcganGenerator);

torch::nn::Sequential dcgan_discriminator() {
  namespace nn = torch::nn;
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 8, 4).stride(2).padding(1).bias(false)),
                        nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)),
                        nn::Conv2d(nn::Conv2dOptions(8, 16, 4).stride(2).padding(1).bias(false)), nn::BatchNorm2d(16),
                        nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)),
                        nn::Conv2d(nn::Conv2dOptions(16, 1, 2).bias(false)), nn::Sigmoid());
}

struct Gan {
  std::shared_ptr<DcganGeneratorImpl> generator;
  std::shared_ptr<torch::nn::SequentialImpl> discriminator;
};

// The discriminator's loss on {real images, noise}: real images labelled
// 0.9 (label smoothing; with `random_labels`, drawn from U(0.8, 1) in the
// loss, as the PyTorch C++ frontend tutorial's loop draws them), images
// generated from the noise (detached: no gradient reaches the generator)
// labelled 0. The generator is read from outside the step's module.
LossFn discriminator_loss(std::shared_ptr<DcganGeneratorImpl> generator, bool random_labels) {
  return [generator, random_labels](torch::nn::Module& m, const Batch& batch) {
    auto& discriminator = dynamic_cast<torch::nn::SequentialImpl&>(m);
    const at::Tensor real_labels = random_labels ? at::empty({batch[0].size(0)}, batch[0].options()).uniform_(0.8, 1.0)
                                                 : at::full({batch[0].size(0)}, 0.9, batch[0].options());
    const at::Tensor real_output = discriminator.forward(batch[0]).reshape(real_labels.sizes());
    const at::Tensor d_loss_real = torch::nn::functional::binary_cross_entropy(real_output, real_labels);
    const at::Tensor fake_images = generator->forward(batch[1]);
    const at::Tensor fake_labels = at::zeros({batch[1].size(0)}, batch[1].options());
    const at::Tensor fake_output = discriminator.forward(fake_images.detach()).reshape(fake_labels.sizes());
    const at::Tensor d_loss_fake = torch::nn::functional::binary_cross_entropy(fake_output, fake_labels);
    return d_loss_real + d_loss_fake;
  };
}

// The generator's loss on {noise}: its images labelled 1 by the
// discriminator, through which the gradient flows (its parameters receive
// gradients, but are not the generator optimizer's).
LossFn generator_loss(std::shared_ptr<torch::nn::SequentialImpl> discriminator) {
  return [discriminator](torch::nn::Module& m, const Batch& batch) {
    const at::Tensor fake_images = dynamic_cast<DcganGeneratorImpl&>(m).forward(batch[0]);
    const at::Tensor labels = at::ones({batch[0].size(0)}, batch[0].options());
    const at::Tensor output = discriminator->forward(fake_images).reshape(labels.sizes());
    return torch::nn::functional::binary_cross_entropy(output, labels);
  };
}

}  // namespace

TEST_CASE(
    "example programs: the DCGAN loop, two compiled steps (discriminator on real and detached fake images, "
    "generator through the discriminator) with two Adam optimizers",
    "[pipeline][programs]") {
  // Real images: Fashion-MNIST pooled to 8x8, in [-1, 1] as the example's
  // Normalize<>(0.5, 0.5) gives.
  const at::Tensor images =
      at::adaptive_avg_pool2d(raw_fashion_mnist().images.slice(0, 0, 16).unsqueeze(1).to(at::kDouble).div(255), {8, 8})
          .mul(2)
          .sub(1);
  const bool random_labels = GENERATE(false, true);
  INFO((random_labels ? "real labels drawn from U(0.8, 1)" : "real labels 0.9"));
  for_each_backend([&](const Builder& b) {
    if (crucible::testing::compile_only()) CRUCIBLE_SKIP("CUDA asked for and no GPU here");
    const at::Device device = crucible::testing::test_device();
    torch::manual_seed(0);
    Gan compiled{DcganGenerator().ptr(), dcgan_discriminator().ptr()};
    Gan eager{DcganGenerator().ptr(), dcgan_discriminator().ptr()};
    for (Gan* gan : {&compiled, &eager}) {
      gan->generator->to(device, at::kDouble);
      gan->discriminator->to(device, at::kDouble);
    }
    copy_all(*compiled.generator, *eager.generator);
    copy_all(*compiled.discriminator, *eager.discriminator);
    const std::vector<at::Tensor> initial_g = clones(*compiled.generator), initial_d = clones(*compiled.discriminator);
    auto adam_options = torch::optim::AdamOptions(2e-3).betas({0.5, 0.999});
    torch::optim::Adam g_opt_c(compiled.generator->parameters(), adam_options);
    torch::optim::Adam d_opt_c(compiled.discriminator->parameters(), adam_options);
    torch::optim::Adam g_opt_e(eager.generator->parameters(), adam_options);
    torch::optim::Adam d_opt_e(eager.discriminator->parameters(), adam_options);
    TrainStep d_step =
        b.compile_train_step(compiled.discriminator, d_opt_c, discriminator_loss(compiled.generator, random_labels));
    TrainStep g_step = b.compile_train_step(compiled.generator, g_opt_c, generator_loss(compiled.discriminator));
    const LossFn d_loss_e = discriminator_loss(eager.generator, random_labels),
                 g_loss_e = generator_loss(eager.discriminator);
    for (int64_t i = 0; i < 4; ++i) {
      INFO("iteration " << i);
      const at::Tensor real = images.slice(0, 4 * i, 4 * i + 4).to(device);
      const at::Tensor noise = f64_randn({4, kNoiseSize, 1, 1}, 100 + i).to(device);
      // The discriminator's step.
      torch::manual_seed(200 + i);  // the same labels drawn
      const at::Tensor d_loss_c = d_step({real, noise});
      torch::manual_seed(200 + i);
      d_opt_e.zero_grad();
      const at::Tensor d_loss = d_loss_e(*eager.discriminator, {real, noise});
      d_loss.backward();
      d_opt_e.step();
      REQUIRE_LIKE_EAGER(d_loss_c, d_loss.detach(), kRtol, kAtol);
      // The detached images give the generator no gradient.
      for (const at::Tensor& p : compiled.generator->parameters()) CHECK(!p.grad().defined());
      require_same_state(*compiled.generator, *eager.generator);  // its batch norm's running statistics
      require_same_state(*compiled.discriminator, *eager.discriminator);
      std::vector<at::Tensor> d_grads_before;
      for (const at::Tensor& p : eager.discriminator->parameters()) d_grads_before.push_back(p.grad().clone());
      // The generator's step.
      const at::Tensor g_loss_c = g_step({noise});
      g_opt_e.zero_grad();
      const at::Tensor g_loss = g_loss_e(*eager.generator, {noise});
      g_loss.backward();
      g_opt_e.step();
      REQUIRE_LIKE_EAGER(g_loss_c, g_loss.detach(), kRtol, kAtol);
      require_same_state(*compiled.generator, *eager.generator);
      require_same_state(*compiled.discriminator, *eager.discriminator);
      // The discriminator's parameters received the generator step's
      // gradient, as eager's backward adds it to theirs (which the next
      // discriminator step's zero_grad clears; the compiled step starts
      // from no gradient either way).
      const auto pc = compiled.discriminator->parameters(), pe = eager.discriminator->parameters();
      for (size_t k = 0; k < pc.size(); ++k) {
        INFO("discriminator parameter " << k);
        REQUIRE(pc[k].grad().defined());
        REQUIRE_LIKE_EAGER(pc[k].grad(), pe[k].grad() - d_grads_before[k], 1e-7, 1e-10);
      }
    }
    CHECK(d_step.num_compilations() == 1);
    CHECK(g_step.num_compilations() == 1);
    REQUIRE(max_change(initial_g, *compiled.generator) > 1e-4);
    REQUIRE(max_change(initial_d, *compiled.discriminator) > 1e-4);
  });
}

namespace {

// The regression example's features: x, x^2, x^3, x^4 of each sample.
constexpr int64_t kPolyDegree = 4;
at::Tensor make_features(const at::Tensor& x) {
  const at::Tensor column = x.unsqueeze(1);
  std::vector<at::Tensor> powers;
  for (int64_t i = 1; i <= kPolyDegree; ++i) powers.push_back(column.pow(i));
  return at::cat(powers, 1);
}

}  // namespace

TEST_CASE(
    "example programs: the regression example (polynomial features, Linear, smooth L1, SGD) looped until the "
    "loss falls below a threshold",
    "[pipeline][programs]") {
  // The target polynomial, as the example draws it.
  const at::Tensor w_target = f64_randn({kPolyDegree, 1}, 7) * 5, b_target = f64_randn({1}, 8) * 5;
  auto get_batch = [&](int64_t step) {
    const at::Tensor x = make_features(f64_randn({32}, 1000 + step));
    return Batch{x, x.mm(w_target) + b_target};
  };
  constexpr double kThreshold = 1e-3;
  constexpr int64_t kMaxSteps = 3000;
  for_each_backend([&](const Builder& b) {
    if (crucible::testing::compile_only()) CRUCIBLE_SKIP("CUDA asked for and no GPU here");
    const at::Device device = crucible::testing::test_device();
    torch::manual_seed(0);
    torch::nn::Linear compiled(kPolyDegree, 1), eager(kPolyDegree, 1);
    compiled->to(device, at::kDouble);
    eager->to(device, at::kDouble);
    copy_all(*compiled, *eager);
    torch::optim::SGD opt_c(compiled->parameters(), 0.1), opt_e(eager->parameters(), 0.1);
    LossFn loss = [](torch::nn::Module& m, const Batch& batch) {
      return torch::nn::functional::smooth_l1_loss(dynamic_cast<torch::nn::LinearImpl&>(m).forward(batch[0]), batch[1]);
    };
    TrainStep step = b.compile_train_step(compiled.ptr(), opt_c, loss);
    // Each loop as the example writes it: until its own loss is small.
    int64_t steps_c = 0, steps_e = 0;
    std::vector<double> losses_c, losses_e;
    for (bool done = false; !done && steps_c < kMaxSteps;) {
      Batch batch = get_batch(steps_c++);
      for (at::Tensor& t : batch) t = t.to(device);
      losses_c.push_back(step(batch).item<double>());
      done = losses_c.back() < kThreshold;
    }
    for (bool done = false; !done && steps_e < kMaxSteps;) {
      Batch batch = get_batch(steps_e++);
      for (at::Tensor& t : batch) t = t.to(device);
      opt_e.zero_grad();
      const at::Tensor l = loss(*eager, batch);
      losses_e.push_back(l.item<double>());
      l.backward();
      opt_e.step();
      done = losses_e.back() < kThreshold;
    }
    INFO("compiled: " << steps_c << " steps, eager: " << steps_e);
    REQUIRE(steps_e < kMaxSteps);
    REQUIRE(steps_c == steps_e);
    REQUIRE(steps_e > 10);
    REQUIRE_CLOSE(at::tensor(losses_c, at::kDouble), at::tensor(losses_e, at::kDouble), kRtol, kAtol);
    require_same_state(*compiled, *eager);
  });
}

namespace {

// A "pretrained" backbone (a small feature extractor with batch norm, where
// the example loads a ResNet) and the new classifier head.
struct TransferNetImpl : torch::nn::Module {
  TransferNetImpl()
      : backbone(register_module(
            "backbone",
            torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).stride(2).bias(false)),
                                  torch::nn::BatchNorm2d(4), torch::nn::ReLU(),
                                  torch::nn::AdaptiveAvgPool2d(torch::nn::AdaptiveAvgPool2dOptions({2, 2})),
                                  torch::nn::Flatten()))),
        head(register_module("head", torch::nn::Linear(16, 3))) {}
  at::Tensor forward(const at::Tensor& x) { return head->forward(backbone->forward(x)); }
  torch::nn::Sequential backbone;
  torch::nn::Linear head;
};
TORCH_MODULE(TransferNet);

// A TransferNet whose backbone's parameters are frozen.
std::shared_ptr<TransferNetImpl> frozen_transfer_net() {
  auto m = TransferNet().ptr();
  for (at::Tensor& p : m->backbone->parameters()) p.requires_grad_(false);
  return m;
}

const LossFn transfer_loss = [](torch::nn::Module& m, const Batch& batch) {
  return torch::nn::functional::cross_entropy(dynamic_cast<TransferNetImpl&>(m).forward(batch[0]), batch[1]);
};

Batch transfer_batch(int64_t i) {
  at::manual_seed(300 + i);
  return Batch{at::randn({6, 1, 9, 9}, at::kDouble), at::randint(0, 3, {6}, at::kLong)};
}

}  // namespace

TEST_CASE("example programs: transfer learning, a frozen backbone (batch norm still in train mode) and a new head",
          "[pipeline][programs]") {
  SECTION("the optimizer over the head, as the example builds it") {
    MakeOptimizer head = [](torch::nn::Module& m) {
      return std::make_unique<torch::optim::Adam>(dynamic_cast<TransferNetImpl&>(m).head->parameters(),
                                                  torch::optim::AdamOptions(1e-2));
    };
    for_each_backend([&](const Builder& b) {
      Trained t = train_and_compare(frozen_transfer_net, head, transfer_loss, transfer_batch, 4, b);
      if (!t.compiled) return;
      for (const at::Tensor& p : dynamic_cast<TransferNetImpl&>(*t.compiled).backbone->parameters())
        CHECK(!p.grad().defined());
    });
  }
  SECTION("the optimizer over every parameter, frozen ones included (SGD with momentum and weight decay)") {
    MakeOptimizer all = [](torch::nn::Module& m) {
      return std::make_unique<torch::optim::SGD>(m.parameters(),
                                                 torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-2));
    };
    for_each_backend([&](const Builder& b) {
      Trained t = train_and_compare(frozen_transfer_net, all, transfer_loss, transfer_batch, 4, b);
      if (!t.compiled) return;
      // Frozen: the update never reached the backbone (weight decay included).
      torch::manual_seed(0);
      auto fresh = frozen_transfer_net();
      fresh->to(crucible::testing::test_device(), at::kDouble);
      auto& trained = dynamic_cast<TransferNetImpl&>(*t.compiled);
      REQUIRE_EQUAL_TENSORS(trained.backbone->parameters()[0].detach(), fresh->backbone->parameters()[0].detach());
    });
  }
}

namespace {

// The module train_and_compare made whose parameters `opt` updates, among
// those `made` recorded.
std::shared_ptr<TransferNetImpl> module_of(const std::vector<std::shared_ptr<TransferNetImpl>>& made,
                                           torch::optim::Optimizer& opt) {
  const c10::TensorImpl* first = opt.param_groups().front().params().front().unsafeGetTensorImpl();
  for (const auto& m : made)
    for (const at::Tensor& p : m->parameters())
      if (p.unsafeGetTensorImpl() == first) return m;
  FAIL("no module of this optimizer");
  return nullptr;
}

}  // namespace

TEST_CASE("example programs: transfer learning, the backbone unfrozen after two steps", "[pipeline][programs]") {
  std::vector<std::shared_ptr<TransferNetImpl>> made;
  MakeModule make = [&made] {
    made.push_back(frozen_transfer_net());
    return made.back();
  };
  MakeOptimizer all = [](torch::nn::Module& m) {
    return std::make_unique<torch::optim::Adam>(m.parameters(), torch::optim::AdamOptions(1e-2));
  };
  SECTION("its parameters start requiring grad: the step compiles again and updates them, as eager does") {
    for_each_backend([&](const Builder& b) {
      made.clear();
      auto unfreeze = [&](int64_t step, torch::optim::Optimizer& opt) {
        if (step != 2) return;
        for (at::Tensor& p : module_of(made, opt)->backbone->parameters()) p.requires_grad_(true);
      };
      Trained t = train_and_compare(make, all, transfer_loss, transfer_batch, 5, b, /*compilations=*/2, unfreeze);
      if (!t.compiled) return;
      torch::manual_seed(0);
      auto fresh = frozen_transfer_net();
      fresh->to(crucible::testing::test_device(), at::kDouble);
      auto& trained = dynamic_cast<TransferNetImpl&>(*t.compiled);
      CHECK((trained.backbone->parameters()[0] - fresh->backbone->parameters()[0]).abs().max().item<double>() > 1e-4);
    });
  }
  SECTION("in eval mode while frozen (running statistics kept), then in train mode and unfrozen") {
    for_each_backend([&](const Builder& b) {
      made.clear();
      MakeModule make_eval = [&made] {
        made.push_back(frozen_transfer_net());
        made.back()->backbone->eval();
        return made.back();
      };
      auto unfreeze = [&](int64_t step, torch::optim::Optimizer& opt) {
        if (step != 2) return;
        auto m = module_of(made, opt);
        m->backbone->train();
        for (at::Tensor& p : m->backbone->parameters()) p.requires_grad_(true);
      };
      train_and_compare(make_eval, all, transfer_loss, transfer_batch, 4, b, /*compilations=*/2, unfreeze);
    });
  }
  SECTION("its parameters added to the optimizer as a new param group: the compiled step refuses") {
    for (const auto& [name, b] : builders()) {
      SECTION(name) {
        torch::manual_seed(0);
        auto m = frozen_transfer_net();
        m->to(at::kDouble);
        torch::optim::Adam opt(m->head->parameters(), torch::optim::AdamOptions(1e-2));
        TrainStep step = b.compile_train_step(m, opt, transfer_loss);
        step(transfer_batch(0));
        for (at::Tensor& p : m->backbone->parameters()) p.requires_grad_(true);
        opt.add_param_group(torch::optim::OptimizerParamGroup(m->backbone->parameters()));
        REQUIRE_THROWS_WITH(step(transfer_batch(1)),
                            CRUCIBLE_HAS_SUBSTR("parameter groups") && CRUCIBLE_HAS_SUBSTR("compile a new step"));
      }
    }
  }
}

TEST_CASE(
    "example programs: gradient accumulation, two micro-batches per optimizer step, the loss compiled with "
    "the builder (aot_module) and an eager optimizer",
    "[pipeline][programs]") {
  // The loss of one micro-batch is compiled; the loop scales it, calls
  // backward() on each and steps the torch::optim optimizer every second
  // one, as users write accumulation. Batch norm updates its running
  // statistics at each micro-batch; dropout draws at each.
  auto make = [] {
    return torch::nn::Sequential(torch::nn::Linear(6, 12), torch::nn::BatchNorm1d(12), torch::nn::ReLU(),
                                 torch::nn::Dropout(0.2), torch::nn::Linear(12, 3))
        .ptr();
  };
  crucible::tracer::ModuleFn loss_fn = [](torch::nn::Module& m, const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{
        torch::nn::functional::cross_entropy(dynamic_cast<torch::nn::SequentialImpl&>(m).forward(in[0]), in[1])};
  };
  constexpr int64_t kAccumulate = 2;
  for_each_backend([&](const Builder& b) {
    if (crucible::testing::compile_only()) CRUCIBLE_SKIP("CUDA asked for and no GPU here");
    const at::Device device = crucible::testing::test_device();
    torch::manual_seed(0);
    auto compiled = make(), eager = make();
    compiled->to(device, at::kDouble);
    eager->to(device, at::kDouble);
    copy_all(*compiled, *eager);
    const std::vector<at::Tensor> initial = clones(*compiled);
    torch::optim::SGD opt_c(compiled->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    torch::optim::SGD opt_e(eager->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    crucible::autograd::AotModule compiled_loss = b.compile(compiled, loss_fn);
    for (int64_t step = 0; step < 3; ++step) {
      opt_c.zero_grad();
      opt_e.zero_grad();
      for (int64_t micro = 0; micro < kAccumulate; ++micro) {
        INFO("step " << step << ", micro-batch " << micro);
        at::manual_seed(400 + 2 * step + micro);
        const std::vector<at::Tensor> in{at::randn({5, 6}, at::kDouble).to(device),
                                         at::randint(0, 3, {5}, at::kLong).to(device)};
        torch::manual_seed(500 + 2 * step + micro);  // the same dropout masks
        const at::Tensor lc = compiled_loss(in).at(0) / kAccumulate;
        lc.backward();
        torch::manual_seed(500 + 2 * step + micro);
        const at::Tensor le = loss_fn(*eager, in).at(0) / kAccumulate;
        le.backward();
        REQUIRE_LIKE_EAGER(lc.detach(), le.detach(), kRtol, kAtol);
      }
      auto pe = eager->named_parameters();
      for (const auto& p : compiled->named_parameters()) {
        INFO("accumulated gradient of " << p.key());
        REQUIRE_LIKE_EAGER(p.value().grad(), pe[p.key()].grad(), kRtol, kAtol);
      }
      opt_c.step();
      opt_e.step();
    }
    CHECK(compiled_loss.num_compilations() == 1);
    require_same_state(*compiled, *eager);
    REQUIRE(max_change(initial, *compiled) > 1e-4);
  });
}

namespace {

// A small classifier for the custom-dataset program. The convolution has no
// bias: batch norm would take its gradient to rounding noise, which Adam
// scales to steps of the learning rate's size in any direction.
struct SmallCnnImpl : torch::nn::Module {
  SmallCnnImpl()
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).stride(2).bias(false)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(4))),
        fc(register_module("fc", torch::nn::Linear(4 * 13 * 13, 10))) {}
  at::Tensor forward(const at::Tensor& x) { return fc->forward(at::relu(bn->forward(conv->forward(x))).flatten(1)); }
  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
  torch::nn::Linear fc;
};
TORCH_MODULE(SmallCnn);

}  // namespace

TEST_CASE(
    "example programs: a custom Dataset through torch::data's DataLoader (Stack, a random sampler, two "
    "workers, a short last batch) feeding the compiled step",
    "[pipeline][programs]") {
  for_each_backend([](const Builder& b) {
    if (crucible::testing::compile_only()) CRUCIBLE_SKIP("CUDA asked for and no GPU here");
    const at::Device device = crucible::testing::test_device();
    torch::manual_seed(0);
    auto compiled = SmallCnn().ptr(), eager = SmallCnn().ptr();
    compiled->to(device, at::kDouble);
    eager->to(device, at::kDouble);
    copy_all(*compiled, *eager);
    const std::vector<at::Tensor> initial = clones(*compiled);
    torch::optim::Adam opt_c(compiled->parameters(), 1e-2), opt_e(eager->parameters(), 1e-2);
    LossFn loss = [](torch::nn::Module& m, const Batch& batch) {
      return torch::nn::functional::cross_entropy(dynamic_cast<SmallCnnImpl&>(m).forward(batch[0]), batch[1]);
    };
    TrainStep step = b.compile_train_step(compiled, opt_c, loss);
    // 40 images in batches of 16: the last of each epoch holds 8.
    auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
        FashionMnistDataset(0, 40).map(torch::data::transforms::Stack<>()),
        torch::data::DataLoaderOptions().batch_size(16).workers(2));
    int64_t n = 0;
    for (int epoch = 0; epoch < 2; ++epoch)
      for (torch::data::Example<>& batch : *loader) {
        INFO("epoch " << epoch << ", batch " << n);
        const Batch in{batch.data.to(device), batch.target.to(device)};
        const at::Tensor compiled_loss = step(in);
        opt_e.zero_grad();
        const at::Tensor eager_loss = loss(*eager, in);
        eager_loss.backward();
        opt_e.step();
        REQUIRE_LIKE_EAGER(compiled_loss, eager_loss.detach(), kRtol, kAtol);
        ++n;
      }
    REQUIRE(n == 6);
    CHECK(step.num_compilations() == 2);
    require_same_state(*compiled, *eager);
    REQUIRE(max_change(initial, *compiled) > 1e-4);
  });
}
