// DCE and CSE: graph in -> expected graph out, what they must keep, and the
// interpreted results before and after each pass (equal, bitwise: the same
// kernels run on the same inputs).
#include <crucible/ir/cse.h>
#include <crucible/ir/dce.h>
#include <crucible/ir/effects.h>
#include <crucible/ir/interpreter.h>
#include <crucible/ir/propagate_meta.h>
#include <crucible/ir/verifier.h>

#include <ATen/ATen.h>

#include "catch.h"
#include "testing.h"

using namespace crucible::ir;

namespace {

TensorMeta f32(std::vector<int64_t> sizes) { return TensorMeta::contiguous(std::move(sizes)); }

// "name = target(arg, ...)" per call or constant node, in order; arguments as
// value names, [lists] and constants as c10 prints them.
std::vector<std::string> listing(const Graph& g) {
  std::vector<std::string> lines;
  for (const Node* n : g.nodes()) {
    if (n->is_placeholder()) continue;
    std::ostringstream os;
    for (size_t i = 0; i < n->num_results(); ++i) os << (i ? ", " : "") << n->result(i)->name();
    os << (n->num_results() ? " = " : "") << n->target() << '(';
    for (size_t i = 0; i < n->args().size(); ++i) {
      const Argument& a = n->args()[i];
      os << (i ? ", " : "");
      if (a.is_value()) {
        os << a.value()->name();
      } else if (a.is_value_list()) {
        os << '[';
        for (size_t j = 0; j < a.value_list().size(); ++j)
          os << (j ? ", " : "") << (a.value_list()[j] ? a.value_list()[j]->name() : "None");
        os << ']';
      } else {
        os << a.constant();
      }
    }
    os << ')';
    lines.push_back(os.str());
  }
  return lines;
}

std::vector<at::Tensor> clones(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> r;
  for (const auto& t : ts) r.push_back(t.clone());
  return r;
}

}  // namespace

TEST_CASE("DCE removes unused pure nodes, transitively, and nothing else", "[ir][dce]") {
  Graph g;
  Value* x = g.add_placeholder("x", f32({4, 6}));
  Value* y = g.add_placeholder("y", f32({4, 6}));
  Value* unused_input = g.add_placeholder("unused", f32({1}));
  Value* relu = g.add_call("aten::relu", {x})->result();
  Value* neg = g.add_call("aten::neg", {x})->result();  // dead
  g.add_call("aten::exp", {neg});                       // dead, and makes %neg dead
  Node* ln = g.add_call("aten::native_layer_norm", {relu, std::vector<int64_t>{6}, c10::IValue(), c10::IValue(), 0.25});
  g.add_call("aten::sym_size.int", {x, int64_t{0}});  // dead int result
  g.add_constant(at::ones({2}), "dead_constant");     // dead
  g.add_call("aten::bernoulli", {x});                 // RNG: kept though unused
  Value* cl = g.add_call("aten::clone", {y})->result();
  Value* view = g.add_call("aten::view", {cl, std::vector<int64_t>{24}})->result();
  g.add_call("aten::mul_.Scalar", {view, 2.0});      // writes %clone through %view: kept, and with it both
  g.add_call("aten::add_.Scalar", {y, int64_t{1}});  // writes an input: kept
  Node* all_reduce = g.add_call("_c10d_functional::all_reduce", {relu, "sum", "0"});  // collective: kept
  Value* sum = g.add_call("aten::add.Tensor", {ln->result(0), cl})->result();
  g.set_output({sum, ln->result(2)});
  // The collective cannot run without a process group, so this graph is not
  // interpreted; metadata is set by hand (the verifier checks its presence).
  for (Node* n : g.nodes())
    if (n->is_call() && n->result(0)->is_tensor()) n->result(0)->set_meta(f32({4, 6}));
  for (const auto& r : ln->results()) r->set_meta(f32({4, 1}));
  view->set_meta(f32({24}));
  REQUIRE_NOTHROW(verify(g));
  REQUIRE(is_collective(*all_reduce));

  REQUIRE(eliminate_dead_code(g) == 4);
  REQUIRE_NOTHROW(verify(g));
  REQUIRE(listing(g) == std::vector<std::string>{
                            "relu = aten::relu(x)",
                            "native_layer_norm, native_layer_norm_1, native_layer_norm_2 = "
                            "aten::native_layer_norm(relu, [6], None, None, 0.25)",
                            "bernoulli = aten::bernoulli(x, None)",
                            "clone = aten::clone(y, None)",
                            "view = aten::view(clone, [24])",
                            "mul_ = aten::mul_.Scalar(view, 2.)",
                            "add_ = aten::add_.Scalar(y, 1, 1)",
                            "all_reduce = _c10d_functional::all_reduce(relu, sum, 0)",
                            "add = aten::add.Tensor(native_layer_norm, clone, 1)",
                            "output(add, native_layer_norm_2)",
                        });
  REQUIRE(g.placeholders().size() == 3);  // even the unused one
  REQUIRE(unused_input->node()->is_placeholder());
  REQUIRE(eliminate_dead_code(g) == 0);  // a fixed point
}

