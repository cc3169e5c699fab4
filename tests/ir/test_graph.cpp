// Graph construction: names, use lists, insertion points, erase, clone, and
// the errors that name the op and the argument at fault.
#include <crucible/ir/error.h>
#include <crucible/ir/graph.h>

#include <ATen/ATen.h>

#include "catch.h"

using namespace crucible::ir;

namespace {
TensorMeta f32(std::vector<int64_t> sizes) { return TensorMeta::contiguous(std::move(sizes)); }
}  // namespace

TEST_CASE("calls take schema defaults and FX-style unique names", "[ir][graph]") {
  Graph g;
  Value* x = g.add_placeholder("x", f32({2, 3}));
  Value* y = g.add_placeholder("y", f32({2, 3}));
  Node* a = g.add_call("aten::add.Tensor", {x, y});
  Node* b = g.add_call("aten::add.Tensor", {a->result(), y}, {}, "add");
  REQUIRE(a->result()->name() == "add");
  REQUIRE(b->result()->name() == "add_1");
  REQUIRE(a->args().size() == 3);  // alpha filled from the schema default
  REQUIRE(a->arg(2).is_constant());
  REQUIRE(a->arg(2).constant().toScalar().toLong() == 1);
  REQUIRE(y->users().size() == 2);
  REQUIRE(a->target() == "aten::add.Tensor");
  REQUIRE(b->prev() == a);
  g.set_output({b->result()});
  REQUIRE(g.output_node()->prev() == b);
  REQUIRE(g.signature().outputs.size() == 1);
  REQUIRE(g.signature().inputs.size() == 2);
}

TEST_CASE("multi-result and Tensor[] returns give one Value per tensor", "[ir][graph]") {
  Graph g;
  Value* x = g.add_placeholder("x", f32({4, 6}));
  Node* ln = g.add_call("aten::native_layer_norm",
                        {x, c10::IValue(std::vector<int64_t>{6}), c10::IValue(), c10::IValue(), 1e-5});
  REQUIRE(ln->num_results() == 3);
  REQUIRE(ln->result(2)->name() == "native_layer_norm_2");
  Node* sp = g.add_call("aten::split.Tensor", {x, int64_t{2}, int64_t{0}}, 2);
  REQUIRE(sp->num_results() == 2);
  REQUIRE_THROWS_WITH(g.add_call("aten::split.Tensor", {x, int64_t{2}}), CRUCIBLE_HAS_SUBSTR("list_size"));
}

TEST_CASE("replace_all_uses_with rewrites values and lists, erase needs no users", "[ir][graph]") {
  Graph g;
  Value* x = g.add_placeholder("x", f32({3}));
  Value* y = g.add_placeholder("y", f32({3}));
  Node* cat = g.add_call("aten::cat", {Argument::ValueList{x, x, y}, int64_t{0}});
  Node* neg = g.add_call("aten::neg", {x});
  g.set_output({cat->result(), neg->result()});
  REQUIRE(x->users().size() == 3);
  REQUIRE_THROWS_WITH(g.erase(neg), CRUCIBLE_HAS_SUBSTR("still has 1 use"));
  x->replace_all_uses_with(y);
  REQUIRE(x->users().empty());
  REQUIRE(y->users().size() == 4);
  REQUIRE(cat->arg(0).value_list() == Argument::ValueList{y, y, y});
  g.set_output({cat->result()});
  g.erase(neg);
  REQUIRE(g.find_value("neg") == nullptr);
  REQUIRE(g.num_nodes() == 4);
}

TEST_CASE("move_before schedules a call elsewhere and keeps its uses", "[ir][graph]") {
  Graph g;
  Value* x = g.add_placeholder("x", f32({3}));
  Node* neg = g.add_call("aten::neg", {x});
  Node* exp = g.add_call("aten::exp", {x});
  Node* add = g.add_call("aten::add.Tensor", {neg->result(), exp->result()});
  g.set_output({add->result()});
  g.move_before(neg, add);
  REQUIRE(exp->next() == neg);
  REQUIRE(neg->next() == add);
  REQUIRE(neg->result()->users() == std::vector<Node*>{add});
  g.move_before(neg, neg);  // before itself: stays
  REQUIRE(neg->next() == add);
  {
    // Nodes added while a guard anchors on the moved node follow it.
    Graph::InsertGuard guard(g, neg);
    g.move_before(neg, exp);
    REQUIRE(g.add_call("aten::relu", {x})->next() == neg);
  }
  REQUIRE_THROWS_WITH(g.move_before(neg, x->node()), CRUCIBLE_HAS_SUBSTR("not before a placeholder"));
  REQUIRE_THROWS_WITH(g.move_before(x->node(), neg), CRUCIBLE_HAS_SUBSTR("only a call moves"));
  Graph other;
  Node* foreign = other.add_call("aten::neg", {other.add_placeholder("y", f32({3}))});
  REQUIRE_THROWS_WITH(g.move_before(foreign, neg), CRUCIBLE_HAS_SUBSTR("another graph"));
}

TEST_CASE("InsertGuard places nodes before or after an anchor", "[ir][graph]") {
  Graph g;
  Value* x = g.add_placeholder("x", f32({3}));
  Node* relu = g.add_call("aten::relu", {x});
  g.set_output({relu->result()});
  {
    Graph::InsertGuard guard(g, relu);
    g.add_call("aten::neg", {x});
  }
  {
    Graph::InsertGuard guard(g, relu, Graph::InsertGuard::Where::After);
    g.add_call("aten::exp", {relu->result()});
  }
  Value* late = g.add_placeholder("late", f32({3}));  // placeholders stay first
  std::vector<std::string> order;
  for (Node* n : g.nodes()) order.push_back(n->is_call() ? n->target() : std::string(to_string(n->kind())));
  REQUIRE(order ==
          std::vector<std::string>{"placeholder", "placeholder", "aten::neg", "aten::relu", "aten::exp", "output"});
  REQUIRE(g.placeholders() == std::vector<Value*>{x, late});
}

