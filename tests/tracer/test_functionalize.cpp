// Functionalization and decomposition tables: the traced graph is
// interpreted and compared with eager LibTorch on the same inputs.
#include "catch.h"
#include "testing.h"
#include "tracer_testing.h"

#include <crucible/tracer/decomposition.h>
#include <crucible/tracer/error.h>
#include <crucible/tracer/make_fx.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

using crucible::testing::clones;
using crucible::testing::count_calls;
using crucible::testing::run_traced;
using crucible::tracer::make_fx;
using crucible::tracer::TraceOptions;
using Tensors = std::vector<at::Tensor>;
namespace ir = crucible::ir;

namespace {

TraceOptions functionalized() {
  TraceOptions o;
  o.functionalize = true;
  return o;
}

void require_no_mutation(const ir::Graph& g) {
  for (ir::Node* n : g.nodes()) {
    INFO(n->target());
    REQUIRE(!n->is_mutating());
  }
}

}  // namespace

// Tolerances: functionalized graphs run functional variants of eager's
// in-place kernels (add instead of add_), which compute the same values, so
// results are bitwise equal.

TEST_CASE("functionalize: in-place ops on intermediates leave no mutation", "[tracer]") {
  at::manual_seed(10);
  auto fn = [](const Tensors& in) {
    auto y = in[0] * 2.0;
    y.add_(1.0).relu_();
    y.mul_(in[1]);
    return Tensors{y.sum(0)};
  };
  Tensors inputs = {at::randn({3, 4}), at::randn({4})};
  auto r = make_fx(fn, inputs, functionalized());
  require_no_mutation(r.graph);
  REQUIRE(r.graph.outputs().size() == 1);
  REQUIRE_EQUAL_TENSORS(run_traced(r, inputs)[0], fn(clones(inputs))[0]);
}

TEST_CASE("functionalize: views followed by mutation", "[tracer]") {
  at::manual_seed(11);
  const auto fn = crucible::testing::views_then_mutation;
  Tensors inputs = {at::randn({4, 6})};
  auto r = make_fx(fn, inputs, functionalized());
  require_no_mutation(r.graph);
  auto expected = fn(clones(inputs));
  auto actual = run_traced(r, clones(inputs));
  REQUIRE_EQUAL_TENSORS(actual[0], expected[0]);
  REQUIRE_EQUAL_TENSORS(actual[1], expected[1]);
}

TEST_CASE("functionalize: mutated inputs come back as extra outputs", "[tracer]") {
  at::manual_seed(12);
  auto fn = [](const Tensors& in) {
    in[0].mul_(3.0);                          // data mutation
    in[1].transpose_(0, 1);                   // metadata mutation
    in[2].view({-1}).slice(0, 0, 2).zero_();  // data mutation through a view
    return Tensors{in[0] + in[1].sum()};
  };
  Tensors inputs = {at::randn({2, 3}), at::randn({2, 3}), at::randn({2, 2}), at::randn({5})};
  auto r = make_fx(fn, inputs, functionalized());
  require_no_mutation(r.graph);
  const auto& outs = r.graph.signature().outputs;
  REQUIRE(outs.size() == 4);
  REQUIRE(outs[1].kind == ir::OutputKind::MutatedInput);
  REQUIRE(outs[1].input_index == std::optional<size_t>(0));
  REQUIRE(outs[2].kind == ir::OutputKind::MutatedInputMetadata);
  REQUIRE(outs[2].input_index == std::optional<size_t>(1));
  REQUIRE(outs[3].kind == ir::OutputKind::MutatedInput);
  REQUIRE(outs[3].input_index == std::optional<size_t>(2));
  REQUIRE(r.input_mutations[0].data);
  REQUIRE(!r.input_mutations[0].metadata);
  REQUIRE(r.input_mutations[1].metadata);
  REQUIRE(!r.input_mutations[1].data);
  REQUIRE(r.input_mutations[2].data);
  REQUIRE(!r.input_mutations[3].data);
  REQUIRE(!r.input_mutations[3].metadata);

  Tensors eager_in = clones(inputs);
  auto expected = fn(eager_in);
  Tensors graph_in = clones(inputs);
  auto actual = run_traced(r, graph_in);
  REQUIRE_EQUAL_TENSORS(graph_in[0], inputs[0]);  // the graph itself mutates nothing
  REQUIRE_EQUAL_TENSORS(actual[0], expected[0]);
  REQUIRE_EQUAL_TENSORS(actual[1], eager_in[0]);
  REQUIRE(actual[2].sizes() == eager_in[1].sizes());
  REQUIRE(actual[2].strides() == eager_in[1].strides());
  REQUIRE_EQUAL_TENSORS(actual[2], eager_in[1]);
  REQUIRE_EQUAL_TENSORS(actual[3], eager_in[2]);
}