TEST_CASE("DCE leaves the interpreted result unchanged", "[ir][dce]") {
  Graph g;
  Value* x = g.add_placeholder("x", f32({4, 4}));
  Value* y = g.add_placeholder("y", f32({4, 4}));
  Value* mm = g.add_call("aten::mm", {x, g.add_call("aten::t", {y})->result()})->result();
  g.add_call("aten::softmax.int", {mm, int64_t{1}, c10::IValue()});  // dead
  Value* drop = g.add_call("aten::rand_like", {x})->result();
  g.add_call("aten::mul.Tensor", {drop, x});  // dead; rand_like stays, so the RNG stream is the same
  Value* noise = g.add_call("aten::rand_like", {x})->result();
  Value* out = g.add_call("aten::add.Tensor", {mm, noise, int64_t{1}})->result();
  Value* cl = g.add_call("aten::clone", {x, c10::IValue()})->result();
  g.add_call("aten::relu_", {cl});  // the output %clone sees it
  g.set_output({out, cl});
  const std::vector<at::Tensor> inputs{at::randn({4, 4}), at::randn({4, 4})};
  propagate_meta(g);
  REQUIRE_NOTHROW(verify(g));

  at::manual_seed(7);
  const auto before = Interpreter(g)(inputs);
  REQUIRE(eliminate_dead_code(g) == 2);
  REQUIRE_NOTHROW(verify(g));
  at::manual_seed(7);
  const auto after = Interpreter(g)(inputs);
  at::manual_seed(7);
  at::rand_like(inputs[0]);  // the dropped mul's operand, still drawn
  const auto eager = at::mm(inputs[0], inputs[1].t()) + at::rand_like(inputs[0]);
  REQUIRE_EQUAL_TENSORS(after[0], before[0]);
  REQUIRE_EQUAL_TENSORS(after[0], eager);
  REQUIRE_EQUAL_TENSORS(after[1], at::relu(inputs[0]));
}

TEST_CASE("CSE merges repeated calls, constants by value, lists and multi-result calls", "[ir][cse]") {
  Graph g;
  Value* x = g.add_placeholder("x", f32({4, 6}));
  Value* y = g.add_placeholder("y", f32({4, 6}));
  Value* a1 = g.add_call("aten::add.Tensor", {x, y})->result();
  Value* a2 = g.add_call("aten::add.Tensor", {x, y})->result();              // = a1
  Value* a3 = g.add_call("aten::add.Tensor", {x, y, int64_t{2}})->result();  // alpha differs
  Value* a4 = g.add_call("aten::add.Tensor", {x, y, 1.0})->result();         // 1.0 is not 1: kept
  Value* r1 = g.add_call("aten::relu", {a1})->result();
  Value* r2 = g.add_call("aten::relu", {a2})->result();  // = r1 once a2 = a1
  Value* c1 = g.add_call("aten::cat", {Argument::ValueList{x, y}, int64_t{0}})->result();
  Value* c2 = g.add_call("aten::cat", {Argument::ValueList{x, y}, int64_t{0}})->result();  // = c1
  Value* c3 = g.add_call("aten::cat", {Argument::ValueList{y, x}, int64_t{0}})->result();  // order differs
  Node* ln1 = g.add_call("aten::native_layer_norm", {x, std::vector<int64_t>{6}, c10::IValue(), c10::IValue(), 0.25});
  Node* ln2 = g.add_call("aten::native_layer_norm", {x, std::vector<int64_t>{6}, c10::IValue(), c10::IValue(), 0.25});
  Node* ln3 = g.add_call("aten::native_layer_norm", {x, std::vector<int64_t>{6}, c10::IValue(), c10::IValue(), 0.5});
  Value* b1 = g.add_call("aten::rand_like", {a1})->result();
  Value* b2 = g.add_call("aten::rand_like", {a1})->result();  // RNG: never merged
  g.set_output(
      {a1, a2, a3, a4, r1, r2, c1, c2, c3, ln1->result(0), ln2->result(1), ln2->result(2), ln3->result(0), b1, b2});
  const std::vector<at::Tensor> inputs{at::randn({4, 6}), at::randn({4, 6})};
  propagate_meta(g);
  REQUIRE_NOTHROW(verify(g));
  at::manual_seed(3);
  const auto before = Interpreter(g)(inputs);

  REQUIRE(eliminate_common_subexpressions(g) == 4);
  REQUIRE_NOTHROW(verify(g));
  REQUIRE(listing(g) == std::vector<std::string>{
                            "add = aten::add.Tensor(x, y, 1)",
                            "add_2 = aten::add.Tensor(x, y, 2)",
                            "add_3 = aten::add.Tensor(x, y, 1.)",
                            "relu = aten::relu(add)",
                            "cat = aten::cat([x, y], 0)",
                            "cat_2 = aten::cat([y, x], 0)",
                            "native_layer_norm, native_layer_norm_1, native_layer_norm_2 = "
                            "aten::native_layer_norm(x, [6], None, None, 0.25)",
                            "native_layer_norm_6, native_layer_norm_7, native_layer_norm_8 = "
                            "aten::native_layer_norm(x, [6], None, None, 0.5)",
                            "rand_like = aten::rand_like(add, None, None, None, None, None)",
                            "rand_like_1 = aten::rand_like(add, None, None, None, None, None)",
                            "output(add, add, add_2, add_3, relu, relu, cat, cat, cat_2, native_layer_norm, "
                            "native_layer_norm_1, native_layer_norm_2, native_layer_norm_6, rand_like, rand_like_1)",
                        });
  at::manual_seed(3);
  const auto after = Interpreter(g)(inputs);
  for (size_t i = 0; i < after.size(); ++i) {
    INFO("output " << i);
    REQUIRE_EQUAL_TENSORS(after[i], before[i]);
  }
  REQUIRE(eliminate_common_subexpressions(g) == 0);
}

