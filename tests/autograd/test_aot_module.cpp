// aot_module and aot_module_simplified against the same torch::nn modules run
// eagerly: training with torch::optim, gradients in .grad, buffers, the
// train()/eval() guard.
#include <crucible/autograd/aot_module.h>
#include <crucible/autograd/error.h>

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "catch.h"
#include "module_testing.h"
#include "testing.h"

using crucible::testing::kGradAtol;
using crucible::testing::kGradRtol;
using namespace crucible;
using Tensors = std::vector<at::Tensor>;

namespace {

using MlpImpl = crucible::testing::Mlp;

// conv(1->4, 3x3, pad 1) -> relu -> max_pool 2x2 -> linear(4*4*4 -> 3).
struct ConvNetImpl : torch::nn::Module {
  ConvNetImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1)));
    fc = register_module("fc", torch::nn::Linear(64, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc(torch::max_pool2d(torch::relu(conv(x)), 2).flatten(1)); }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::Linear fc{nullptr};
};

// conv -> BatchNorm (train mode updates its running statistics) -> mean.
struct BnNetImpl : torch::nn::Module {
  BnNetImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 3, 3).padding(1)));
    bn = register_module("bn", torch::nn::BatchNorm2d(3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::relu(bn(conv(x))); }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
};

// One Linear applied twice and registered under two names: named_parameters()
// lists its tensors twice.
struct TiedImpl : torch::nn::Module {
  TiedImpl() {
    fc = register_module("fc", torch::nn::Linear(4, 4));
    register_module("fc_again", fc);
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc(torch::tanh(fc(x))); }
  torch::nn::Linear fc{nullptr};
};

// Two modules with the same parameters.
template <typename M>
std::pair<std::shared_ptr<M>, std::shared_ptr<M>> twins(uint64_t seed) {
  torch::manual_seed(seed);
  auto a = std::make_shared<M>();
  torch::manual_seed(seed);
  auto b = std::make_shared<M>();
  return {a, b};
}

template <typename M>
void require_same_state(M& compiled, M& eager, double rtol, double atol) {
  const auto c = compiled.named_parameters(), e = eager.named_parameters();
  REQUIRE(c.size() == e.size());
  for (size_t i = 0; i < c.size(); ++i) {
    INFO(c[i].key());
    REQUIRE_CLOSE(c[i].value().detach(), e[i].value().detach(), rtol, atol);
  }
  const auto cb = compiled.named_buffers(), eb = eager.named_buffers();
  REQUIRE(cb.size() == eb.size());
  for (size_t i = 0; i < cb.size(); ++i) {
    INFO(cb[i].key());
    REQUIRE_CLOSE(cb[i].value(), eb[i].value(), rtol, atol);
  }
}

