// Randomness through aot_function: dropout equal to eager from the same
// generator state, and functionalized RNG (Philox seed and offset as graph
// inputs) consistent between forward and backward.
#include <crucible/autograd/aot_function.h>
#include <crucible/autograd/error.h>
#include <crucible/autograd/functionalized_rng_wrapper.h>
#include <crucible/ir/interpreter.h>

#include <ATen/ATen.h>

#include "catch.h"
#include "testing.h"

using namespace crucible;
using Tensors = std::vector<at::Tensor>;

namespace {

Tensors dropout_fn(const Tensors& in) { return {(at::dropout(in[0], 0.5, /*train=*/true) * in[1]).sum()}; }

}  // namespace

TEST_CASE("dropout forward and backward equal eager from the same generator state", "[autograd][rng]") {
  auto compiled = autograd::aot_function(dropout_fn);
  const auto data = at::randn({64}), wdata = at::randn({64});
  for (int call = 0; call < 2; ++call) {  // the compiling call and a cached one
    const auto cx = data.clone().requires_grad_(), ex = data.clone().requires_grad_();
    const auto cw = wdata.clone().requires_grad_(), ew = wdata.clone().requires_grad_();
    at::manual_seed(100 + call);
    const auto e_out = dropout_fn({ex, ew})[0];
    at::manual_seed(100 + call);
    const auto c_out = compiled({cx, cw})[0];
    // Compiling restores the generator (Note [RNG during compilation]), and
    // the graph draws in eager's order with eager's kernels: bitwise equal.
    REQUIRE_EQUAL_TENSORS(c_out, e_out.detach());
    // After the call the generator is where eager leaves it.
    const auto c_next = at::rand({4});
    at::manual_seed(100 + call);
    dropout_fn({ex.detach(), ew.detach()});
    REQUIRE_EQUAL_TENSORS(c_next, at::rand({4}));
    c_out.backward();
    e_out.backward();
    REQUIRE_EQUAL_TENSORS(cx.grad(), ex.grad());
    REQUIRE_EQUAL_TENSORS(cw.grad(), ew.grad());
  }
  REQUIRE(compiled.num_compilations() == 1);
}

TEST_CASE("functionalized RNG: Philox draws from graph inputs, forward and backward agree", "[autograd][rng]") {
  auto forward_graph = std::make_shared<ir::Graph>();
  autograd::AotConfig config;
  config.functionalize_rng_ops = true;
  config.fw_compiler = [forward_graph](const ir::Graph& g, const Tensors& examples) {
    *forward_graph = g.clone();
    return ir::interpret(g, examples);
  };
  auto compiled = autograd::aot_function(dropout_fn, config);
  at::manual_seed(7);
  const auto x = at::randn({256}), w = at::randn({256});
  auto run = [&](uint64_t seed) {
    at::manual_seed(seed);
    const auto cx = x.clone().requires_grad_(), cw = w.clone().requires_grad_();
    const auto out = compiled({cx, cw})[0];
    out.backward();
    return std::make_tuple(out.detach(), cx.grad(), cw.grad());
  };
  const auto [out, gx, gw] = run(11);
  // The forward graph takes the seed and offset and has no eager random op.
  const auto state = forward_graph->signature().inputs_of(ir::InputKind::State);
  REQUIRE(state.size() == 2);
  REQUIRE(forward_graph->signature().inputs[state[0]].target == "rng_seed");
  size_t philox = 0;
  for (const ir::Node* n : forward_graph->nodes()) {
    REQUIRE_FALSE(n->is_nondeterministic());
    philox += n->is_call() && n->target() == "crucible::philox_rand";
  }
  REQUIRE(philox == 1);
  // Eager's dropout formula with the mask the compiled forward drew: the
  // gradients of the compiled backward use that same mask.
  const auto mask = (gw != 0).to(at::kFloat);  // d out / d w = dropout(x) = x * mask * 2
  REQUIRE_EQUAL_TENSORS(gw, x * mask * 2.0);
  REQUIRE_EQUAL_TENSORS(gx, w * mask * 2.0);
  REQUIRE_CLOSE(out, (x * mask * 2.0 * w).sum(), 1e-5, 1e-5);  // summation order of sum() may differ
  // A fair draw: p = 0.5 over the mask's elements, so (0.3, 0.7) is many
  // standard deviations wide; a mask of all zeros or all ones fails it.
  const double kept = mask.mean().item<double>();
  REQUIRE(kept > 0.3);
  REQUIRE(kept < 0.7);
  // The same generator state gives the same draws; the next state others.
  const auto [out2, gx2, gw2] = run(11);
  REQUIRE_EQUAL_TENSORS(gw2, gw);
  const auto [out3, gx3, gw3] = run(12);
  REQUIRE_FALSE(at::equal(gw3, gw));
  REQUIRE(compiled.num_compilations() == 1);
}

TEST_CASE("functionalized RNG: a random op without a Philox form is refused by name", "[autograd][rng]") {
  autograd::AotConfig config;
  config.functionalize_rng_ops = true;
  auto compiled = autograd::aot_function(
      [](const Tensors& in) { return Tensors{in[0] + at::randint(0, 5, {3}).to(at::kFloat)}; }, config);
  REQUIRE_THROWS_WITH(compiled({at::randn({3})}), CRUCIBLE_HAS_SUBSTR("aten::randint"));
}

TEST_CASE("philox_rand: a pure function of seed, offset and element index", "[autograd][rng]") {
  const auto seed = at::scalar_tensor(1234, at::kLong), offset = at::scalar_tensor(8, at::kLong);
  const auto a = autograd::philox_rand({1000}, seed, offset, at::kFloat, at::kCPU, false);
  REQUIRE_EQUAL_TENSORS(a, autograd::philox_rand({1000}, seed, offset, at::kFloat, at::kCPU, false));
  REQUIRE_FALSE(at::equal(a, autograd::philox_rand({1000}, seed, offset + 1, at::kFloat, at::kCPU, false)));
  // Element i does not depend on the size drawn.
  REQUIRE_EQUAL_TENSORS(a.slice(0, 0, 10), autograd::philox_rand({10}, seed, offset, at::kFloat, at::kCPU, false));
  REQUIRE(a.min().item<float>() >= 0.0f);
  REQUIRE(a.max().item<float>() < 1.0f);
  // Uniform on [0, 1): mean 1/2 within 5 standard errors (sd 0.29 / sqrt(1000)).
  REQUIRE(std::abs(a.mean().item<double>() - 0.5) < 5 * 0.29 / std::sqrt(1000.0));
  const auto n = autograd::philox_rand({1000}, seed, offset, at::kDouble, at::kCPU, true);
  REQUIRE(n.scalar_type() == at::kDouble);
  REQUIRE(std::abs(n.mean().item<double>()) < 5.0 / std::sqrt(1000.0));
}