TEST_CASE("CSE never merges across a mutation of an input or of an alias", "[ir][cse]") {
  Graph g;
  Value* x = g.add_placeholder("x", f32({6}));
  Value* y = g.add_placeholder("y", f32({6}));
  // An input written in place: everything is forgotten (inputs may alias).
  Value* a = g.add_call("aten::add.Tensor", {x, y})->result();
  g.add_call("aten::add_.Scalar", {x, int64_t{1}});
  Value* b = g.add_call("aten::add.Tensor", {x, y})->result();  // kept: x changed
  // An intermediate written through a view: calls on it are forgotten,
  // unrelated ones are still merged.
  Value* cl = g.add_call("aten::clone", {y})->result();
  Value* n1 = g.add_call("aten::neg", {cl})->result();
  Value* e1 = g.add_call("aten::exp", {y})->result();
  Value* view = g.add_call("aten::view", {cl, std::vector<int64_t>{2, 3}})->result();
  g.add_call("aten::mul_.Scalar", {view, 3.0});
  Value* n2 = g.add_call("aten::neg", {cl})->result();  // kept: %clone changed through %view
  Value* e2 = g.add_call("aten::exp", {y})->result();   // = e1
  // A result written in place later: its twin must not be merged into it.
  Value* s1 = g.add_call("aten::sin", {y})->result();
  Value* s2 = g.add_call("aten::sin", {y})->result();  // kept
  g.add_call("aten::mul_.Scalar", {s1, 2.0});
  g.set_output({a, b, n1, n2, e1, e2, s1, s2, cl});
  const std::vector<at::Tensor> inputs{at::randn({6}), at::randn({6})};
  propagate_meta(g);
  REQUIRE_NOTHROW(verify(g));
  const auto before = Interpreter(g)(clones(inputs));

  REQUIRE(eliminate_common_subexpressions(g) == 1);
  REQUIRE_NOTHROW(verify(g));
  REQUIRE(g.outputs()[5]->name() == "exp");
  REQUIRE(g.outputs()[3]->name() == "neg_1");
  REQUIRE(g.outputs()[1]->name() == "add_1");
  REQUIRE(g.outputs()[7]->name() == "sin_1");
  const auto after = Interpreter(g)(clones(inputs));
  for (size_t i = 0; i < after.size(); ++i) {
    INFO("output " << i);
    REQUIRE_EQUAL_TENSORS(after[i], before[i]);
  }
  // Eager, for the values that tell the cases apart.
  const auto x1 = inputs[0] + 1;
  REQUIRE_EQUAL_TENSORS(after[1], x1 + inputs[1]);
  REQUIRE_EQUAL_TENSORS(after[3], -(inputs[1] * 3));
  REQUIRE_EQUAL_TENSORS(after[7], at::sin(inputs[1]));
}

