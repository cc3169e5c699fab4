// default_partition on hand-built joint graphs: both parts run through the
// interpreter and match eager LibTorch autograd; the interface (saved values,
// placeholders, signatures) is the one Note [Joint graph contract] states.
#include <crucible/ir/interpreter.h>
#include <crucible/ir/parser.h>
#include <crucible/ir/printer.h>
#include <crucible/partitioner/default_partition.h>
#include <crucible/partitioner/error.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "catch.h"
#include "testing.h"

using namespace crucible;
using partitioner::default_partition;
using partitioner::PartitionError;

namespace {

struct Builder {
  ir::Graph g;
  ir::Value* primal(std::string_view name, const at::Tensor& t) {
    return g.add_placeholder(name, ir::TensorMeta::of(t));
  }
  ir::Value* tangent(std::string_view name, const at::Tensor& t) {
    return g.add_placeholder(name, ir::TensorMeta::of(t), ir::InputSpec{ir::InputKind::Tangent, {}, {}});
  }
  // Adds the call and records the eager result's metadata on its Value.
  ir::Value* call(std::string_view op, std::vector<ir::Argument> args, const at::Tensor& eager) {
    ir::Node* n = g.add_call(op, std::move(args));
    n->result()->set_meta(ir::TensorMeta::of(eager));
    return n->result();
  }
  // Outputs: forward outputs, then gradients of the given placeholder indices.
  void output(std::vector<ir::Value*> fwd, std::vector<std::pair<ir::Value*, size_t>> grads) {
    std::vector<ir::Value*> outs = fwd;
    for (auto& [v, _] : grads) outs.push_back(v);
    g.set_output(outs);
    for (size_t i = 0; i < grads.size(); ++i)
      g.signature().outputs[fwd.size() + i] = ir::OutputSpec{ir::OutputKind::Gradient, grads[i].second};
  }
};

std::vector<std::string> placeholder_names(const ir::Graph& g) {
  std::vector<std::string> out;
  for (const ir::Value* v : g.placeholders()) out.push_back(v->name());
  return out;
}

std::vector<at::Tensor> run(const ir::Graph& g, std::vector<at::Tensor> inputs) {
  return ir::Interpreter(g).run(inputs);
}

using IntList = std::vector<int64_t>;

}  // namespace

TEST_CASE("default_partition of relu(x @ w) matches eager autograd", "[partitioner]") {
  at::manual_seed(0);
  const auto x = at::randn({4, 3}), w = at::randn({3, 5}), tangent = at::randn({4, 5});
  // The joint graph, built next to the eager values it stands for.
  const auto mm = at::mm(x, w);
  const auto relu = at::relu(mm);
  const auto tb = at::threshold_backward(tangent, relu, 0);
  Builder b;
  ir::Value* px = b.primal("x", x);
  ir::Value* pw = b.primal("w", w);
  ir::Value* pt = b.tangent("tangents_1", tangent);
  ir::Value* vmm = b.call("aten::mm", {px, pw}, mm);
  ir::Value* vrelu = b.call("aten::relu", {vmm}, relu);
  ir::Value* vtb = b.call("aten::threshold_backward", {pt, vrelu, c10::Scalar(0)}, tb);
  ir::Value* wt = b.call("aten::t", {pw}, w.t());
  ir::Value* gx = b.call("aten::mm", {vtb, wt}, at::mm(tb, w.t()));
  ir::Value* xt = b.call("aten::t", {px}, x.t());
  ir::Value* gw = b.call("aten::mm", {xt, vtb}, at::mm(x.t(), tb));
  b.output({vrelu}, {{gx, 0}, {gw, 1}});

  const auto parts = default_partition(b.g, 1);
  // The interface: the backward reads x and w (through their transposes) and
  // relu (threshold_backward's mask); mm is not saved, as nothing backward reads it.
  REQUIRE(parts.saved_values == std::vector<std::string>{"x", "w", "relu"});
  REQUIRE(parts.saved_symbols.empty());
  REQUIRE(parts.gradient_inputs == std::vector<size_t>{0, 1});
  REQUIRE(placeholder_names(parts.forward) == std::vector<std::string>{"x", "w"});
  REQUIRE(placeholder_names(parts.backward) == std::vector<std::string>{"x", "w", "relu", "tangents_1"});
  REQUIRE(parts.forward.signature().outputs_of(ir::OutputKind::SavedValue) == std::vector<size_t>{1, 2, 3});
  REQUIRE(parts.backward.signature().inputs_of(ir::InputKind::Tangent) == std::vector<size_t>{3});
  REQUIRE(parts.backward.signature().outputs_of(ir::OutputKind::Gradient) == std::vector<size_t>{0, 1});
  // The transposes are backward work: not in the forward graph.
  REQUIRE(parts.forward.find_value("t") == nullptr);
  REQUIRE(parts.backward.find_value("t") != nullptr);
  // Printed, the saved values are saved_value placeholders, and the gradients
  // name the forward's primals by index (0: x, 1: w), not the backward's own
  // placeholders (x, w there are saved values); the text parses back.
  const std::string text = ir::to_text(parts.backward);
  REQUIRE(text.find("placeholder(kind=saved_value, target=\"relu\")") != std::string::npos);
  REQUIRE(text.find(" : gradient(0), ") != std::string::npos);
  REQUIRE(text.find(" : gradient(1))") != std::string::npos);
  REQUIRE(ir::parse(text).signature() == parts.backward.signature());

  // Run both parts and compare with eager autograd.
  const auto fwd = run(parts.forward, {x, w});
  REQUIRE(fwd.size() == 4);
  std::vector<at::Tensor> bwd_in(fwd.begin() + 1, fwd.end());
  bwd_in.push_back(tangent);
  const auto grads = run(parts.backward, bwd_in);

  const auto ex = x.detach().requires_grad_(), ew = w.detach().requires_grad_();
  const auto ey = at::relu(at::mm(ex, ew));
  const auto eg = torch::autograd::grad({ey}, {ex, ew}, {tangent});
  // Same kernels in the same order as the autograd engine runs: bitwise equal.
  REQUIRE_EQUAL_TENSORS(fwd[0], ey.detach());
  REQUIRE_EQUAL_TENSORS(grads[0], eg[0]);
  REQUIRE_EQUAL_TENSORS(grads[1], eg[1]);
}

