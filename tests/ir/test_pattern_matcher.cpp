// The pattern matcher: what a pattern binds and matches, where it refuses a
// match (outside readers, writes in between, side effects, a replacement with
// other metadata), malformed rewrites, and interpreted results before and
// after a rewrite.
#include <crucible/ir/error.h>
#include <crucible/ir/interpreter.h>
#include <crucible/ir/parser.h>
#include <crucible/ir/pattern_matcher.h>
#include <crucible/ir/printer.h>
#include <crucible/ir/verifier.h>

#include <ATen/ATen.h>

#include "catch.h"
#include "testing.h"

using namespace crucible::ir;
using P = Pattern;

namespace {

// neg(neg(x)) -> x: a replacement that is a bound Value.
Rewrite double_neg() {
  return {"neg(neg(x))", P::call("aten::neg", {P::call("aten::neg", {P::bind("x")})}), P::bind("x"), {}};
}

// mul(x, x) -> pow(x, 2): a name bound twice must bind the same Value.
Rewrite square() {
  return {"x * x",
          P::call("aten::mul.Tensor", {P::bind("x"), P::bind("x")}),
          P::call("aten::pow.Tensor_Scalar", {P::bind("x"), P::constant(int64_t{2})}),
          {}};
}

void require_meta_right(const Graph& g) { REQUIRE_NOTHROW(verify(g, VerifyOptions{.check_meta = true})); }

}  // namespace

TEST_CASE("a rewrite replaces what its pattern matches, with bound Values and constants", "[ir][pattern]") {
  Graph g = parse(R"(
    %x : f32[3] = placeholder()
    %y : f32[3] = placeholder()
    %a : f32[3] = aten::neg(%x)
    %b : f32[3] = aten::neg(%a)
    %sq : f32[3] = aten::mul.Tensor(%b, %b)
    %xy : f32[3] = aten::mul.Tensor(%x, %y)
    return (%sq, %xy)
  )");
  const std::vector<at::Tensor> inputs{at::randn({3}), at::randn({3})};
  const auto before = Interpreter(g)(inputs);
  REQUIRE(apply_rewrites(g, {double_neg(), square()}) == 2);
  REQUIRE(to_text(g) ==
          "%x : f32[3] = placeholder()\n"
          "%y : f32[3] = placeholder()\n"
          "%pow : f32[3] = aten::pow.Tensor_Scalar(%x, 2)\n"
          "%xy : f32[3] = aten::mul.Tensor(%x, %y)\n"
          "return (%pow, %xy)\n");
  require_meta_right(g);
  const auto after = Interpreter(g)(inputs);
  // x * x and pow(x, 2) are both exact squares of a float: bitwise.
  REQUIRE_EQUAL_TENSORS(after[0], before[0]);
  REQUIRE_EQUAL_TENSORS(after[0], inputs[0] * inputs[0]);
  REQUIRE_EQUAL_TENSORS(after[1], before[1]);
  REQUIRE(apply_rewrites(g, {double_neg(), square()}) == 0);  // a fixed point
}

TEST_CASE("a call pattern matches the schema's defaults where it leaves arguments out, constants by kind",
          "[ir][pattern]") {
  const Rewrite add_one{"add(x, 1)",
                        P::call("aten::add.Scalar", {P::bind("x"), P::constant(int64_t{1})}),
                        P::call("aten::neg", {P::bind("x")}),
                        {}};
  Graph g = parse(R"(
    %x : f32[3] = placeholder()
    %a : f32[3] = aten::add.Scalar(%x, 1, 1)
    %b : f32[3] = aten::add.Scalar(%x, 1, 2)
    %c : f32[3] = aten::add.Scalar(%x, 1.0, 1)
    return (%a, %b, %c)
  )");
  REQUIRE(apply_rewrites(g, {add_one}) == 1);  // alpha=2 is not the default; 1.0 is not 1
  REQUIRE(g.outputs()[0]->node()->target() == "aten::neg");
  REQUIRE(g.outputs()[1]->node()->target() == "aten::add.Scalar");
  REQUIRE(g.outputs()[2]->node()->target() == "aten::add.Scalar");
}

