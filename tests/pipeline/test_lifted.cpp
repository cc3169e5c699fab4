// Compiled training steps whose loss reads tensors from outside the module
// (Note [Lifted tensors]), beside eager twins. A GAN: the generator step
// reads the discriminator and the discriminator step reads the generator;
// both must read the other module's current weights at every call, update
// its BatchNorm statistics as eager does, and give it the gradient eager's
// backward gives it. A tensor captured by the loss: changed in place,
// replaced, reshaped.
#include <crucible/data/fashion_mnist.h>
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/train_step.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include "catch.h"
#include "data_dir.h"
#include "testing.h"

#include <algorithm>

using namespace crucible::pipeline;
using namespace crucible::data;
using crucible::testing::kGradAtol;
using crucible::testing::kGradRtol;

namespace {

constexpr int64_t kLatent = 16;

// z [B, 16, 1, 1] -> 7x7 -> 14x14 -> 28x28 images in [-1, 1], through
// transposed convolutions with BatchNorm.
struct GeneratorImpl : torch::nn::Module {
  GeneratorImpl() {
    namespace nn = torch::nn;
    net = register_module(
        "net",
        nn::Sequential(nn::ConvTranspose2d(nn::ConvTranspose2dOptions(kLatent, 32, 7)), nn::BatchNorm2d(32), nn::ReLU(),
                       nn::ConvTranspose2d(nn::ConvTranspose2dOptions(32, 16, 4).stride(2).padding(1)),
                       nn::BatchNorm2d(16), nn::ReLU(),
                       nn::ConvTranspose2d(nn::ConvTranspose2dOptions(16, 1, 4).stride(2).padding(1)), nn::Tanh()));
  }
  at::Tensor forward(const at::Tensor& z) { return net->forward(z); }
  torch::nn::Sequential net{nullptr};
};
TORCH_MODULE(Generator);

// 28x28 image -> one logit, with BatchNorm between the convolutions.
struct DiscriminatorImpl : torch::nn::Module {
  DiscriminatorImpl() {
    namespace nn = torch::nn;
    net = register_module(
        "net", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 16, 4).stride(2).padding(1)),
                              nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)),
                              nn::Conv2d(nn::Conv2dOptions(16, 32, 4).stride(2).padding(1)), nn::BatchNorm2d(32),
                              nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)), nn::Flatten(),
                              nn::Linear(32 * 7 * 7, 1)));
  }
  at::Tensor forward(const at::Tensor& x) { return net->forward(x); }
  torch::nn::Sequential net{nullptr};
};
TORCH_MODULE(Discriminator);

at::Tensor bce(const at::Tensor& logits, double target) {
  return torch::nn::functional::binary_cross_entropy_with_logits(logits, at::full_like(logits, target));
}

at::Tensor d_loss(Discriminator& d, Generator& g, const at::Tensor& real, const at::Tensor& z) {
  return bce(d(real), 1.0) + bce(d(g(z).detach()), 0.0);
}

at::Tensor g_loss(Discriminator& d, Generator& g, const at::Tensor& z) { return bce(d(g(z)), 1.0); }

struct Gan {
  Generator g;
  Discriminator d;
  // Adam with the betas GANs train with, not the defaults.
  torch::optim::Adam g_opt{g->parameters(), torch::optim::AdamOptions(2e-3).betas({0.5, 0.999})};
  torch::optim::Adam d_opt{d->parameters(), torch::optim::AdamOptions(2e-3).betas({0.5, 0.999})};
};

void copy_module(torch::nn::Module& from, torch::nn::Module& to) {
  at::NoGradGuard no_grad;
  auto tp = to.named_parameters();
  for (const auto& p : from.named_parameters()) tp[p.key()].copy_(p.value());
  auto tb = to.named_buffers();
  for (const auto& b : from.named_buffers()) tb[b.key()].copy_(b.value());
}

void require_same_module(torch::nn::Module& compiled, torch::nn::Module& eager) {
  auto ep = eager.named_parameters();
  for (const auto& p : compiled.named_parameters()) {
    INFO("parameter " << p.key());
    REQUIRE_EQUAL_TENSORS(p.value().detach(), ep[p.key()].detach());
  }
  auto eb = eager.named_buffers();
  for (const auto& b : compiled.named_buffers()) {
    INFO("buffer " << b.key());
    REQUIRE_EQUAL_TENSORS(b.value(), eb[b.key()]);
  }
}

}  // namespace

