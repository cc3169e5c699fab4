// Tensors a traced function reads from outside its arguments (Note [Lifted
// tensors]): lifted to placeholders, never baked; its own temporaries made
// outside the dispatcher become constants. Each graph is interpreted and
// compared with eager LibTorch on the same tensors.
#include "catch.h"
#include "testing.h"
#include "tracer_testing.h"

#include <crucible/ir/printer.h>
#include <crucible/tracer/error.h>
#include <crucible/tracer/functional_call.h>
#include <crucible/tracer/make_fx.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>
#include <torch/utils.h>

using crucible::testing::count_calls;
using crucible::testing::run_traced;
using crucible::tracer::functional_call;
using crucible::tracer::make_fx;
using crucible::tracer::ModuleTraceOptions;
using crucible::tracer::TraceError;
using crucible::tracer::TraceMode;
using crucible::tracer::TraceOptions;
using Tensors = std::vector<at::Tensor>;
namespace ir = crucible::ir;

// Tolerances: the interpreter runs the same kernels in the same order as
// eager, so results are bitwise equal.

namespace {

size_t count_constants(const ir::Graph& g) {
  size_t n = 0;
  for (const ir::Node* node : g.nodes()) n += node->is_constant();
  return n;
}

// The graph's inputs: the arguments, then the lifted tensors.
Tensors with_lifted(Tensors args, const crucible::tracer::TraceResult& r) {
  for (const auto& l : r.lifted) args.push_back(l.tensor);
  return args;
}

}  // namespace

TEST_CASE("make_fx lifts a captured tensor to a placeholder and reads its current value", "[tracer][lifted]") {
  at::manual_seed(1);
  at::Tensor w = at::randn({4, 3}), b = at::randn({3});
  auto fn = [&](const at::Tensor& x) { return at::matmul(x, w) + b; };
  at::Tensor x = at::randn({2, 4});
  TraceOptions options;
  options.source_names = {{"layer.weight", w}};
  auto r = make_fx(fn, x, options);

  REQUIRE(count_constants(r.graph) == 0);
  const auto& specs = r.graph.signature().inputs;
  REQUIRE(specs.size() == 3);
  REQUIRE(specs[1].kind == ir::InputKind::Lifted);
  REQUIRE(specs[1].target == "layer.weight");
  REQUIRE(r.graph.placeholders()[1]->name() == "layer_weight");  // names sanitized as FX does
  REQUIRE(specs[2].kind == ir::InputKind::Lifted);
  REQUIRE(specs[2].target.empty());
  REQUIRE(r.lifted.size() == 2);
  REQUIRE(r.lifted[0].input_index == 1);
  REQUIRE(r.lifted[0].tensor.is_same(w));
  REQUIRE(r.lifted[1].tensor.is_same(b));
  REQUIRE(ir::to_text(r.graph).find("lifted") != std::string::npos);
  REQUIRE_EQUAL_TENSORS(run_traced(r, with_lifted({x}, r))[0], fn(x));

  // Changed in place after the trace: the graph reads the new value.
  w.mul_(-2.0);
  b.add_(1.0);
  REQUIRE_EQUAL_TENSORS(run_traced(r, with_lifted({x}, r))[0], fn(x));
}

TEST_CASE("make_fx: tracing leaves a lifted tensor's data and gradient as they were", "[tracer][lifted]") {
  at::manual_seed(2);
  at::Tensor w = at::randn({3}).requires_grad_();
  w.mutable_grad() = at::full({3}, 5.0);
  const at::Tensor before = w.detach().clone();
  const void* data = w.data_ptr();
  auto fn = [&](const Tensors& in) {
    at::Tensor loss = (in[0] * w).sum();
    return Tensors{torch::autograd::grad({loss}, {w})[0]};
  };
  auto r = make_fx(fn, {at::randn({3})});
  REQUIRE(w.data_ptr() == data);
  REQUIRE_EQUAL_TENSORS(w.detach(), before);
  REQUIRE_EQUAL_TENSORS(w.grad(), at::full({3}, 5.0));
  REQUIRE(r.graph.placeholders()[1]->meta().requires_grad);
  REQUIRE(r.lifted.size() == 1);
}

TEST_CASE("make_fx with functionalize: a write to a lifted tensor is a mutated-input output", "[tracer][lifted]") {
  at::manual_seed(3);
  at::Tensor counter = at::zeros({2});
  auto fn = [&](const Tensors& in) {
    counter.add_(in[0]);
    return Tensors{in[0] * counter};
  };
  TraceOptions options;
  options.functionalize = true;
  at::Tensor x = at::randn({2});
  auto r = make_fx(fn, {x}, options);
  REQUIRE_EQUAL_TENSORS(counter, at::zeros({2}));  // tracing ran on a copy
  REQUIRE(r.lifted.size() == 1);
  REQUIRE(r.input_mutations.size() == 2);
  REQUIRE(r.input_mutations[1].data);
  REQUIRE(count_calls(r.graph, "aten::add_.Tensor") == 0);
  const auto& outs = r.graph.signature().outputs;
  REQUIRE(outs.size() == 2);
  REQUIRE(outs[1].kind == ir::OutputKind::MutatedInput);
  REQUIRE(outs[1].input_index == 1);
  const Tensors got = run_traced(r, with_lifted({x}, r));
  const at::Tensor expected = fn({x})[0];  // eager: counter becomes x
  REQUIRE_EQUAL_TENSORS(got[0], expected);
  REQUIRE_EQUAL_TENSORS(got[1], counter);
}

