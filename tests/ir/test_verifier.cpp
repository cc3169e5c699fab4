// The verifier: a well-formed graph passes; each broken graph fails with a
// message that names the node (or the signature entry) and the problem.
#include <crucible/ir/error.h>
#include <crucible/ir/verifier.h>

#include <ATen/ATen.h>

#include "catch.h"

using namespace crucible::ir;

namespace {

TensorMeta f32(std::vector<int64_t> sizes) { return TensorMeta::contiguous(std::move(sizes)); }

// x[2, 3], w[3, 4] -> mm -> relu -> output; every meta set.
struct Small {
  Graph g;
  Value* x = g.add_placeholder("x", f32({2, 3}));
  Value* w = g.add_placeholder("w", f32({3, 4}));
  Node* mm = g.add_call("aten::mm", {x, w});
  Node* relu = g.add_call("aten::relu", {mm->result()});
  Small() {
    mm->result()->set_meta(f32({2, 4}));
    relu->result()->set_meta(f32({2, 4}));
    g.set_output({relu->result()});
  }
};

}  // namespace

TEST_CASE("verify accepts well-formed graphs with every argument kind", "[ir][verifier]") {
  Small s;
  REQUIRE_NOTHROW(verify(s.g));

  Graph g;
  Value* x = g.add_placeholder("x", f32({4, 6}));
  Value* idx = g.add_placeholder("idx", TensorMeta::contiguous({2}, at::kLong));
  Node* ln = g.add_call("aten::native_layer_norm", {x, std::vector<int64_t>{6}, c10::IValue(), c10::IValue(), 1e-5});
  Node* sp = g.add_call("aten::split.Tensor", {ln->result(0), int64_t{2}, int64_t{0}}, 2);
  Node* cat = g.add_call("aten::cat", {Argument::ValueList{sp->result(1), sp->result(0)}, int64_t{0}});
  Node* index = g.add_call("aten::index.Tensor", {cat->result(), Argument::ValueList{nullptr, idx}});
  Node* size = g.add_call("aten::sym_size.int", {x, int64_t{1}});
  Node* add =
      g.add_call("aten::add.Scalar", {index->result(), size->result(), true});  // Scalar takes int Values and bools
  Node* to = g.add_call("aten::_to_copy", {add->result(), at::kDouble, c10::IValue(), at::Device(at::kCPU)});
  Value* c = g.add_constant(at::ones({1}));
  Node* mul = g.add_call("aten::mul.Tensor", {to->result(), c});
  for (Node* n : {ln, sp, cat, index, add, to, mul})
    for (const auto& r : n->results()) r->set_meta(f32({1}));  // the verifier checks presence, not shapes
  g.set_output({mul->result(), ln->result(1)});
  g.signature().outputs[1] = OutputSpec{OutputKind::Gradient, 0};
  REQUIRE_NOTHROW(verify(g));
}

TEST_CASE("verify: use before definition", "[ir][verifier]") {
  Small s;
  Graph::InsertGuard guard(s.g, s.mm);
  Node* neg = s.g.add_call("aten::neg", {s.relu->result()});  // placed before %mm, reads %relu
  neg->result()->set_meta(f32({2, 4}));
  REQUIRE_THROWS_WITH(verify(s.g), CRUCIBLE_HAS_SUBSTR("node %neg (aten::neg): reads %relu before it is defined"));
}

TEST_CASE("verify: missing TensorMeta", "[ir][verifier]") {
  Small s;
  s.g.add_call("aten::exp", {s.x});
  REQUIRE_THROWS_WITH(verify(s.g), CRUCIBLE_HAS_SUBSTR("node %exp (aten::exp): tensor result %exp has no TensorMeta"));
}

TEST_CASE("verify: an unread result a backward op did not compute may lack TensorMeta", "[ir][verifier]") {
  // convolution_backward with output_mask [false, true, true]: no input gradient.
  Graph g;
  Value* grad = g.add_placeholder("grad", f32({1, 2, 4, 4}));
  Value* x = g.add_placeholder("x", f32({1, 1, 4, 4}));
  Value* w = g.add_placeholder("w", f32({2, 1, 1, 1}));
  Node* bw = g.add_call("aten::convolution_backward",
                        {grad, x, w, std::vector<int64_t>{2}, std::vector<int64_t>{1, 1}, std::vector<int64_t>{0, 0},
                         std::vector<int64_t>{1, 1}, false, std::vector<int64_t>{0, 0}, int64_t{1},
                         std::vector<bool>{false, true, true}});
  bw->result(1)->set_meta(f32({2, 1, 1, 1}));
  bw->result(2)->set_meta(f32({2}));
  g.set_output({bw->result(1), bw->result(2)});
  REQUIRE_NOTHROW(verify(g));
  // Read, it must have metadata.
  g.set_output({bw->result(0), bw->result(1), bw->result(2)});
  REQUIRE_THROWS_WITH(verify(g), CRUCIBLE_HAS_SUBSTR("tensor result %convolution_backward has no TensorMeta"));
}