TEST_CASE("a GAN's two compiled steps train as eager, each reading the other module", "[pipeline][lifted]") {
  constexpr int64_t batch = 16, steps = 50;
  const FashionMnist data = load_fashion_mnist(Split::Test, fashion_mnist_test_dir(), /*normalize=*/false);
  const at::Tensor images = data.images.slice(0, 0, batch * steps) * 2.0 - 1.0;  // [-1, 1], as tanh gives

  torch::manual_seed(0);
  Gan compiled, eager;
  copy_module(*compiled.g, *eager.g);
  copy_module(*compiled.d, *eager.d);

  Builder builder = Builder().backend("interpreter");
  builder.backend("interpreter")
      .name_module("generator", compiled.g.ptr())
      .name_module("discriminator", compiled.d.ptr());
  TrainStep d_step = builder.compile_train_step(
      compiled.d.ptr(), compiled.d_opt,
      [&](torch::nn::Module&, const std::vector<at::Tensor>& b) { return d_loss(compiled.d, compiled.g, b[0], b[1]); });
  TrainStep g_step = builder.compile_train_step(
      compiled.g.ptr(), compiled.g_opt,
      [&](torch::nn::Module&, const std::vector<at::Tensor>& b) { return g_loss(compiled.d, compiled.g, b[0]); });

  at::Generator noise = at::make_generator<at::CPUGeneratorImpl>(42);
  for (int64_t step = 0; step < steps; ++step) {
    INFO("step " << step);
    const at::Tensor real = images.slice(0, step * batch, (step + 1) * batch);
    const at::Tensor z = at::randn({batch, kLatent, 1, 1}, noise);

    const at::Tensor cd = d_step({real, z});
    // The generator step's gradient for the discriminator is compared alone:
    // eager zeroes the discriminator's before it, the compiled D step fills none.
    compiled.d_opt.zero_grad();
    const at::Tensor cg = g_step({z});

    eager.d_opt.zero_grad();
    const at::Tensor ed = d_loss(eager.d, eager.g, real, z);
    ed.backward();
    eager.d_opt.step();
    eager.g_opt.zero_grad();
    eager.d_opt.zero_grad();
    const at::Tensor eg = g_loss(eager.d, eager.g, z);
    eg.backward();
    eager.g_opt.step();

    // The interpreter runs eager's kernels in eager's order: bitwise.
    REQUIRE_EQUAL_TENSORS(cd, ed.detach());
    REQUIRE_EQUAL_TENSORS(cg, eg.detach());
    auto eager_d = eager.d->named_parameters();
    for (const auto& p : compiled.d->named_parameters()) {
      INFO("discriminator gradient " << p.key());
      // Accumulated into .grad from the step's output; the backward adds
      // several contributions per leaf in the graph's order.
      REQUIRE_CLOSE(p.value().grad(), eager_d[p.key()].grad(), kGradRtol, kGradAtol);
    }
  }
  require_same_module(*compiled.g, *eager.g);
  require_same_module(*compiled.d, *eager.d);
  REQUIRE(d_step.num_compilations() == 1);
  REQUIRE(g_step.num_compilations() == 1);

  // The lifted inputs are named after the other module's tensors.
  std::vector<std::string> lifted;
  for (const auto& spec : g_step.graph().signature().inputs)
    if (spec.kind == crucible::ir::InputKind::Lifted) lifted.push_back(spec.target);
  REQUIRE(!lifted.empty());
  REQUIRE(lifted.front() == "discriminator.net.0.weight");
  REQUIRE(std::find(lifted.begin(), lifted.end(), "discriminator.net.3.running_mean") != lifted.end());
}

TEST_CASE("a compiled train step reads a captured tensor afresh; replacing it compiles again", "[pipeline][lifted]") {
  torch::manual_seed(1);
  auto compiled = std::make_shared<torch::nn::LinearImpl>(6, 3);
  auto eager = std::make_shared<torch::nn::LinearImpl>(6, 3);
  copy_module(*compiled, *eager);
  at::Tensor scale = at::rand({3}) + 0.5;
  auto loss = [&scale](torch::nn::LinearImpl& m, const std::vector<at::Tensor>& b) {
    return (m.forward(b[0]) * scale - b[1]).pow(2).mean();
  };
  torch::optim::SGD c_opt(compiled->parameters(), 0.1), e_opt(eager->parameters(), 0.1);
  TrainStep step =
      Builder()
          .backend("interpreter")
          .compile_train_step(compiled, c_opt, [&](torch::nn::Module& m, const std::vector<at::Tensor>& b) {
            return loss(static_cast<torch::nn::LinearImpl&>(m), b);
          });
  auto both = [&](int64_t n) {
    const std::vector<at::Tensor> b = {at::randn({n, 6}), at::randn({n, 3})};
    const at::Tensor c = step(b);
    e_opt.zero_grad();
    const at::Tensor e = loss(*eager, b);
    e.backward();
    e_opt.step();
    REQUIRE_EQUAL_TENSORS(c, e.detach());
    require_same_module(*compiled, *eager);
  };
  both(4);
  scale.mul_(2.0);  // changed in place: read through, same compilation
  both(4);
  REQUIRE(step.num_compilations() == 1);
  scale = at::rand({3}) + 0.5;  // replaced by another tensor of the same shape: compiled again
  both(4);
  REQUIRE(step.num_compilations() == 2);
  scale = at::rand({1}) + 0.5;  // another shape: compiled again
  both(4);
  REQUIRE(step.num_compilations() == 3);
}
