// Tensors a compiled function reads from outside its arguments (Note
// [Lifting in AOTAutograd]): read afresh at every call, guarded, their
// gradients and writes as eager's. Every case runs an eager twin on the same
// tensors and compares.
#include <crucible/autograd/aot_function.h>
#include <crucible/autograd/aot_module.h>
#include <crucible/autograd/error.h>
#include <crucible/ir/interpreter.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include "catch.h"
#include "module_testing.h"
#include "testing.h"

using crucible::testing::kGradAtol;
using crucible::testing::kGradRtol;
using namespace crucible;
using Tensors = std::vector<at::Tensor>;

// Values: the interpreter runs eager's kernels in eager's order, so forward
// values are compared bitwise; gradients with kGradRtol/kGradAtol, since the
// compiled backward may add a leaf's contributions in another order.

namespace {

// A backend that keeps the last graph it compiled.
struct Capture {
  std::shared_ptr<ir::Graph> graph = std::make_shared<ir::Graph>();
  ir::Backend backend() const {
    return [g = graph](const ir::Graph& graph, const Tensors& examples) {
      *g = graph.clone();
      return ir::interpret(graph, examples);
    };
  }
};

}  // namespace

TEST_CASE("aot_function reads a captured weight afresh at every call and fills its gradient", "[autograd][lifted]") {
  at::manual_seed(0);
  at::Tensor w = at::randn({4, 3}).requires_grad_();
  at::Tensor b = at::randn({3});
  auto fn = [&](const Tensors& in) { return Tensors{at::tanh(at::matmul(in[0], w) + b).sum()}; };
  auto compiled = autograd::aot_function(fn);
  const at::Tensor x = at::randn({5, 4});

  for (int step = 0; step < 3; ++step) {
    const at::Tensor got = compiled({x})[0];
    got.backward();
    const at::Tensor compiled_grad = w.grad().clone();
    w.mutable_grad().reset();
    const at::Tensor expected = fn({x})[0];
    expected.backward();
    REQUIRE_EQUAL_TENSORS(got.detach(), expected.detach());
    REQUIRE_CLOSE(compiled_grad, w.grad(), kGradRtol, kGradAtol);
    // An optimizer step between calls: the next call must see it.
    {
      at::NoGradGuard no_grad;
      w.sub_(w.grad() * 0.1);
      b.mul_(0.5);
    }
    w.mutable_grad().reset();
  }
  REQUIRE(compiled.num_compilations() == 1);
}

TEST_CASE("aot_function: a captured tensor replaced by another compiles again, never stale", "[autograd][lifted]") {
  at::manual_seed(1);
  at::Tensor scale = at::randn({3});
  auto fn = [&](const Tensors& in) { return Tensors{in[0] * scale}; };
  auto compiled = autograd::aot_function(fn);
  const at::Tensor x = at::randn({2, 3});
  REQUIRE_EQUAL_TENSORS(compiled({x})[0], fn({x})[0]);

  scale = at::randn({3});  // the same shape, another tensor: the old one is freed
  REQUIRE_EQUAL_TENSORS(compiled({x})[0], fn({x})[0]);
  REQUIRE(compiled.num_compilations() == 2);

  scale = at::randn({2, 1});  // another shape
  REQUIRE_EQUAL_TENSORS(compiled({x})[0], fn({x})[0]);
  REQUIRE(compiled.num_compilations() == 3);
}

TEST_CASE("aot_function: the only tensor requiring grad is a lifted one", "[autograd][lifted]") {
  at::manual_seed(2);
  at::Tensor w = at::randn({3, 3}).requires_grad_();
  auto fn = [&](const Tensors& in) { return Tensors{at::matmul(in[0], w).pow(2).mean()}; };
  auto compiled = autograd::aot_function(fn);
  const at::Tensor x = at::randn({4, 3});
  const at::Tensor got = compiled({x})[0];
  REQUIRE(got.requires_grad());  // the autograd path, chosen after lifting w
  got.backward();
  const at::Tensor compiled_grad = w.grad().clone();
  w.mutable_grad().reset();
  fn({x})[0].backward();
  REQUIRE_CLOSE(compiled_grad, w.grad(), kGradRtol, kGradAtol);
}