TEST_CASE("CSE keeps collectives and in-place ops apart", "[ir][cse]") {
  Graph g;
  Value* x = g.add_placeholder("x", f32({6}));
  Value* r1 = g.add_call("_c10d_functional::all_reduce", {x, "sum", "0"})->result();
  Value* r2 = g.add_call("_c10d_functional::all_reduce", {x, "sum", "0"})->result();
  Value* m1 = g.add_call("aten::relu_", {x})->result();
  Value* m2 = g.add_call("aten::relu_", {x})->result();
  for (Value* v : {r1, r2, m1, m2}) v->set_meta(f32({6}));
  g.set_output({r1, r2, m1, m2});
  REQUIRE(eliminate_common_subexpressions(g) == 0);
  REQUIRE(g.num_nodes() == 6);
}

TEST_CASE("CSE merges calls traced under no_grad only with each other", "[ir][cse]") {
  // A call the function ran under no_grad runs so (the tracer's "no_grad"
  // tag); merged with one that records autograd's graph, a gradient would
  // flow where eager's does not, or stop where it flows.
  Graph g;
  Value* x = g.add_placeholder("x", f32({6}));
  Node* with_grad = g.add_call("aten::exp", {x});
  Node* without = g.add_call("aten::exp", {x});
  Node* without_too = g.add_call("aten::exp", {x});
  without->add_tag("no_grad");
  without_too->add_tag("no_grad");
  for (Node* n : {with_grad, without, without_too}) n->result()->set_meta(f32({6}));
  g.set_output({with_grad->result(), without->result(), without_too->result()});
  REQUIRE(eliminate_common_subexpressions(g) == 1);  // the two no_grad ones
  REQUIRE(g.outputs()[0] != g.outputs()[1]);
  REQUIRE(g.outputs()[1] == g.outputs()[2]);
}

TEST_CASE("CSE assumes graph inputs may alias each other", "[ir][cse]") {
  // Nothing in the graph relates x and y, but a caller may pass one tensor
  // for both: then x.add_(1) changes y, and the two negs differ.
  Graph g;
  Value* x = g.add_placeholder("x", f32({5}));
  Value* y = g.add_placeholder("y", f32({5}));
  Value* n1 = g.add_call("aten::neg", {y})->result();
  g.add_call("aten::add_.Scalar", {x, int64_t{1}});
  Value* n2 = g.add_call("aten::neg", {y})->result();
  g.set_output({n1, n2});
  const auto t = at::randn({5});
  propagate_meta(g);
  REQUIRE(eliminate_common_subexpressions(g) == 0);
  const auto shared = t.clone();
  const auto out = Interpreter(g)({shared, shared});
  REQUIRE_EQUAL_TENSORS(out[0], -t);
  REQUIRE_EQUAL_TENSORS(out[1], -(t + 1));
}

TEST_CASE("DCE and CSE keep every side effect, in its order", "[ir][dce][cse]") {
  // Two dropouts of the same input (RNG draws), an in-place write of an input,
  // a print-like op that returns nothing, and repeated pure work around them.
  Graph g;
  Value* x = g.add_placeholder("x", f32({8}));
  Node* d1 = g.add_call("aten::native_dropout", {x, 0.5, true});
  Node* d2 = g.add_call("aten::native_dropout", {x, 0.5, true});  // identical call: never merged
  Node* w = g.add_call("aten::add_.Scalar", {x, 1.0, 1});
  Node* all = g.add_call("aten::all", {g.add_call("aten::gt.Scalar", {x, -100.0})->result()});
  Node* check = g.add_call("aten::_assert_async", {all->result()});
  Node* unused = g.add_call("aten::exp", {x});  // pure and dead: dropped
  (void)unused;
  g.set_output({g.add_call("aten::add.Tensor", {d1->result(0), d2->result(0)})->result()});
  const std::vector<at::Tensor> in = {at::randn({8})};
  propagate_meta(g);
  const std::vector<const Node*> before = side_effect_order(g);
  REQUIRE(before == std::vector<const Node*>{d1, d2, w, check});
  REQUIRE(eliminate_dead_code(g) == 1);  // the exp
  REQUIRE(eliminate_common_subexpressions(g) == 0);
  verify(g);
  REQUIRE(side_effect_order(g) == before);
  REQUIRE(listing(g).size() == 8);  // the four, gt, all, the add, and no exp

  // Same generator state: the same two masks as before the passes, in order.
  auto run = [&] {
    at::manual_seed(3);
    return Interpreter(g)(clones(in))[0];
  };
  const at::Tensor first = run();
  REQUIRE_EQUAL_TENSORS(run(), first);
  at::manual_seed(3);
  const at::Tensor a = std::get<0>(at::native_dropout(in[0], 0.5, true));
  const at::Tensor b = std::get<0>(at::native_dropout(in[0], 0.5, true));
  REQUIRE_EQUAL_TENSORS(first, a + b);
}
