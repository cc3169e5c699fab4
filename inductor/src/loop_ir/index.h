// Private: symbolic index expressions of the loop-level IR, with the
// simplifications that turn views and broadcasts back into plain strided
// indexing (the part of sympy that torch/_inductor/sizevars.py relies on).
#pragma once

#include "loop_ir/size_expr.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace crucible::inductor::detail {

struct Atom;

/// An integer index expression in normal form: constant + Σ coeff·atom, where
/// an atom is a loop variable, floor(e / c) or e mod c (c > 0), and the
/// constant, the coefficients and the divisors are sizes over size symbols
/// (Note [Size symbols]). Every expression a kernel indexes with is
/// non-negative (loop variables start at 0, strides are non-negative), so
/// C++'s `/` and `%` are floor division and modulo on it. Terms are kept
/// sorted by the atom's text and never have a zero coefficient, so equal
/// expressions have equal text.
class Expr {
 public:
  Expr() = default;
  Expr(int64_t c) : constant_(c) {}          // NOLINT: constants read as expressions
  Expr(const SizeExpr& c) : constant_(c) {}  // NOLINT: and so do sizes

  /// The loop variable `name` ranging over [0, extent).
  static Expr var(const std::string& name, int64_t extent);
  /// c·a.
  static Expr scaled_atom(const std::shared_ptr<const Atom>& a, const SizeExpr& c);

  friend Expr operator+(const Expr& a, const Expr& b);
  friend Expr operator*(const Expr& a, const SizeExpr& c);
  /// floor(a / c), c > 0: multiples of c leave the division, a remainder
  /// whose range lies in [0, c) vanishes, nested divisions merge.
  friend Expr floordiv(const Expr& a, const SizeExpr& c);
  /// a mod c, c > 0: multiples of c vanish, a remainder already in [0, c)
  /// stays as it is.
  friend Expr mod(const Expr& a, const SizeExpr& c);

  /// Smallest and largest value over the variables' ranges, at the sizes
  /// being compiled.
  int64_t lo() const;
  int64_t hi() const;
  bool is_constant() const { return terms_.empty(); }
  /// True when the expression mentions the variable `name`.
  bool uses(const std::string& name) const;
  /// True when `name` appears only as a term of its own (c·name), never
  /// inside a quotient or remainder: the expression steps by a constant as
  /// `name` counts.
  bool affine_in(const std::string& name) const;
  /// C++ text, e.g. `64*o + r` or `(((o / 8)) % 4)`.
  std::string str() const;
  bool operator==(const Expr& o) const { return str() == o.str(); }

 private:
  void add_term(const std::shared_ptr<const Atom>& a, const SizeExpr& c);
  void normalize();

  SizeExpr constant_;
  std::vector<std::pair<std::shared_ptr<const Atom>, SizeExpr>> terms_;
};

/// The multi-index of the row-major position `flat` in a tensor of `sizes`
/// (integer sizes as spelled() spells them).
std::vector<Expr> unravel(const Expr& flat, const std::vector<SizeExpr>& sizes);
std::vector<Expr> unravel(const Expr& flat, const std::vector<int64_t>& sizes);

/// Σ index[k]·strides[k] (+ offset) (integers as spelled() spells them).
Expr dot(const std::vector<Expr>& index, const std::vector<SizeExpr>& strides, const SizeExpr& offset = 0);
Expr dot(const std::vector<Expr>& index, const std::vector<int64_t>& strides, int64_t offset = 0);

/// Row-major strides of `sizes`.
std::vector<SizeExpr> contiguous_strides(const std::vector<SizeExpr>& sizes);
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes);

}  // namespace crucible::inductor::detail