// 20 SGD steps (momentum 0.9) on random batches, compiled and eager; returns the last losses.
template <typename M>
std::pair<at::Tensor, at::Tensor> train_20_steps(std::shared_ptr<M> compiled_module, std::shared_ptr<M> eager_module,
                                                 const std::function<Tensors()>& batch,
                                                 const std::function<at::Tensor(M&, const Tensors&)>& loss_fn,
                                                 autograd::AotModule& compiled) {
  torch::optim::SGD c_opt(compiled_module->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD e_opt(eager_module->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  at::Tensor c_loss, e_loss;
  for (int step = 0; step < 20; ++step) {
    const Tensors in = batch();
    c_opt.zero_grad();
    e_opt.zero_grad();
    c_loss = compiled(in)[0];
    e_loss = loss_fn(*eager_module, in);
    c_loss.backward();
    e_loss.backward();
    c_opt.step();
    e_opt.step();
  }
  return {c_loss.detach(), e_loss.detach()};
}

}  // namespace

TEST_CASE("aot_module: 20 SGD steps of an MLP end with eager's loss and parameters", "[autograd][module]") {
  auto [cm, em] = twins<MlpImpl>(20);
  auto loss_fn = [](MlpImpl& m, const Tensors& in) { return torch::mse_loss(m.forward(in[0]), in[1]); };
  auto compiled = autograd::aot_module(
      cm, [&](torch::nn::Module& m, const Tensors& in) { return Tensors{loss_fn(static_cast<MlpImpl&>(m), in)}; });
  torch::manual_seed(21);
  auto [c_loss, e_loss] = train_20_steps<MlpImpl>(
      cm, em,
      [] {
        return Tensors{torch::randn({32, 8}), torch::randn({32, 4})};
      },
      loss_fn, compiled);
  REQUIRE(compiled.num_compilations() == 1);
  // The interpreter runs eager's forward kernels in eager's order; the
  // traced backward runs the engine's kernels, but where the engine
  // accumulates several gradient contributions the order may differ, and 20
  // momentum steps compound float32 rounding: 1e-5 relative (a few hundred
  // ulps) with 1e-6 absolute for values near zero.
  REQUIRE_CLOSE(c_loss, e_loss, 1e-5, 1e-6);
  require_same_state(*cm, *em, 1e-5, 1e-6);
}

TEST_CASE("aot_module: 20 SGD steps of a ConvNet end with eager's loss and parameters", "[autograd][module]") {
  auto [cm, em] = twins<ConvNetImpl>(22);
  auto loss_fn = [](ConvNetImpl& m, const Tensors& in) { return torch::cross_entropy_loss(m.forward(in[0]), in[1]); };
  auto compiled = autograd::aot_module(
      cm, [&](torch::nn::Module& m, const Tensors& in) { return Tensors{loss_fn(static_cast<ConvNetImpl&>(m), in)}; });
  torch::manual_seed(23);
  auto [c_loss, e_loss] = train_20_steps<ConvNetImpl>(
      cm, em,
      [] {
        return Tensors{torch::randn({8, 1, 8, 8}), torch::randint(0, 3, {8})};
      },
      loss_fn, compiled);
  REQUIRE(compiled.num_compilations() == 1);
  // Same tolerance and reason as the MLP.
  REQUIRE_CLOSE(c_loss, e_loss, 1e-5, 1e-6);
  require_same_state(*cm, *em, 1e-5, 1e-6);
}

TEST_CASE("aot_module: gradients land in the module's .grad, accumulating as eager", "[autograd][module]") {
  auto [cm, em] = twins<MlpImpl>(24);
  auto compiled = autograd::aot_module(
      cm, [](torch::nn::Module& m, const Tensors& in) { return Tensors{static_cast<MlpImpl&>(m).forward(in[0])}; });
  torch::manual_seed(25);
  const auto x = torch::randn({5, 8});
  for (int i = 0; i < 2; ++i) {  // two backwards without zero_grad: .grad accumulates
    compiled({x})[0].pow(2).sum().backward();
    em->forward(x).pow(2).sum().backward();
  }
  const auto cp = cm->named_parameters(), ep = em->named_parameters();
  for (size_t i = 0; i < cp.size(); ++i) {
    INFO(cp[i].key());
    // Accumulation order of the engine may differ per parameter: rounding only.
    REQUIRE_CLOSE(cp[i].value().grad(), ep[i].value().grad(), kGradRtol, kGradAtol);
  }
}

TEST_CASE("aot_module: hooks on a parameter and on lifted tensors run once, as in eager", "[autograd][module]") {
  // Each hook scales its gradient by a distinct factor, so a hook run twice
  // (traced into the backward and run again by the engine) is off by that
  // factor, far beyond rounding.
  auto [cm, em] = twins<MlpImpl>(27);
  torch::manual_seed(28);
  const at::Tensor leaf = torch::randn({4}).requires_grad_(), base = torch::randn({4}).requires_grad_();
  const at::Tensor non_leaf = base * 2;
  non_leaf.register_hook([](const at::Tensor& g) { return g * 7; });
  leaf.register_hook([](const at::Tensor& g) { return g * 5; });
  for (auto* m : {cm.get(), em.get()})
    m->named_parameters()["fc1.bias"].register_hook([](const at::Tensor& g) { return g * 3; });
  auto loss_fn = [&](MlpImpl& m, const Tensors& in) { return (m.forward(in[0]) * leaf * non_leaf).sum(); };
  auto compiled = autograd::aot_module(
      cm, [&](torch::nn::Module& m, const Tensors& in) { return Tensors{loss_fn(static_cast<MlpImpl&>(m), in)}; });
  const at::Tensor x = torch::randn({5, 8});
  compiled({x})[0].backward();
  const at::Tensor leaf_grad = leaf.grad().clone(), base_grad = base.grad().clone();
  leaf.mutable_grad().reset();
  base.mutable_grad().reset();
  loss_fn(*em, {x}).backward();
  // One backward each: rounding only.
  REQUIRE_CLOSE(leaf_grad, leaf.grad(), kGradRtol, kGradAtol);
  REQUIRE_CLOSE(base_grad, base.grad(), kGradRtol, kGradAtol);
  const auto cp = cm->named_parameters(), ep = em->named_parameters();
  for (size_t i = 0; i < cp.size(); ++i) {
    INFO(cp[i].key());
    REQUIRE_CLOSE(cp[i].value().grad(), ep[i].value().grad(), kGradRtol, kGradAtol);
  }
}

namespace {

// Two buffers that are views of one flat tensor, overlapping in one element
// or not; forward writes the first and reads the second.
struct FlatBuffersImpl : torch::nn::Module {
  explicit FlatBuffersImpl(bool overlap) {
    const at::Tensor flat = torch::arange(7, torch::kDouble);
    register_buffer("a", flat.narrow(0, 0, 4));
    register_buffer("b", flat.narrow(0, overlap ? 3 : 4, 3));
  }
  Tensors forward(const Tensors& in) {
    auto buffers = named_buffers();
    buffers["a"].add_(in[0]);
    return Tensors{buffers["b"] * 2};
  }
};

}  // namespace

TEST_CASE("aot_module: module state sharing memory with a written tensor is refused; disjoint views compile",
          "[autograd][module]") {
  for (const bool overlap : {false, true}) {
    auto compiled_module = std::make_shared<FlatBuffersImpl>(overlap),
         eager = std::make_shared<FlatBuffersImpl>(overlap);
    auto compiled = autograd::aot_module(compiled_module, [](torch::nn::Module& m, const Tensors& in) {
      return static_cast<FlatBuffersImpl&>(m).forward(in);
    });
    const Tensors in = {torch::ones({4}, torch::kDouble)};
    const at::Tensor a_before = compiled_module->named_buffers()["a"].clone();
    if (overlap) {
      // Eager's b reads the element a's write changed; separate graph inputs would not.
      REQUIRE_THROWS_WITH(compiled(in), CRUCIBLE_HAS_SUBSTR("share memory and 0 is written in place"));
      REQUIRE_EQUAL_TENSORS(compiled_module->named_buffers()["a"], a_before);
      continue;
    }
    REQUIRE_EQUAL_TENSORS(compiled(in)[0], eager->forward(in)[0]);
    REQUIRE_EQUAL_TENSORS(compiled_module->named_buffers()["a"], eager->named_buffers()["a"]);
  }
}

TEST_CASE("aot_module: BatchNorm's buffers are updated in train mode as eager updates them", "[autograd][module]") {
  auto [cm, em] = twins<BnNetImpl>(26);
  auto compiled = autograd::aot_module(
      cm, [](torch::nn::Module& m, const Tensors& in) { return Tensors{static_cast<BnNetImpl&>(m).forward(in[0])}; });
  torch::manual_seed(27);
  for (int step = 0; step < 3; ++step) {
    const auto x = torch::randn({4, 2, 5, 5});
    const auto c = compiled({x})[0];
    const auto e = em->forward(x);
    // Same kernels in the same order: bitwise, values and buffers.
    REQUIRE_EQUAL_TENSORS(c.detach(), e.detach());
    c.sum().backward();
    e.sum().backward();
  }
  // Under no_grad in train mode: the inference path, still updating the buffers.
  {
    torch::NoGradGuard no_grad;
    const auto x = torch::randn({4, 2, 5, 5});
    REQUIRE_EQUAL_TENSORS(compiled({x})[0], em->forward(x));
  }
  REQUIRE(cm->bn->num_batches_tracked.item<int64_t>() == 4);
  require_same_state(*cm, *em, 0.0, 0.0);
  for (const auto& [c, e] : std::vector<std::pair<at::Tensor, at::Tensor>>{
           {cm->conv->weight.grad(), em->conv->weight.grad()}, {cm->bn->weight.grad(), em->bn->weight.grad()}})
    REQUIRE_CLOSE(c, e, 1e-5, 1e-6);  // three accumulated backwards: rounding only
  // eval() changes the graph (running statistics, no update): a new
  // compilation, not the train-mode graph.
  cm->eval();
  em->eval();
  const auto x = torch::randn({2, 2, 5, 5});
  torch::NoGradGuard no_grad;
  REQUIRE_EQUAL_TENSORS(compiled({x})[0], em->forward(x));
  REQUIRE(compiled.num_compilations() == 3);
  REQUIRE(cm->bn->num_batches_tracked.item<int64_t>() == 4);
}

TEST_CASE("aot_module_simplified: one compilation at construction, the module's tensors held", "[autograd][module]") {
  auto [cm, em] = twins<MlpImpl>(28);
  torch::manual_seed(29);
  const auto x = torch::randn({3, 8});
  auto fn = autograd::aot_module_simplified(
      cm, [](torch::nn::Module& m, const Tensors& in) { return Tensors{static_cast<MlpImpl&>(m).forward(in[0])}; },
      {x});
  const auto c = fn({x})[0];
  const auto e = em->forward(x);
  REQUIRE_EQUAL_TENSORS(c.detach(), e.detach());
  c.sum().backward();
  e.sum().backward();
  REQUIRE_CLOSE(cm->fc1->weight.grad(), em->fc1->weight.grad(), kGradRtol, kGradAtol);
  // An in-place update of the held parameters is seen by the next call.
  {
    torch::NoGradGuard no_grad;
    cm->fc2->bias.add_(1.0);
    em->fc2->bias.add_(1.0);
  }
  REQUIRE_EQUAL_TENSORS(fn({x})[0].detach(), em->forward(x).detach());
  // Another shape: no second compilation, an error naming the difference.
  REQUIRE_THROWS_WITH(fn({torch::randn({4, 8})}), CRUCIBLE_HAS_SUBSTR("sizes [4, 8] (compiled for [3, 8])"));
}

TEST_CASE("aot_module: a parameter registered under two names gets its gradient once", "[autograd][module]") {
  auto [cm, em] = twins<TiedImpl>(30);
  REQUIRE(cm->named_parameters().size() == 4);
  auto compiled = autograd::aot_module(
      cm, [](torch::nn::Module& m, const Tensors& in) { return Tensors{static_cast<TiedImpl&>(m).forward(in[0])}; });
  torch::manual_seed(31);
  const auto x = torch::randn({3, 4});
  const auto c = compiled({x})[0];
  const auto e = em->forward(x);
  REQUIRE_EQUAL_TENSORS(c.detach(), e.detach());
  c.pow(2).sum().backward();
  e.pow(2).sum().backward();
  // Two uses of one weight, accumulated in the engine's order: rounding only.
  REQUIRE_CLOSE(cm->fc->weight.grad(), em->fc->weight.grad(), kGradRtol, kGradAtol);
  REQUIRE_CLOSE(cm->fc->bias.grad(), em->fc->bias.grad(), kGradRtol, kGradAtol);
}