TEST_CASE("verify: argument kinds against the schema", "[ir][verifier]") {
  SECTION("a constant where a tensor goes") {
    Small s;
    s.mm->set_arg(1, int64_t{3});
    REQUIRE_THROWS_WITH(
        verify(s.g),
        CRUCIBLE_HAS_SUBSTR(
            "node %mm (aten::mm): argument 'mat2' (Tensor) takes a tensor Value, got a constant of type int"));
  }
  SECTION("a tensor constant inline") {
    Small s;
    s.mm->set_arg(1, at::ones({3, 4}));
    REQUIRE_THROWS_WITH(verify(s.g), CRUCIBLE_HAS_SUBSTR("tensor constants are constant nodes"));
  }
  SECTION("a tensor where a Scalar goes") {
    Small s;
    Node* add = s.g.add_call("aten::add.Tensor", {s.x, s.x, s.x});
    add->result()->set_meta(f32({2, 3}));
    REQUIRE_THROWS_WITH(verify(s.g), CRUCIBLE_HAS_SUBSTR("node %add (aten::add.Tensor): argument 'alpha' (Scalar) "
                                                         "takes a constant or a Value of that type, got %x (Tensor)"));
  }
  SECTION("a wrong constant type") {
    Small s;
    Node* sum = s.g.add_call("aten::sum.dim_IntList", {s.x, std::vector<int64_t>{0}});
    sum->result()->set_meta(f32({3}));
    sum->set_arg(2, 1.5);  // keepdim is a bool
    REQUIRE_THROWS_WITH(
        verify(s.g),
        CRUCIBLE_HAS_SUBSTR("argument 'keepdim' (bool) takes a constant of that type, got a constant of type float"));
  }
  SECTION("None where the argument is not optional") {
    Small s;
    s.mm->set_arg(1, c10::IValue());
    REQUIRE_THROWS_WITH(verify(s.g), CRUCIBLE_HAS_SUBSTR("argument 'mat2' (Tensor) takes a tensor Value, got None"));
  }
  SECTION("a single Value where Tensor[] goes, None in Tensor[]") {
    Small s;
    Node* cat = s.g.add_call("aten::cat", {Argument::ValueList{s.x, s.x}});
    cat->result()->set_meta(f32({4, 3}));
    REQUIRE_NOTHROW(verify(s.g));
    cat->set_arg(0, s.x);
    REQUIRE_THROWS_WITH(verify(s.g),
                        CRUCIBLE_HAS_SUBSTR("argument 'tensors' (Tensor[]) takes a list of tensor Values, got %x"));
    cat->set_arg(0, Argument::ValueList{s.x, nullptr});
    REQUIRE_THROWS_WITH(verify(s.g), CRUCIBLE_HAS_SUBSTR("without None (None is for Tensor?[])"));
  }
  SECTION("an int Value where a tensor goes") {
    Small s;
    Graph::InsertGuard guard(s.g, s.mm);
    Node* size = s.g.add_call("aten::sym_size.int", {s.x, int64_t{0}});
    s.mm->set_arg(1, size->result());
    REQUIRE_THROWS_WITH(verify(s.g),
                        CRUCIBLE_HAS_SUBSTR("argument 'mat2' (Tensor) takes a tensor Value, got %sym_size (int)"));
  }
}

TEST_CASE("verify: output node and signature", "[ir][verifier]") {
  SECTION("no output node") {
    Graph g;
    g.add_placeholder("x", f32({2}));
    REQUIRE_THROWS_WITH(verify(g), CRUCIBLE_HAS_SUBSTR("the graph has no output node"));
  }
  SECTION("output specs do not match the outputs") {
    Small s;
    s.g.signature().outputs.push_back({});
    REQUIRE_THROWS_WITH(verify(s.g), CRUCIBLE_HAS_SUBSTR("2 output specs for 1 outputs"));
  }
  SECTION("input specs do not match the placeholders") {
    Small s;
    s.g.signature().inputs.pop_back();
    REQUIRE_THROWS_WITH(verify(s.g), CRUCIBLE_HAS_SUBSTR("1 input specs for 2 placeholders"));
  }
  SECTION("input_index out of range or missing") {
    Small s;
    s.g.signature().outputs[0] = OutputSpec{OutputKind::Gradient, 2};
    REQUIRE_THROWS_WITH(verify(s.g),
                        CRUCIBLE_HAS_SUBSTR("output 0 (gradient) refers to input 2, but the graph has 2 placeholders"));
    s.g.signature().outputs[0] = OutputSpec{OutputKind::MutatedInput, std::nullopt};
    REQUIRE_THROWS_WITH(verify(s.g), CRUCIBLE_HAS_SUBSTR("output 0 (mutated_input) has no input_index"));
  }
  SECTION("a backward graph's gradients name the forward's inputs") {
    // Its placeholders a saved value and a tangent; the gradient is of the
    // forward's input 5.
    Small s;
    s.g.signature().inputs[0] = InputSpec{InputKind::SavedValue, "x", std::nullopt};
    s.g.signature().inputs[1] = InputSpec{InputKind::Tangent, "", std::nullopt};
    s.g.signature().outputs[0] = OutputSpec{OutputKind::Gradient, 5};
    verify(s.g);
    s.g.signature().outputs[0] = OutputSpec{OutputKind::MutatedInput, 5};
    REQUIRE_THROWS_WITH(verify(s.g), CRUCIBLE_HAS_SUBSTR("refers to input 5"));
  }
  SECTION("duplicate_of must name an earlier placeholder") {
    Small s;
    s.g.signature().inputs[0].duplicate_of = 1;
    REQUIRE_THROWS_WITH(verify(s.g), CRUCIBLE_HAS_SUBSTR("input 0 is marked duplicate_of 1"));
  }
}