TEST_CASE("a match whose inner calls are read elsewhere, or with a write in between, is refused", "[ir][pattern]") {
  SECTION("an inner call read by another node: fusing would compute it twice") {
    Graph g = parse(R"(
      %x : f32[3] = placeholder()
      %a : f32[3] = aten::neg(%x)
      %b : f32[3] = aten::neg(%a)
      %c : f32[3] = aten::exp(%a)
      return (%b, %c)
    )");
    REQUIRE(apply_rewrites(g, {double_neg()}) == 0);
  }
  SECTION("an in-place write to the bound input between the matched calls") {
    Graph g = parse(R"(
      %x : f32[3] = placeholder()
      %c : f32[3] = aten::clone(%x)
      %a : f32[3] = aten::neg(%c)
      %w : f32[3] = aten::add_.Scalar(%c, 1, 1)
      %b : f32[3] = aten::neg(%a)
      return (%b, %w)
    )");
    const at::Tensor x = at::randn({3});
    REQUIRE(apply_rewrites(g, {double_neg()}) == 0);  // neg(neg(c)) is c before the add_, not after
    REQUIRE_EQUAL_TENSORS(Interpreter(g)({x})[0], x);
  }
  SECTION("a write in between through a view of the bound input (a split piece) refuses; one elsewhere does not") {
    Graph g = parse(R"(
      %x : f32[4] = placeholder()
      %c : f32[4] = aten::clone(%x)
      %a : f32[4] = aten::neg(%c)
      %p : f32[2], %q : f32[2] offset=2 = aten::split.Tensor(%c, 2, 0)
      %w : f32[2] = aten::mul_.Scalar(%q, 3)
      %b : f32[4] = aten::neg(%a)
      %y : f32[4] = aten::clone(%x)
      %n : f32[4] = aten::neg(%y)
      %e : f32[4] = aten::empty_like(%x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None)
      %f : f32[4] = aten::fill_.Scalar(%e, 2)
      %m : f32[4] = aten::neg(%n)
      return (%b, %w, %m, %f)
    )");
    const at::Tensor x = at::randn({4});
    REQUIRE(apply_rewrites(g, {double_neg()}) == 1);  // %m only: fill_ writes %e, which the match never reads
    REQUIRE(g.outputs()[0]->node()->target() == "aten::neg");
    const auto out = Interpreter(g)({x});
    REQUIRE_EQUAL_TENSORS(out[0], x);
    REQUIRE_EQUAL_TENSORS(out[2], x);
  }
  SECTION("an in-place root matches only where it writes storage the match allocated") {
    // add_(neg(x), y) writes the fresh result of neg, which only the match
    // reads; add_(view(x), y) and add_(_unsafe_view(x), y) would write x.
    auto in_place = [](const std::string& inner, std::vector<Pattern> inner_args) {
      return Rewrite{"add_ on " + inner,
                     P::call("aten::add_.Tensor", {P::call(inner, std::move(inner_args)).named("w"), P::bind("y")}),
                     P::call("aten::add.Tensor", {P::bind("w"), P::bind("y")}),
                     {}};
    };
    Graph g = parse(R"(
      %x : f32[2, 3] = placeholder()
      %y : f32[6] = placeholder()
      %c : f32[2, 3] = aten::clone(%x)
      %n : f32[2, 3] = aten::neg(%c)
      %nv : f32[6] = aten::view(%n, [6])
      %a : f32[6] = aten::add_.Tensor(%nv, %y)
      %v : f32[6] = aten::view(%c, [6])
      %b : f32[6] = aten::add_.Tensor(%v, %y)
      %u : f32[6] = aten::_unsafe_view(%c, [6])
      %d : f32[6] = aten::add_.Tensor(%u, %y)
      return (%a, %b, %d, %c)
    )");
    const std::vector<at::Tensor> in{at::randn({2, 3}), at::randn({6})};
    const auto before = Interpreter(g)(in);
    const std::vector<Rewrite> rewrites = {in_place("aten::view", {P::call("aten::neg", {P::bind("x")}), P::bind("s")}),
                                           in_place("aten::view", {P::bind("x"), P::bind("s")}),
                                           in_place("aten::_unsafe_view", {P::bind("x"), P::bind("s")})};
    REQUIRE(apply_rewrites(g, rewrites) == 1);  // %a only: %nv views %n, which the match computed
    REQUIRE(g.outputs()[0]->node()->target() == "aten::add.Tensor");
    REQUIRE(g.outputs()[1]->node()->target() == "aten::add_.Tensor");
    REQUIRE(g.outputs()[2]->node()->target() == "aten::add_.Tensor");
    require_meta_right(g);
    const auto after = Interpreter(g)(in);
    for (size_t i = 0; i < after.size(); ++i) REQUIRE_EQUAL_TENSORS(after[i], before[i]);  // %c saw both writes
  }
  SECTION("calls with side effects never match") {
    const Rewrite relu_{"relu_(x)", P::call("aten::relu_", {P::bind("x")}), P::call("aten::relu", {P::bind("x")}), {}};
    Graph g = parse(R"(
      %x : f32[3] = placeholder()
      %c : f32[3] = aten::clone(%x)
      %r : f32[3] = aten::relu_(%c)
      return (%r)
    )");
    REQUIRE(apply_rewrites(g, {relu_}) == 0);
  }
}

