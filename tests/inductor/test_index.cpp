// Index expressions (inductor/src/loop_ir/index.h): the normal form and
// its printing, and the simplifications of floor division and modulo that
// turn views back into strided indexing, stated as expression in, text
// out; with sizes over size symbols (loop_ir/size_expr.h) too.
#include "loop_ir/index.h"

#include "catch.h"

#include <cstdint>
#include <vector>

using crucible::inductor::detail::contiguous_strides;
using crucible::inductor::detail::dot;
using crucible::inductor::detail::Expr;
using crucible::inductor::detail::SizeExpr;
using crucible::inductor::detail::unravel;

namespace {

Expr var(const char* name, int64_t extent) { return Expr::var(name, extent); }

}  // namespace

TEST_CASE("index: terms print sorted by their atom, with coefficients, constant last", "[index]") {
  CHECK(var("o", 8).str() == "o");
  CHECK((var("r", 64) + var("o", 4) * 64).str() == "64*o + r");
  CHECK((var("o", 4) * 3 + Expr(5)).str() == "3*o + 5");
  CHECK(Expr().str() == "0");
  CHECK(Expr(7).str() == "7");
  // A variable of extent 1 is 0; terms that cancel leave nothing.
  CHECK(var("o", 1).is_constant());
  CHECK((var("o", 8) + var("o", 8) * -1).str() == "0");
  CHECK(var("o", 8) == var("o", 8) * 1);
}

TEST_CASE("index: ranges over the variables", "[index]") {
  const Expr e = var("o", 4) * 64 + var("r", 64) + Expr(-3);
  CHECK(e.lo() == -3);
  CHECK(e.hi() == 3 * 64 + 63 - 3);
  CHECK((var("o", 4) * -2).lo() == -6);
}

TEST_CASE("index: floor division and modulo drop what they cannot change", "[index]") {
  const Expr o = var("o", 4), r = var("r", 64);
  // Multiples of the divisor leave the division; a remainder whose range
  // lies in [0, c) vanishes from it.
  CHECK(floordiv(o * 64 + r, 64).str() == "o");
  CHECK(mod(o * 64 + r, 64).str() == "r");
  CHECK(floordiv(r, 64).str() == "0");
  CHECK(mod(r, 64).str() == "r");
  CHECK(floordiv(r, 1) == r);
  CHECK(mod(r, 1).str() == "0");
  // What cannot be simplified is an atom, parenthesized.
  CHECK(floordiv(r, 8).str() == "(r / 8)");
  CHECK(mod(r, 8).str() == "(r % 8)");
  CHECK(floordiv(o * 64 + r, 8).str() == "(r / 8) + 8*o");
}

TEST_CASE("index: nested divisions and remainders merge", "[index]") {
  const Expr y = var("y", 1000);
  CHECK(floordiv(floordiv(y, 4), 2).str() == "(y / 8)");
  CHECK(mod(mod(y, 12), 4).str() == "(y % 4)");
  CHECK(floordiv(y * 6, 4).str() == "(3*y / 2)");
}

TEST_CASE("index: a flat index split at a dimension boundary", "[index]") {
  // 6·x + y with y < 6: the quotient by 12 is x's by 2, the remainder
  // 6·(x mod 2) + y.
  const Expr x = var("x", 5), y = var("y", 6);
  CHECK(floordiv(x * 6 + y, 12).str() == "(x / 2)");
  CHECK(mod(x * 6 + y, 12).str() == "6*(x % 2) + y");
}

TEST_CASE("index: unravelling and ravelling again gives the index back", "[index]") {
  // B·floor(y/B) + y mod B = y, over every dimension of a [2, 3, 4] tensor.
  const Expr y = var("y", 24);
  const std::vector<Expr> index = unravel(y, std::vector<int64_t>{2, 3, 4});
  REQUIRE(index.size() == 3);
  CHECK(index[0].str() == "(y / 12)");
  // An atom's argument is parenthesized where it holds a space: a
  // remainder of a quotient prints its parentheses twice.
  CHECK(index[1].str() == "(((y / 4)) % 3)");
  CHECK(index[2].str() == "(y % 4)");
  CHECK(dot(index, contiguous_strides(std::vector<int64_t>{2, 3, 4})) == y);
  // Inner dimensions of a larger index: B·(floor(y/B) mod D) + y mod B = y mod B·D.
  const Expr big = var("y", 1000);
  CHECK((mod(floordiv(big, 4), 3) * 4 + mod(big, 4)).str() == "(y % 12)");
  // Size-1 dimensions are read at 0.
  const std::vector<Expr> ones = unravel(var("o", 8), std::vector<int64_t>{1, 8, 1});
  CHECK(ones[0].str() == "0");
  CHECK(ones[1].str() == "o");
  CHECK(ones[2].str() == "0");
  CHECK(contiguous_strides(std::vector<int64_t>{2, 3, 4}) == std::vector<int64_t>{12, 4, 1});
  CHECK(dot({var("o", 4), var("r", 8)}, {1, 4}, 10).str() == "o + 4*r + 10");
}

TEST_CASE("index: negative constants divide with floor semantics", "[index]") {
  // A cat's shifted index i - 4 (Note [Masked loads]): the argument of the
  // division printed is non-negative, the quotient floor's.
  const Expr i = var("i", 16);
  const Expr q = floordiv(i + Expr(-4), 8);
  CHECK(q.str() == "((i + 4) / 8) + -1");
  CHECK(q.lo() == -1);
  CHECK(q.hi() == 1);
  CHECK(mod(i + Expr(-4), 8).str() == "((i + 4) % 8)");
  CHECK(floordiv(Expr(-9), 4).str() == "-3");
  CHECK(mod(Expr(-9), 4).str() == "3");
}

