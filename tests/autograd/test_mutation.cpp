// Input mutations through aot_function against eager: data and metadata
// writes on the autograd and inference paths, writes kept in the graph.
#include <crucible/autograd/aot_function.h>
#include <crucible/autograd/error.h>
#include <crucible/ir/interpreter.h>

#include <ATen/ATen.h>

#include "catch.h"
#include "graph_testing.h"
#include "testing.h"

using crucible::testing::kGradAtol;
using crucible::testing::kGradRtol;
using namespace crucible;
using crucible::testing::count_calls;
using Tensors = std::vector<at::Tensor>;

namespace {

size_t count_outputs(const ir::Graph& g, ir::OutputKind kind) { return g.signature().outputs_of(kind).size(); }

// An ir::interpret backend that also keeps the last graph it compiled.
ir::Backend recording(std::shared_ptr<ir::Graph> last) {
  return [last](const ir::Graph& g, const Tensors& examples) {
    *last = g.clone();
    return ir::interpret(g, examples);
  };
}

}  // namespace

TEST_CASE("input data mutation on the autograd path: the caller's tensor and gradients as eager",
          "[autograd][mutation]") {
  auto f = [](const Tensors& in) {
    in[0].mul_(in[1]);  // x written with a value that depends on w
    return Tensors{(in[0] * in[1]).sum()};
  };
  auto compiled = autograd::aot_function(f);
  at::manual_seed(40);
  const auto a = at::randn({2, 3}), w = at::randn({2, 3});
  // x has autograd history (eager may write it in place); w is a leaf.
  const auto ca = a.clone().requires_grad_(), ea = a.clone().requires_grad_();
  const auto cw = w.clone().requires_grad_(), ew = w.clone().requires_grad_();
  const auto cx = ca * 1.0, ex = ea * 1.0;
  const auto c_out = compiled({cx, cw})[0];
  const auto e_out = f({ex, ew})[0];
  // Same kernels, same order: bitwise. The caller's x holds the new data.
  REQUIRE_EQUAL_TENSORS(c_out.detach(), e_out.detach());
  REQUIRE_EQUAL_TENSORS(cx.detach(), ex.detach());
  // The loss reads x after the write: its gradient flows through the
  // write-back (copy_) into the compiled backward, as eager's flows through mul_.
  (c_out + cx.pow(2).sum()).backward();
  (e_out + ex.pow(2).sum()).backward();
  // Two gradient paths per leaf, summed in the engine's order: rounding only.
  REQUIRE_CLOSE(ca.grad(), ea.grad(), kGradRtol, kGradAtol);
  REQUIRE_CLOSE(cw.grad(), ew.grad(), kGradRtol, kGradAtol);
  REQUIRE(compiled.num_compilations() == 1);
}

TEST_CASE("input data mutation of a buffer that needs no gradient, on the autograd path", "[autograd][mutation]") {
  // A running statistic updated beside a differentiable computation.
  auto f = [](const Tensors& in) {
    const auto y = in[0] * in[1];
    in[2].mul_(0.9).add_(y.detach().mean(0), 0.1);
    return Tensors{y.sum()};
  };
  auto compiled = autograd::aot_function(f);
  at::manual_seed(41);
  const auto x = at::randn({4, 3}), w = at::randn({3}), stat = at::zeros({3});
  const auto cw = w.clone().requires_grad_(), ew = w.clone().requires_grad_();
  const auto c_stat = stat.clone(), e_stat = stat.clone();
  for (int step = 0; step < 2; ++step) {
    const auto c_out = compiled({x, cw, c_stat})[0];
    const auto e_out = f({x, ew, e_stat})[0];
    REQUIRE_EQUAL_TENSORS(c_out.detach(), e_out.detach());
    REQUIRE_EQUAL_TENSORS(c_stat, e_stat);
    REQUIRE_FALSE(c_stat.requires_grad());
    c_out.backward();
    e_out.backward();
  }
  REQUIRE_EQUAL_TENSORS(cw.grad(), ew.grad());
}

TEST_CASE("a parameter written under no_grad inside the function, as an optimizer step does", "[autograd][mutation]") {
  auto f = [](const Tensors& in) {
    const auto loss = (in[0] * in[1]).sum();
    {
      at::NoGradGuard no_grad;
      in[1].sub_(in[0].sum(0) * 0.1);
    }
    return Tensors{loss};
  };
  auto compiled = autograd::aot_function(f);
  at::manual_seed(42);
  const auto x = at::randn({5, 3}), w = at::randn({3});
  const auto cw = w.clone().requires_grad_(), ew = w.clone().requires_grad_();
  const auto c_out = compiled({x, cw})[0];
  const auto e_out = f({x, ew})[0];
  REQUIRE_EQUAL_TENSORS(c_out.detach(), e_out.detach());
  // The write-back ran under no_grad: w stays a leaf with the new value.
  REQUIRE(cw.is_leaf());
  REQUIRE_EQUAL_TENSORS(cw.detach(), ew.detach());
  c_out.backward();
  e_out.backward();
  REQUIRE_EQUAL_TENSORS(cw.grad(), ew.grad());
}