TEST_CASE("a check sees the match's metadata; a replacement with other metadata is undone", "[ir][pattern]") {
  Graph g = parse(R"(
    %x : f32[2, 3] = placeholder()
    %y : f64[2, 3] = placeholder()
    %a : f32[2, 3] = aten::mul.Tensor(%x, %x)
    %b : f64[2, 3] = aten::mul.Tensor(%y, %y)
    return (%a, %b)
  )");
  Rewrite only_f64 = square();
  only_f64.check = [](const Match& m) { return m.meta("x").dtype == at::kDouble; };
  REQUIRE(apply_rewrites(g, {only_f64}) == 1);
  REQUIRE(g.outputs()[0]->node()->target() == "aten::mul.Tensor");
  REQUIRE(g.outputs()[1]->node()->target() == "aten::pow.Tensor_Scalar");

  // exp(x) -> sum(x): same dtype, other sizes. The new call is erased again
  // and the graph is as it was.
  const Rewrite shrink{"exp -> sum", P::call("aten::exp", {P::bind("x")}), P::call("aten::sum", {P::bind("x")}), {}};
  Graph h = parse(R"(
    %x : f32[2, 3] = placeholder()
    %e : f32[2, 3] = aten::exp(%x)
    return (%e)
  )");
  const std::string text = to_text(h);
  REQUIRE(apply_rewrites(h, {shrink}) == 0);
  REQUIRE(to_text(h) == text);
  // An op that rejects the bound shapes: the same.
  const Rewrite bad_mm{
      "exp -> mm", P::call("aten::exp", {P::bind("x")}), P::call("aten::mm", {P::bind("x"), P::bind("x")}), {}};
  REQUIRE(apply_rewrites(h, {bad_mm}) == 0);
  REQUIRE(to_text(h) == text);
}

TEST_CASE("new calls stand where the root stood and keep its source and tags", "[ir][pattern]") {
  Graph g = parse(R"(
    %x : f32[3] = placeholder()
    %m : f32[3] = aten::mul.Tensor(%x, %x) {source="Square.backward", tags=[backward]}
    %e : f32[3] = aten::exp(%m)
    return (%e)
  )");
  REQUIRE(apply_rewrites(g, {square()}) == 1);
  REQUIRE(to_text(g) ==
          "%x : f32[3] = placeholder()\n"
          "%pow : f32[3] = aten::pow.Tensor_Scalar(%x, 2) {source=\"Square.backward\", tags=[backward]}\n"
          "%e : f32[3] = aten::exp(%pow)\n"
          "return (%e)\n");
}

