// Private: sizes over size symbols, the integers of index expressions
// (loop_ir/index.h) — torch/_inductor/sizevars.py's sympy integers over
// s0, s1, ... with their size hints.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace crucible::ir {
class Value;
}

namespace crucible::inductor::detail {

/// Note [Size symbols]
/// A size, stride or offset of a lowered graph: a polynomial with integer
/// coefficients over size symbols s0, s1, ..., each standing for a
/// dimension whose size a kernel takes as an argument instead of as a
/// literal, together with its value at the sizes being compiled (the
/// symbols' values). Decisions read value() (a range check, a threshold);
/// kernel text renders str(). The simplifications that need one size to
/// divide another (exact_div, gcd) hold for every value of the symbols;
/// those that compare values (a remainder within its divisor's range) hold
/// at the sizes being compiled. A kernel's text is therefore right for the
/// symbol values its graph was lowered with; two lowerings at other sizes
/// that print the same text each vouch for their own values, which is what
/// lets them share one compiled kernel. A constant is a polynomial without
/// symbols.
class SizeExpr {
 public:
  SizeExpr(int64_t c = 0);  // NOLINT: constants read as sizes

  /// The symbol `s<index>`, whose value at the sizes being compiled is
  /// `value`.
  static SizeExpr symbol(int index, int64_t value);

  /// The value at the sizes being compiled.
  int64_t value() const { return value_; }
  /// True when no symbol appears.
  bool is_constant() const;
  /// C++ text over the symbols, e.g. `64*s0 + 3`, `s0*s1`, `-2*s1`, `7`.
  std::string str() const;
  /// str(), parenthesized when it holds more than one term.
  std::string factor_str() const;

  friend SizeExpr operator+(const SizeExpr& a, const SizeExpr& b);
  friend SizeExpr operator-(const SizeExpr& a, const SizeExpr& b);
  friend SizeExpr operator*(const SizeExpr& a, const SizeExpr& b);
  /// a / b where b divides a for every value of the symbols: b a nonzero
  /// monomial dividing every term of a, or a itself; nullopt otherwise.
  friend std::optional<SizeExpr> exact_div(const SizeExpr& a, const SizeExpr& b);
  /// The largest monomial with a positive coefficient dividing both for
  /// every value of the symbols: the coefficients' gcd times each symbol
  /// to its lowest power; gcd(0, b) is b's (as std::gcd's).
  friend SizeExpr gcd(const SizeExpr& a, const SizeExpr& b);

  /// The same polynomial (and so the same value).
  friend bool operator==(const SizeExpr& a, const SizeExpr& b) { return a.terms_ == b.terms_; }

 private:
  // A product of symbols: (symbol index, exponent) pairs, sorted by index.
  using Monomial = std::vector<std::pair<int, int>>;
  void add_term(const Monomial& m, int64_t c);
  // Adds the symbol values `o` knows to this one's.
  void merge_values(const SizeExpr& o);

  std::vector<std::pair<Monomial, int64_t>> terms_;  // sorted by monomial; no zero coefficient
  std::vector<std::pair<int, int64_t>> symbols_;     // (index, value) of the symbols it was made of, sorted
  int64_t value_ = 0;
};

/// A tensor's sizes and strides, spelled.
struct SpelledLayout {
  std::vector<SizeExpr> sizes, strides;
};

/// The spellings of a graph's sizes while it is lowered and rendered
/// (Note [Dynamic sizes] in dynamic_sizes.cpp): each tensor's sizes and
/// strides (its layout), and, for the integers no tensor names, the
/// polynomial over the size symbols that a value some tensor's size or
/// element count takes at the sizes being compiled stands for, unless two
/// different polynomials take that value: such a value, and any other, is
/// a literal.
class SizeTable {
 public:
  /// Records `e` as a spelling of e.value().
  void add(const SizeExpr& e);
  /// The spelling of `v`: the one recorded, else the literal v.
  SizeExpr spell(int64_t v) const;
  /// Records the layout of the tensor `v`, the `position`-th value of its
  /// graph (what str() names it by).
  void add_layout(const ir::Value* v, size_t position, SpelledLayout layout);
  /// The layout recorded for `v`; null when none was.
  const SpelledLayout* layout(const ir::Value* v) const;
  /// The recorded spellings, one per line ("1664 = 64*s0", ambiguous
  /// values left out), then the symbolic layouts by value position: what
  /// the kernels' text depends on, for a cache key.
  std::string str() const;

  /// The symbols' values at the sizes being compiled, s0's first: what
  /// the kernels are called with. Empty: every size is a literal.
  std::vector<int64_t> symbol_values;

 private:
  std::map<int64_t, std::optional<SizeExpr>> spellings_;  // nullopt: two spellings claim the value
  std::unordered_map<const ir::Value*, SpelledLayout> layouts_;
  std::map<size_t, std::string> layout_text_;  // by position: the symbolic layouts, printed
};

/// The spelling of `v` in the table in force on this thread (SizeScope),
/// or the literal v without one: what the loop IR's sizes become in
/// expressions and kernel text, as torch/_inductor reads them through
/// V.graph.sizevars.
SizeExpr spelled(int64_t v);
/// spelled() of each.
std::vector<SizeExpr> spelled(const std::vector<int64_t>& v);

/// `sizes`, those of the tensor `v`, as spelled: v's spelled layout's in
/// the table in force where they have those values, else each as spelled()
/// spells it.
std::vector<SizeExpr> spelled_sizes(const ir::Value* v, const std::vector<int64_t>& sizes);

/// `strides`, those of the tensor `v`, as v's spelled layout in the table
/// in force has them; nullopt where it has no such strides.
std::optional<std::vector<SizeExpr>> layout_strides(const ir::Value* v, const std::vector<int64_t>& strides);

/// Puts a table in force on this thread for the scope's lifetime (the
/// previous one comes back after it).
class SizeScope {
 public:
  explicit SizeScope(const SizeTable& table);
  ~SizeScope();
  /// The table in force on this thread; null when none is.
  static const SizeTable* current();
  SizeScope(const SizeScope&) = delete;
  SizeScope& operator=(const SizeScope&) = delete;

 private:
  const SizeTable* previous_;
};

}  // namespace crucible::inductor::detail