TEST_CASE("input metadata mutation (transpose_): the caller's tensor is transposed, gradients as eager",
          "[autograd][mutation]") {
  auto f = [](const Tensors& in) {
    in[0].transpose_(0, 1);
    return Tensors{(in[0] * in[1]).sum(0)};
  };
  auto compiled = autograd::aot_function(f);
  at::manual_seed(43);
  const auto x = at::randn({2, 3}), w = at::randn({3, 2});
  const auto cx = x.clone(), ex = x.clone();
  const auto cw = w.clone().requires_grad_(), ew = w.clone().requires_grad_();
  const auto c_out = compiled({cx, cw})[0];
  const auto e_out = f({ex, ew})[0];
  REQUIRE_EQUAL_TENSORS(c_out.detach(), e_out.detach());
  REQUIRE(cx.sizes() == ex.sizes());
  REQUIRE(cx.strides() == ex.strides());
  REQUIRE(cx.storage_offset() == ex.storage_offset());
  REQUIRE_EQUAL_TENSORS(cx, ex);
  c_out.sum().backward();
  e_out.sum().backward();
  REQUIRE_EQUAL_TENSORS(cw.grad(), ew.grad());
  // A second call transposes the (now transposed) tensor back: it has other
  // sizes and strides, so the guards compile again.
  const auto w2 = at::randn({2, 3}).requires_grad_();
  REQUIRE_EQUAL_TENSORS(compiled({cx, w2})[0].detach(), f({ex, w2})[0].detach());
  REQUIRE(cx.sizes() == at::IntArrayRef({2, 3}));
  REQUIRE(cx.strides() == ex.strides());
  REQUIRE(compiled.num_compilations() == 2);
}

TEST_CASE("metadata and data written together on an input with history", "[autograd][mutation]") {
  auto f = [](const Tensors& in) {
    in[0].t_();
    in[0].mul_(2);
    return Tensors{in[0].sum(1)};
  };
  auto compiled = autograd::aot_function(f);
  at::manual_seed(44);
  const auto a = at::randn({2, 3});
  const auto ca = a.clone().requires_grad_(), ea = a.clone().requires_grad_();
  const auto cx = ca + 0.0, ex = ea + 0.0;
  const auto c_out = compiled({cx})[0];
  const auto e_out = f({ex})[0];
  REQUIRE_EQUAL_TENSORS(c_out.detach(), e_out.detach());
  REQUIRE(cx.sizes() == ex.sizes());
  REQUIRE(cx.strides() == ex.strides());
  REQUIRE_EQUAL_TENSORS(cx.detach(), ex.detach());
  (c_out.sum() + cx.sum()).backward();
  (e_out.sum() + ex.sum()).backward();
  REQUIRE_CLOSE(ca.grad(), ea.grad(), kGradRtol, kGradAtol);
}

TEST_CASE("inference path: input data mutation copied back by the runtime wrapper", "[autograd][mutation]") {
  auto f = [](const Tensors& in) {
    in[0].mul_(3.0);
    return Tensors{in[0] + in[1].sum()};
  };
  auto graph = std::make_shared<ir::Graph>();
  autograd::AotConfig config;
  config.inference_compiler = recording(graph);
  auto compiled = autograd::aot_function(f, config);
  at::manual_seed(45);
  const auto x = at::randn({2, 3}), w = at::randn({2, 3});
  const auto ex = x.clone();
  const auto ref = f({ex, w});
  const auto out = compiled({x, w});
  REQUIRE(out.size() == 1);
  REQUIRE_EQUAL_TENSORS(out[0], ref[0]);
  REQUIRE_EQUAL_TENSORS(x, ex);
  // The graph is functional and returns the new value of x.
  REQUIRE(count_calls(*graph, "aten::copy_") == 0);
  REQUIRE(count_outputs(*graph, ir::OutputKind::MutatedInput) == 1);
  for (const ir::Node* n : graph->nodes()) REQUIRE_FALSE(n->is_mutating());
}

TEST_CASE("inference path with keep_inference_input_mutations: the write stays in the graph", "[autograd][mutation]") {
  auto f = [](const Tensors& in) {
    in[0].mul_(3.0);
    in[1].t_();  // metadata writes still go through the runtime wrapper
    return Tensors{in[0] + in[1].sum()};
  };
  auto graph = std::make_shared<ir::Graph>();
  autograd::AotConfig config;
  config.inference_compiler = recording(graph);
  config.keep_inference_input_mutations = true;
  auto compiled = autograd::aot_function(f, config);
  at::manual_seed(46);
  const auto x = at::randn({2, 3}), w = at::randn({2, 3});
  const auto ex = x.clone(), ew = w.clone(), cw = w.clone();
  const auto ref = f({ex, ew});
  const auto out = compiled({x, cw});
  REQUIRE_EQUAL_TENSORS(out[0], ref[0]);
  REQUIRE_EQUAL_TENSORS(x, ex);
  REQUIRE(cw.sizes() == ew.sizes());
  REQUIRE(cw.strides() == ew.strides());
  REQUIRE(count_calls(*graph, "aten::copy_") == 1);
  REQUIRE(count_outputs(*graph, ir::OutputKind::MutatedInput) == 0);
}