TEST_CASE("Match names what the pattern bound, and malformed rewrites are reported", "[ir][pattern]") {
  Graph g = parse(R"(
    %x : f32[3] = placeholder()
    %e : f32[3] = aten::exp(%x)
    %s : f32[3] = aten::add.Tensor(%e, %x, alpha=2)
    return (%s)
  )");
  bool checked = false;
  const Rewrite probe{
      "probe",
      P::call("aten::add.Tensor", {P::call("aten::exp", {P::bind("x")}).named("e"), P::ignored(), P::bind("alpha")}),
      P::bind("e"), [&](const Match& m) {
        REQUIRE(m.nodes().size() == 2);
        REQUIRE(m.root()->result()->name() == "s");
        REQUIRE(m.value("x")->name() == "x");
        REQUIRE(m.value("e")->name() == "e");
        REQUIRE(m.constant("alpha").toInt() == 2);
        REQUIRE(m.has("alpha"));
        REQUIRE_FALSE(m.has("y"));
        REQUIRE_THROWS_WITH(m["y"], CRUCIBLE_HAS_SUBSTR("binds nothing named 'y'"));
        REQUIRE_THROWS_WITH(m.value("alpha"), CRUCIBLE_HAS_SUBSTR("'alpha' bound a constant"));
        checked = true;
        return false;
      }};
  REQUIRE(apply_rewrites(g, {probe}) == 0);
  REQUIRE(checked);

  REQUIRE_THROWS_WITH(P::call("aten::native_layer_norm", {}), CRUCIBLE_HAS_SUBSTR("does not return exactly one value"));
  REQUIRE_THROWS_WITH(P::call("aten::neg", {P::ignored(), P::ignored()}), CRUCIBLE_HAS_SUBSTR("given 2 arguments"));
  REQUIRE_THROWS_WITH(P::call("aten::nope", {}), CRUCIBLE_HAS_SUBSTR("not registered"));
  REQUIRE_THROWS_WITH(P::bind("x").named("y"), CRUCIBLE_HAS_SUBSTR("call patterns only"));
  REQUIRE_THROWS_WITH(apply_rewrites(g, {{"unbound", P::call("aten::exp", {P::bind("x")}), P::bind("z"), {}}}),
                      CRUCIBLE_HAS_SUBSTR("rewrite 'unbound': the replacement uses 'z'"));
  REQUIRE_THROWS_WITH(
      apply_rewrites(g, {{"ignored", P::call("aten::exp", {P::bind("x")}), P::call("aten::neg", {P::ignored()}), {}}}),
      CRUCIBLE_HAS_SUBSTR("holds an Ignored"));
  REQUIRE_THROWS_WITH(apply_rewrites(g, {{"root", P::bind("x"), P::bind("x"), {}}}),
                      CRUCIBLE_HAS_SUBSTR("the pattern's root must be a call pattern"));
  REQUIRE_THROWS_WITH(
      apply_rewrites(
          g, {{"no default", P::call("aten::exp", {P::bind("x")}), P::call("aten::add.Tensor", {P::bind("x")}), {}}}),
      CRUCIBLE_HAS_SUBSTR("leaves out argument 'other', which has no default"));
  // exp(x) -> exp(x) matches its own replacement forever.
  REQUIRE_THROWS_WITH(
      apply_rewrites(g, {{"loop", P::call("aten::exp", {P::bind("x")}), P::call("aten::exp", {P::bind("x")}), {}}}),
      CRUCIBLE_HAS_SUBSTR("still rewriting after 64 sweeps"));
}