TEST_CASE("default_partition of sum(relu(x @ w + b)) with a None gradient matches eager", "[partitioner]") {
  at::manual_seed(1);
  const auto x = at::randn({4, 3}), w = at::randn({3, 5}), bias = at::randn({5}), tangent = at::randn({});
  // x does not require grad: the joint graph has no gradient output for it.
  const auto mm = at::mm(x, w);
  const auto add = at::add(mm, bias);
  const auto relu = at::relu(add);
  const auto loss = at::sum(relu);
  const auto expanded = tangent.expand({4, 5});
  const auto tb = at::threshold_backward(expanded, relu, 0);
  Builder b;
  ir::Value* px = b.primal("x", x);
  ir::Value* pw = b.primal("w", w);
  ir::Value* pb = b.primal("b", bias);
  ir::Value* pt = b.tangent("tangents_1", tangent);
  ir::Value* vmm = b.call("aten::mm", {px, pw}, mm);
  ir::Value* vadd = b.call("aten::add.Tensor", {vmm, pb, c10::Scalar(1)}, add);
  ir::Value* vrelu = b.call("aten::relu", {vadd}, relu);
  ir::Value* vloss = b.call("aten::sum", {vrelu, c10::IValue()}, loss);
  ir::Value* vexp = b.call("aten::expand", {pt, IntList{4, 5}, false}, expanded);
  ir::Value* vtb = b.call("aten::threshold_backward", {vexp, vrelu, c10::Scalar(0)}, tb);
  ir::Value* xt = b.call("aten::t", {px}, x.t());
  ir::Value* gw = b.call("aten::mm", {xt, vtb}, at::mm(x.t(), tb));
  ir::Value* gb = b.call("aten::sum.dim_IntList", {vtb, IntList{0}, false, c10::IValue()}, tb.sum({0}));
  b.output({vloss}, {{gw, 1}, {gb, 2}});
  b.g.signature().outputs[0].kind = ir::OutputKind::Loss;

  const auto parts = default_partition(b.g, 1);
  // b and w are read only by the forward; the loss is not read backward.
  REQUIRE(parts.saved_values == std::vector<std::string>{"x", "relu"});
  REQUIRE(parts.gradient_inputs == std::vector<size_t>{1, 2});
  REQUIRE(parts.forward.signature().outputs[0].kind == ir::OutputKind::Loss);

  const auto fwd = run(parts.forward, {x, w, bias});
  REQUIRE(fwd.size() == 3);
  const auto grads = run(parts.backward, {fwd[1], fwd[2], tangent});

  const auto ew = w.detach().requires_grad_(), eb = bias.detach().requires_grad_();
  const auto el = at::sum(at::relu(at::add(at::mm(x, ew), eb)));
  const auto eg = torch::autograd::grad({el}, {ew, eb}, {tangent});
  REQUIRE_EQUAL_TENSORS(fwd[0], el.detach());
  // The engine reduces the expanded gradient through sum_to_size for b where
  // the graph uses sum.dim_IntList: same reduction, so allow only rounding.
  REQUIRE_CLOSE(grads[0], eg[0], 1e-6, 1e-6);
  REQUIRE_CLOSE(grads[1], eg[1], 1e-6, 1e-6);
}

TEST_CASE("default_partition refuses joint graphs that break the contract", "[partitioner]") {
  const auto x = at::randn({3}), t = at::randn({3});
  SECTION("forward output depends on a tangent") {
    Builder b;
    ir::Value* px = b.primal("x", x);
    ir::Value* pt = b.tangent("tangents_1", t);
    ir::Value* y = b.call("aten::mul.Tensor", {px, pt}, x * t);
    b.output({y}, {});
    REQUIRE_THROWS_WITH(default_partition(b.g, 1), CRUCIBLE_HAS_SUBSTR("depends on tangent %tangents_1"));
  }
  SECTION("primal after a tangent") {
    Builder b;
    b.tangent("tangents_1", t);
    ir::Value* px = b.primal("x", x);
    b.output({px}, {});
    REQUIRE_THROWS_AS(default_partition(b.g, 1), PartitionError);
  }
  SECTION("more forward outputs than outputs") {
    Builder b;
    ir::Value* px = b.primal("x", x);
    b.output({px}, {});
    REQUIRE_THROWS_WITH(default_partition(b.g, 2), CRUCIBLE_HAS_SUBSTR("only 1 outputs"));
  }
  SECTION("gradient without an input_index") {
    Builder b;
    ir::Value* px = b.primal("x", x);
    ir::Value* pt = b.tangent("tangents_1", t);
    b.g.set_output({px, pt});
    REQUIRE_THROWS_WITH(default_partition(b.g, 1), CRUCIBLE_HAS_SUBSTR("names no input_index"));
  }
}