TEST_CASE("index: which variables an expression uses, and where", "[index]") {
  const Expr o = var("o", 4), r = var("r", 64);
  const Expr e = o * 64 + floordiv(r, 8);
  CHECK(e.uses("o"));
  CHECK(e.uses("r"));
  CHECK_FALSE(e.uses("ol"));
  CHECK(e.affine_in("o"));
  CHECK_FALSE(e.affine_in("r"));
}

TEST_CASE("index: sizes over symbols print, compute and keep their values", "[index][size_symbols]") {
  const SizeExpr t = SizeExpr::symbol(0, 26), b = SizeExpr::symbol(1, 8);
  CHECK((t * 64).str() == "64*s0");
  CHECK((t * 64).value() == 1664);
  CHECK((b * t).str() == "s0*s1");
  CHECK((t * t * 2 + 3).str() == "2*s0*s0 + 3");
  CHECK((t * t * 2 + 3).value() == 2 * 26 * 26 + 3);
  CHECK((t * -1).str() == "-s0");
  CHECK((t - t) == 0);
  CHECK((t + 3).factor_str() == "(s0 + 3)");
  CHECK((t * 64).factor_str() == "64*s0");
  CHECK_FALSE(t.is_constant());
  CHECK(SizeExpr(5).is_constant());
}

TEST_CASE("index: divisibility of sizes holds for every value of the symbols", "[index][size_symbols]") {
  const SizeExpr t = SizeExpr::symbol(0, 26), b = SizeExpr::symbol(1, 8);
  REQUIRE(exact_div(b * t * 64, t * 8));
  CHECK(exact_div(b * t * 64, t * 8)->str() == "8*s1");
  CHECK(exact_div(b * t * 64, t * 8)->value() == 64);
  CHECK(exact_div(t + 3, t + 3) == SizeExpr(1));
  // 64·26 is a multiple of 13 and of 8 = s1's value, but not for every
  // value of s0 and s1: no quotient.
  CHECK_FALSE(exact_div(t * 64, 13));
  CHECK_FALSE(exact_div(t * 64, b));
  CHECK_FALSE(exact_div(t * 64 + 1, t));
  // The largest monomial dividing both, with its value.
  CHECK(gcd(t * 64, SizeExpr(48)).str() == "16");
  CHECK(gcd(t * b * 4, t * b * 6).str() == "2*s0*s1");
  CHECK(gcd(t * b * 4, t * b * 6).value() == 2 * 26 * 8);
  CHECK(gcd(SizeExpr(0), t * 3) == t * 3);
  CHECK(gcd(SizeExpr(0), SizeExpr(0)) == 0);
}

TEST_CASE("index: unravelling over symbolic sizes and ravelling again gives the index back", "[index][size_symbols]") {
  // A [B, T, 64] tensor with B and T symbols: the kernel's text divides by
  // the symbols, and the ravel identity holds whatever their values.
  const SizeExpr t = SizeExpr::symbol(0, 26), b = SizeExpr::symbol(1, 8);
  const Expr y = var("y", 8 * 26 * 64);
  const std::vector<SizeExpr> sizes = {b, t, 64};
  const std::vector<Expr> index = unravel(y, sizes);
  REQUIRE(index.size() == 3);
  CHECK(index[0].str() == "crucible_div(y, 64*s0)");
  CHECK(index[1].str() == "crucible_mod((y / 64), s0)");
  CHECK(index[2].str() == "(y % 64)");
  const std::vector<SizeExpr> strides = contiguous_strides(sizes);
  CHECK(strides[0].str() == "64*s0");
  CHECK(dot(index, strides) == y);
  // A broadcast [T, 64] operand of the same loop (a learned position
  // embedding): its row is the flat index's middle dimension.
  CHECK(dot({index[1], index[2]}, contiguous_strides(std::vector<SizeExpr>{t, 64})).str() == "crucible_mod(y, 64*s0)");
}

TEST_CASE("index: range decisions read the values being compiled", "[index][size_symbols]") {
  const SizeExpr t = SizeExpr::symbol(0, 26);
  // r over [0, 26) is below s0 = 26: its remainder is itself, its quotient 0.
  const Expr r = var("r", 26);
  CHECK(mod(r, t).str() == "r");
  CHECK(floordiv(r, t).str() == "0");
  CHECK(floordiv(var("o", 4) * t + r, t).str() == "o");
  // A value that only happens to divide (64·26 by 13) leaves an atom.
  CHECK(floordiv(var("x", 4) * (t * 64), 13).str() == "(64*s0*x / 13)");
}

TEST_CASE("index: a run-time divisor divides by multiplying where both fit 32 bits", "[index][size_symbols]") {
  // Note [Run-time divisors]: crucible_div and crucible_mod of the C++
  // prelude; an index that may reach 2^32 keeps C++'s / and %.
  const SizeExpr t = SizeExpr::symbol(0, 26);
  CHECK(floordiv(var("y", 1000), t).str() == "crucible_div(y, s0)");
  CHECK(mod(var("y", 1000), t * 3).str() == "crucible_mod(y, 3*s0)");
  const Expr big = var("y", int64_t{1} << 33);
  CHECK(floordiv(big, t).str() == "(y / s0)");
  CHECK(mod(big, t * 3).str() == "(y % (3*s0))");
}