TEST_CASE("functionalize: a joint trace keeps gradients and has no mutation", "[tracer]") {
  at::manual_seed(13);
  auto fn = [](const Tensors& in) {
    auto h = at::matmul(in[0], in[1]);
    h.relu_();
    auto loss = h.pow(2).mean();
    return Tensors{loss.detach(), torch::autograd::grad({loss}, {in[1]})[0]};
  };
  Tensors inputs = {at::randn({6, 4}), at::randn({4, 3}).requires_grad_()};
  auto r = make_fx(fn, inputs, functionalized());
  require_no_mutation(r.graph);
  auto expected = fn(inputs);
  auto actual = run_traced(r, {inputs[0], inputs[1].detach()});
  REQUIRE_EQUAL_TENSORS(actual[0], expected[0]);
  REQUIRE_EQUAL_TENSORS(actual[1], expected[1]);
}

TEST_CASE("decompositions: the SPMD table rewrites foreach ops into functional ops plus copy_", "[tracer]") {
  at::manual_seed(14);
  TraceOptions o;
  o.decompositions = crucible::tracer::spmd_decomposition_table();
  REQUIRE(o.decompositions.count("aten::_foreach_add_.List"));
  REQUIRE(o.decompositions.count("aten::native_layer_norm_backward"));
  auto fn = [](const Tensors& in) {
    Tensors params = {in[0], in[1]}, grads = {in[2], in[3]};
    at::_foreach_add_(params, grads, -0.1);
    at::_foreach_mul_(params, 0.5);
    at::_foreach_sqrt_(grads);
    return Tensors{params[0] * 1.0, params[1] * 1.0, grads[0] * 1.0};
  };
  Tensors inputs = {at::rand({3}), at::rand({2, 2}), at::rand({3}), at::rand({2, 2})};
  auto r = make_fx(fn, inputs, o);
  REQUIRE(count_calls(r.graph, "aten::_foreach_add_.List") == 0);
  REQUIRE(count_calls(r.graph, "aten::_foreach_add.List") == 1);
  REQUIRE(count_calls(r.graph, "aten::_foreach_sqrt") == 1);
  REQUIRE(count_calls(r.graph, "aten::copy_") == 6);
  Tensors eager_in = clones(inputs), graph_in = clones(inputs);
  auto expected = fn(eager_in);
  auto actual = run_traced(r, graph_in);
  for (size_t i = 0; i < expected.size(); ++i) REQUIRE_EQUAL_TENSORS(actual[i], expected[i]);
  for (size_t i = 0; i < inputs.size(); ++i) REQUIRE_EQUAL_TENSORS(graph_in[i], eager_in[i]);
}

TEST_CASE("decompositions: native_layer_norm_backward and user entries", "[tracer]") {
  at::manual_seed(15);
  TraceOptions o;
  o.decompositions = crucible::tracer::spmd_decomposition_table();
  o.decompositions["aten::relu"] = [](const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
    at::Tensor x = stack[0].toTensor();
    stack.clear();
    stack.emplace_back(at::clamp_min(x, 0));
  };
  auto fn = [](const Tensors& in) {
    auto y = at::layer_norm(in[0], {5}, in[1], in[2], 1e-5).relu();
    auto loss = (y * y).sum();
    auto g = torch::autograd::grad({loss}, {in[0], in[1], in[2]});
    return Tensors{loss.detach(), g[0], g[1], g[2]};
  };
  Tensors inputs = {at::randn({4, 5}).requires_grad_(), at::randn({5}).requires_grad_(),
                    at::randn({5}).requires_grad_()};
  auto r = make_fx(fn, inputs, o);
  REQUIRE(count_calls(r.graph, "aten::native_layer_norm_backward") == 0);
  REQUIRE(count_calls(r.graph, "aten::relu") == 0);
  REQUIRE(count_calls(r.graph, "aten::clamp_min") == 1);
  auto expected = fn(inputs);
  Tensors plain;
  for (auto& t : inputs) plain.push_back(t.detach());
  auto actual = run_traced(r, plain);
  // The decomposed backward sums in a different order than the fused kernel.
  for (size_t i = 0; i < expected.size(); ++i) REQUIRE_CLOSE(actual[i], expected[i], 1e-4, 1e-5);

  TraceOptions unknown;
  unknown.decompositions["aten::no_such_op"] = o.decompositions["aten::relu"];
  REQUIRE_THROWS_WITH(make_fx([](const at::Tensor& t) { return t + 1; }, inputs[0].detach(), unknown),
                      CRUCIBLE_HAS_SUBSTR("no_such_op"));
}