TEST_CASE("clone is deep and keeps names, metadata, tags and the signature", "[ir][graph]") {
  Graph g;
  Value* w = g.add_placeholder("w", f32({3, 3}), InputSpec{InputKind::Parameter, "fc.weight", {}});
  Node* mm = g.add_call("aten::mm", {w, w});
  mm->result()->set_meta(f32({3, 3}));
  mm->add_tag("backward");
  mm->set_source("test");
  Value* c = g.add_constant(at::arange(3, at::kFloat));
  Node* add = g.add_call("aten::add.Tensor", {mm->result(), c});
  g.set_output({add->result()});
  g.signature().outputs[0].kind = OutputKind::Loss;

  std::unordered_map<const Value*, Value*> map;
  Graph h = g.clone(&map);
  REQUIRE(h.num_nodes() == g.num_nodes());
  REQUIRE(map.at(w)->node()->graph() == &h);
  REQUIRE(h.find_value("mm")->meta() == f32({3, 3}));
  REQUIRE(h.find_value("mm")->node()->has_tag("backward"));
  REQUIRE(h.find_value("mm")->users().size() == 1);
  REQUIRE(h.signature() == g.signature());
  REQUIRE(h.outputs().front()->name() == "add");
  // The clone is independent: editing it leaves the original alone.
  h.set_output({h.find_value("w")});
  REQUIRE(g.outputs().front()->name() == "add");
}

TEST_CASE("bad calls name the operator and the argument", "[ir][graph]") {
  Graph g;
  Value* x = g.add_placeholder("x", f32({3}));
  REQUIRE_THROWS_WITH(g.add_call("aten::add.Tensr", {x, x}), CRUCIBLE_HAS_SUBSTR("aten::add.Tensor"));
  REQUIRE_THROWS_WITH(g.add_call("aten::nonexistent_op", {x}), CRUCIBLE_HAS_SUBSTR("not registered"));
  REQUIRE_THROWS_WITH(g.add_call("aten::mm", {x}), CRUCIBLE_HAS_SUBSTR("'mat2'"));
  REQUIRE_THROWS_WITH(g.add_call("relu", {x}), CRUCIBLE_HAS_SUBSTR("namespaced"));
  Graph other;
  Value* z = other.add_placeholder("z", f32({3}));
  REQUIRE_THROWS_WITH(g.add_call("aten::neg", {z}), CRUCIBLE_HAS_SUBSTR("another graph"));
  REQUIRE_THROWS_WITH(x->node()->op(), CRUCIBLE_HAS_SUBSTR("not a call"));
  Node* n = g.add_call("aten::neg", {x});
  REQUIRE_THROWS_WITH(n->result()->meta(), CRUCIBLE_HAS_SUBSTR("set_meta"));
}

TEST_CASE("mutation and RNG are read from the schema and its tags", "[ir][graph]") {
  Graph g;
  Value* x = g.add_placeholder("x", f32({3}));
  REQUIRE(g.add_call("aten::add_.Tensor", {x, x})->is_mutating());
  REQUIRE_FALSE(g.add_call("aten::add.Tensor", {x, x})->is_mutating());
  REQUIRE(g.add_call("aten::bernoulli", {x})->is_nondeterministic());
  REQUIRE_FALSE(g.add_call("aten::relu", {x})->is_nondeterministic());
}

TEST_CASE("the Values a call writes, and the placeholders a graph writes, are read from the schema", "[ir][graph]") {
  Graph g;
  Value* a = g.add_placeholder("a", f32({3}));
  Value* b = g.add_placeholder("b", f32({3}));
  Value* c = g.add_placeholder("c", f32({3}));
  Node* sum = g.add_call("aten::add.Tensor", {a, b});
  REQUIRE(sum->written().empty());
  // copy_ writes its first argument only; a foreach op each element of its list.
  REQUIRE(g.add_call("aten::copy_", {b, sum->result()})->written() == std::vector<Value*>{b});
  Node* foreach = g.add_call("aten::_foreach_add_.Scalar", {std::vector<Value*>{c, sum->result()}, 1.0});
  REQUIRE(foreach->written() == std::vector<Value*>{c, sum->result()});
  g.set_output({sum->result()});
  REQUIRE(placeholders_written(g) == std::vector<bool>{false, true, true});
}

TEST_CASE("TensorMeta reads tensors and prints the text form's type", "[ir][meta]") {
  auto t = at::zeros({4, 6}).t();
  TensorMeta m = TensorMeta::of(t);
  REQUIRE(m.sizes == std::vector<int64_t>{6, 4});
  REQUIRE_FALSE(m.is_contiguous());
  REQUIRE(to_string(m) == "f32[6, 4] stride=[1, 6]");
  REQUIRE(to_string(TensorMeta::contiguous({2}, at::kLong)) == "i64[2]");
  REQUIRE(dtype_from_short_name("bf16") == at::kBFloat16);
  REQUIRE(TensorMeta::contiguous({2, 3}).nbytes() == 24);
  REQUIRE_THROWS_AS(TensorMeta::of(at::Tensor()), IrError);
}