TEST_CASE("make_fx: a tensor the function makes outside the dispatcher becomes a constant", "[tracer][lifted]") {
  auto fn = [](const at::Tensor& x) {
    float values[3] = {1.5f, -2.0f, 0.25f};
    at::Tensor scale = at::from_blob(values, {3});  // no dispatcher op makes it
    return x * scale;
  };
  at::Tensor x = at::randn({4, 3});
  auto r = make_fx(fn, x);
  REQUIRE(r.lifted.empty());
  REQUIRE(r.graph.placeholders().size() == 1);
  REQUIRE(count_constants(r.graph) == 1);
  REQUIRE_EQUAL_TENSORS(run_traced(r, {x})[0], fn(x));

  // Written in place by the function: the graph writes a clone, never its constant.
  auto writes = [](const at::Tensor& x) {
    float values[3] = {1.0f, 2.0f, 3.0f};
    at::Tensor t = at::from_blob(values, {3});
    t.mul_(2.0);
    return x + t;
  };
  auto w = make_fx(writes, x);
  REQUIRE(w.lifted.empty());
  REQUIRE_EQUAL_TENSORS(run_traced(w, {x})[0], writes(x));
  REQUIRE_EQUAL_TENSORS(run_traced(w, {x})[0], writes(x));  // and again: the constant did not change

  // torch::tensor from C++ values dispatches its fill: recorded as ops, not a constant.
  auto literal = [](const at::Tensor& x) { return x * torch::tensor({1.5f, -2.0f, 0.25f}); };
  auto l = make_fx(literal, x);
  REQUIRE(l.lifted.empty());
  REQUIRE_EQUAL_TENSORS(run_traced(l, {x})[0], literal(x));

  // Too large for a constant: refused, naming the limit.
  auto large = [](const at::Tensor& x) {
    std::vector<float> values(1 << 19, 0.5f);
    return x + at::from_blob(values.data(), {1 << 19}).sum();
  };
  REQUIRE_THROWS_WITH(make_fx(large, x), CRUCIBLE_HAS_SUBSTR("max_constant_bytes"));
}

TEST_CASE("make_fx: a captured tensor returned as an output is its lifted placeholder", "[tracer][lifted]") {
  at::Tensor g = at::randn({3});
  auto r = make_fx([&](const Tensors& in) { return Tensors{in[0] + 1.0, g}; }, {at::randn({3})});
  REQUIRE(r.graph.outputs()[1] == r.graph.placeholders()[1]);
  REQUIRE(r.graph.signature().inputs[1].kind == ir::InputKind::Lifted);
  REQUIRE(r.lifted.size() == 1);
}

TEST_CASE("make_fx in fake mode lifts a captured tensor as a meta placeholder", "[tracer][lifted]") {
  at::manual_seed(4);
  at::Tensor w = at::randn({4, 3});
  TraceOptions fake;
  fake.mode = TraceMode::Fake;
  auto r = make_fx([&](const at::Tensor& x) { return at::matmul(x, w).relu(); }, at::randn({2, 4}), fake);
  REQUIRE(r.lifted.size() == 1);
  REQUIRE(w.device().is_cpu());  // restored after the trace
  const at::Tensor x = at::randn({2, 4});
  REQUIRE_EQUAL_TENSORS(run_traced(r, with_lifted({x}, r))[0], at::matmul(x, w).relu());
}

TEST_CASE("functional_call lifts another module's parameters and returns their gradients", "[tracer][lifted]") {
  torch::manual_seed(5);
  torch::nn::Linear own(4, 3), other(3, 2);
  ModuleTraceOptions options;
  options.trace.source_names = crucible::tracer::module_state(*other, "other").tensors;
  options.gradients_as_outputs = true;
  auto step = [&](torch::nn::Module&, const Tensors& in) {
    at::Tensor loss = other->forward(own->forward(in[0])).pow(2).mean();
    loss.backward();
    return Tensors{loss.detach()};
  };
  const at::Tensor x = at::randn({5, 4});
  auto r = functional_call(*own, step, {x}, options);
  REQUIRE(!other->weight.grad().defined());  // tracing accumulated into nothing of the caller's
  REQUIRE(r.lifted.size() == 2);
  const auto& specs = r.graph.signature().inputs;
  REQUIRE(specs[3].kind == ir::InputKind::Lifted);
  REQUIRE(specs[3].target == "other.weight");
  REQUIRE(specs[4].target == "other.bias");
  // Outputs: the loss, own's two gradients, other's two.
  const auto& outs = r.graph.signature().outputs;
  REQUIRE(outs.size() == 5);
  REQUIRE(outs[3] == ir::OutputSpec{ir::OutputKind::Gradient, 3});
  REQUIRE(outs[4] == ir::OutputSpec{ir::OutputKind::Gradient, 4});

  Tensors inputs = {own->weight.detach(), own->bias.detach(), x, other->weight.detach(), other->bias.detach()};
  const Tensors got = run_traced(r, inputs);
  step(*own, {x});  // eager: fills .grad of both modules
  REQUIRE_EQUAL_TENSORS(got[0], (other->forward(own->forward(x))).pow(2).mean().detach());
  REQUIRE_EQUAL_TENSORS(got[1], own->weight.grad());
  REQUIRE_EQUAL_TENSORS(got[3], other->weight.grad());
  REQUIRE_EQUAL_TENSORS(got[4], other->bias.grad());
}