TEST_CASE("any_of matches the first alternative that matches, leaving nothing of those that failed", "[ir][pattern]") {
  Graph g = parse(R"(
    %x : f32[2, 3] = placeholder()
    %y : f32[2, 3] = placeholder()
    %a : f32[6] = aten::view(%x, [6])
    %ra : f32[6] = aten::relu(%a)
    %t : f32[3, 2] stride=[1, 3] = aten::t(%y)
    %c : f32[3, 2] = aten::clone(%t, memory_format=contiguous_format)
    %b : f32[6] = aten::_unsafe_view(%c, [6])
    %rb : f32[6] = aten::relu(%b)
    %n : f32[2, 3] = aten::neg(%x)
    %rn : f32[2, 3] = aten::relu(%n)
    return (%ra, %rb, %rn)
  )");
  // relu of a flattening (a view, or a copy then _unsafe_view) -> flatten(abs(...)).
  // The middle alternative binds "x" and takes %b's call before its size
  // fails to match: the third must find neither left behind.
  const P flat =
      P::any_of({P::call("aten::view", {P::bind("x"), P::ignored()}),
                 P::call("aten::_unsafe_view", {P::bind("x"), P::constant(c10::IValue(std::vector<int64_t>{7}))}),
                 P::call("aten::_unsafe_view", {P::call("aten::clone", {P::bind("x"), P::ignored()}), P::ignored()})});
  const Rewrite r{"relu(flat(x))", P::call("aten::relu", {flat}),
                  P::call("aten::flatten.using_ints", {P::call("aten::abs", {P::bind("x")})}), [](const Match& m) {
                    // relu and view, or relu, _unsafe_view and clone: nothing of the failed alternative.
                    return m.nodes().size() == (m.value("x")->name() == "x" ? 2u : 3u);
                  }};
  const std::vector<at::Tensor> inputs{at::randn({2, 3}), at::randn({2, 3})};
  REQUIRE(apply_rewrites(g, {r}) == 2);
  require_meta_right(g);
  const auto after = Interpreter(g)(inputs);
  REQUIRE_EQUAL_TENSORS(after[0], inputs[0].abs().flatten());
  REQUIRE_EQUAL_TENSORS(after[1], inputs[1].t().abs().flatten());
  REQUIRE_EQUAL_TENSORS(after[2], at::relu(-inputs[0]));
  REQUIRE_THROWS_WITH(P::any_of({P::bind("x")}), CRUCIBLE_HAS_SUBSTR("two alternatives or more"));
  // A replacement may use only what every alternative binds, and holds no any_of.
  const P partial = P::any_of({P::call("aten::view", {P::bind("x"), P::bind("size")}),
                               P::call("aten::_unsafe_view", {P::bind("x"), P::ignored()})});
  REQUIRE_THROWS_WITH(apply_rewrites(g, {{"partial", P::call("aten::relu", {partial}), P::bind("size"), {}}}),
                      CRUCIBLE_HAS_SUBSTR("the replacement uses 'size'"));
  REQUIRE_THROWS_WITH(
      apply_rewrites(
          g, {{"any_of in replacement", P::call("aten::relu", {partial}), P::call("aten::neg", {partial}), {}}}),
      CRUCIBLE_HAS_SUBSTR("holds an any_of"));
}

TEST_CASE("a match across grad modes (calls traced under no_grad and others) is refused", "[ir][pattern]") {
  Graph g = parse(R"(
    %x : f32[3] = placeholder()
    %a : f32[3] = aten::neg(%x) {tags=[no_grad]}
    %b : f32[3] = aten::neg(%a)
    %c : f32[3] = aten::neg(%x) {tags=[no_grad]}
    %d : f32[3] = aten::neg(%c) {tags=[no_grad]}
    return (%b, %d)
  )");
  REQUIRE(apply_rewrites(g, {double_neg()}) == 1);  // %d: both calls ran under no_grad
  REQUIRE(g.outputs()[0]->name() == "b");
  REQUIRE(g.outputs()[1]->name() == "x");
}