TEST_CASE("aot_function: writes to a captured buffer land in the buffer, once per call", "[autograd][lifted]") {
  at::manual_seed(3);
  at::Tensor running = at::zeros({3});
  at::Tensor twin = running.clone();
  auto make = [](at::Tensor& buffer) {
    return [&buffer](const Tensors& in) {
      {
        at::NoGradGuard no_grad;
        buffer.mul_(0.9).add_(in[0].mean(0), 0.1);
      }
      return Tensors{in[0] - buffer};
    };
  };
  auto compiled = autograd::aot_function(make(running));
  auto eager = make(twin);
  for (int step = 0; step < 4; ++step) {
    const at::Tensor x = at::randn({8, 3});
    const at::Tensor got = compiled({x})[0];
    const at::Tensor expected = eager({x})[0];
    REQUIRE_EQUAL_TENSORS(got, expected);
    REQUIRE_EQUAL_TENSORS(running, twin);
  }
  REQUIRE(compiled.num_compilations() == 1);
}

TEST_CASE("aot_module reads another module's parameters afresh, names them and fills their .grad",
          "[autograd][lifted]") {
  torch::manual_seed(4);
  auto own = std::make_shared<testing::Mlp>(6, 8, 4);
  auto other = std::make_shared<testing::Mlp>(4, 5, 2);
  auto own_twin = std::make_shared<testing::Mlp>(6, 8, 4);
  auto other_twin = std::make_shared<testing::Mlp>(4, 5, 2);
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < own->parameters().size(); ++i) own_twin->parameters()[i].copy_(own->parameters()[i]);
    for (size_t i = 0; i < other->parameters().size(); ++i) other_twin->parameters()[i].copy_(other->parameters()[i]);
  }
  Capture capture;
  autograd::AotConfig config;
  config.fw_compiler = capture.backend();
  config.named_modules = {{"other", other}};
  auto loss_of = [](testing::Mlp& o) {
    return [&o](torch::nn::Module& m, const Tensors& in) {
      return Tensors{o.forward(static_cast<testing::Mlp&>(m).forward(in[0])).pow(2).mean()};
    };
  };
  auto compiled = autograd::aot_module(own, loss_of(*other), config);
  torch::optim::SGD opt_own(own->parameters(), 0.1), opt_other(other->parameters(), 0.1);
  torch::optim::SGD twin_own(own_twin->parameters(), 0.1), twin_other(other_twin->parameters(), 0.1);
  for (int step = 0; step < 3; ++step) {
    const at::Tensor x = at::randn({7, 6});
    opt_own.zero_grad();
    opt_other.zero_grad();
    twin_own.zero_grad();
    twin_other.zero_grad();
    const at::Tensor got = compiled({x})[0];
    const at::Tensor expected = loss_of(*other_twin)(*own_twin, {x})[0];
    REQUIRE_EQUAL_TENSORS(got.detach(), expected.detach());
    got.backward();
    expected.backward();
    for (size_t i = 0; i < other->parameters().size(); ++i)
      REQUIRE_CLOSE(other->parameters()[i].grad(), other_twin->parameters()[i].grad(), kGradRtol, kGradAtol);
    for (size_t i = 0; i < own->parameters().size(); ++i)
      REQUIRE_CLOSE(own->parameters()[i].grad(), own_twin->parameters()[i].grad(), kGradRtol, kGradAtol);
    opt_own.step();
    opt_other.step();
    twin_own.step();
    twin_other.step();
  }
  REQUIRE(compiled.num_compilations() == 1);
  std::vector<std::string> lifted;
  for (const ir::InputSpec& spec : capture.graph->signature().inputs)
    if (spec.kind == ir::InputKind::Lifted) lifted.push_back(spec.target);
  REQUIRE(lifted ==
          std::vector<std::string>{"other.fc1.weight", "other.fc1.bias", "other.fc2.weight", "other.fc2.bias"});
}

TEST_CASE("aot_function: a tensor read both as an argument and from outside is refused", "[autograd][lifted]") {
  at::Tensor t = at::randn({3});
  auto compiled = autograd::aot_function([&](const Tensors& in) { return Tensors{in[0] + t}; });
  REQUIRE_THROWS_WITH(compiled({t}), CRUCIBLE_HAS_SUBSTR("both as an argument and from outside"));
}

TEST_CASE("aot_function with freeze bakes what it reads from outside, as asked", "[autograd][lifted]") {
  at::Tensor scale = at::full({3}, 2.0);
  autograd::AotConfig config;
  config.freeze = true;
  auto compiled = autograd::aot_function([&](const Tensors& in) { return Tensors{in[0] * scale}; }, config);
  const at::Tensor x = at::ones({3});
  REQUIRE_EQUAL_TENSORS(compiled({x})[0], at::full({3}, 2.0));
  scale.fill_(3.0);
  // Frozen: the graph keeps the value it was compiled with (what freezing promises).
  REQUIRE_EQUAL_TENSORS(compiled({x})[0], at::full({3}, 2.0));
}
