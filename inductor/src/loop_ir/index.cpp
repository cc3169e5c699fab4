#include "loop_ir/index.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>

namespace crucible::inductor::detail {

struct Atom {
  enum Kind { Var, FloorDiv, Mod } kind = Var;
  std::string name;  // Var
  Expr arg;          // FloorDiv, Mod
  SizeExpr divisor = 1;
  int64_t lo = 0, hi = 0;
  std::string text;
};

namespace {

// Floor division and modulo of constants. C++'s / and % truncate, which
// differs for a negative constant; a negative constant comes from a shifted
// index (cat's `i - offset`), whose quotient must be floor's (Note [Masked
// loads] in lowering/pad_and_cat.cpp: the rendered argument of every / and % is then
// non-negative wherever the element is selected).
int64_t floor_div(int64_t a, int64_t c) { return a / c - (a % c != 0 && a < 0); }
int64_t floor_mod(int64_t a, int64_t c) { return a - floor_div(a, c) * c; }

std::shared_ptr<const Atom> make_atom(Atom::Kind kind, const Expr& arg, const SizeExpr& c) {
  auto a = std::make_shared<Atom>();
  a->kind = kind;
  a->arg = arg;
  a->divisor = c;
  if (kind == Atom::FloorDiv) {
    a->lo = floor_div(arg.lo(), c.value());
    a->hi = floor_div(arg.hi(), c.value());
  } else {
    a->lo = 0;
    a->hi = c.value() - 1;
  }
  // A divisor known only at run time divides by multiplying where the
  // operands fit 32 bits (Note [Run-time divisors] in
  // codegen/preludes/cpu.h).
  constexpr int64_t k32 = int64_t{1} << 32;
  if (!c.is_constant() && arg.lo() >= 0 && arg.hi() < k32 && c.value() < k32) {
    a->text =
        std::string(kind == Atom::FloorDiv ? "crucible_div(" : "crucible_mod(") + arg.str() + ", " + c.str() + ")";
    return a;
  }
  std::string text = arg.str();
  if (text.find(' ') != std::string::npos) text = "(" + text + ")";
  // A divisor that is a product or a sum is parenthesized: C++'s / and %
  // bind as tightly as *.
  std::string divisor = c.str();
  if (divisor.find_first_of(" *") != std::string::npos) divisor = "(" + divisor + ")";
  a->text = "(" + text + (kind == Atom::FloorDiv ? " / " : " % ") + divisor + ")";
  return a;
}

// a / b for a b that divides a for every value of the symbols.
SizeExpr divided(const SizeExpr& a, const SizeExpr& b) {
  std::optional<SizeExpr> q = exact_div(a, b);
  TORCH_INTERNAL_ASSERT(q, "index: ", b.str(), " does not divide ", a.str());
  return *q;
}

// The term of `k`·atom that (k·atom) mod c keeps: k's remainder when both
// are constants, 0 when c divides k, else k itself (which mod c still
// reduces as a whole).
SizeExpr remainder_coefficient(const SizeExpr& k, const SizeExpr& c) {
  if (k.is_constant() && c.is_constant()) return k.value() % c.value();
  return exact_div(k, c) ? SizeExpr(0) : k;
}

}  // namespace

Expr Expr::scaled_atom(const std::shared_ptr<const Atom>& a, const SizeExpr& c) {
  Expr e;
  e.add_term(a, c);
  return e;
}

Expr Expr::var(const std::string& name, int64_t extent) {
  auto a = std::make_shared<Atom>();
  a->kind = Atom::Var;
  a->name = name;
  a->lo = 0;
  a->hi = std::max<int64_t>(extent, 1) - 1;
  a->text = name;
  Expr e;
  // A variable of extent 1 is always 0; one of extent 0 stays a variable
  // (its loop never runs, but nothing may be hoisted out of it).
  if (extent == 1) return e;
  e.add_term(a, 1);
  return e;
}

void Expr::add_term(const std::shared_ptr<const Atom>& a, const SizeExpr& c) {
  if (c == 0) return;
  auto it = std::lower_bound(terms_.begin(), terms_.end(), a->text,
                             [](const auto& t, const std::string& s) { return t.first->text < s; });
  if (it != terms_.end() && it->first->text == a->text) {
    it->second = it->second + c;
    if (it->second == 0) terms_.erase(it);
  } else {
    terms_.insert(it, {a, c});
  }
}

// c·B·floor(Y / B) + c·(Y mod B) = c·Y: what unravelling a flat index and
// ravelling it again with the same sizes leaves behind; and
// c·B·(floor(Y / B) mod D) + c·(Y mod B) = c·(Y mod B·D): what is left of
// it when the unravelled dimensions were inner ones of a larger index.
void Expr::normalize() {
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < terms_.size() && !changed; ++i) {
      const std::shared_ptr<const Atom> m = terms_[i].first;
      const SizeExpr k = terms_[i].second;
      if (m->kind != Atom::Mod) continue;
      Expr quotient = floordiv(m->arg, m->divisor);
      if (quotient.terms_.size() != 1 || !(quotient.constant_ == 0) || !(quotient.terms_[0].second == 1)) continue;
      const std::string& qtext = quotient.terms_[0].first->text;
      for (size_t j = 0; j < terms_.size(); ++j) {
        const SizeExpr kj = terms_[j].second;
        if (!(kj == k * m->divisor)) continue;
        const std::shared_ptr<const Atom> other = terms_[j].first;
        Expr merged;
        if (other->text == qtext)
          merged = m->arg * k;
        else if (other->kind == Atom::Mod && other->arg.str() == qtext)
          merged = mod(m->arg, m->divisor * other->divisor) * k;
        else
          continue;
        add_term(m, k * -1);
        add_term(other, kj * -1);
        *this = *this + merged;
        changed = true;
        break;
      }
    }
  }
}

Expr operator+(const Expr& a, const Expr& b) {
  Expr r = a;
  r.constant_ = r.constant_ + b.constant_;
  for (const auto& [atom, c] : b.terms_) r.add_term(atom, c);
  r.normalize();
  return r;
}

Expr operator*(const Expr& a, const SizeExpr& c) {
  Expr r;
  if (c == 0) return r;
  r.constant_ = a.constant_ * c;
  for (const auto& [atom, k] : a.terms_) r.terms_.push_back({atom, k * c});
  return r;
}

namespace {

using Terms = std::vector<std::pair<std::shared_ptr<const Atom>, SizeExpr>>;

SizeExpr gcd_of(const SizeExpr& constant, const Terms& terms, const SizeExpr& c) {
  SizeExpr g = gcd(constant, c);
  for (const auto& t : terms) g = gcd(g, t.second);
  return g;
}

// rest = g·big + small with 0 <= small < g, g the gcd of the largest
// coefficients: floor(rest / c) = floor(big / (c/g)) and rest mod c =
// g·(big mod (c/g)) + small when g divides c (a flat index split at a
// dimension boundary). False when no such split exists.
bool split(const SizeExpr& constant, const Terms& terms, const SizeExpr& c, SizeExpr& g, Expr& big, Expr& small) {
  Terms sorted = terms;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.second.value() > b.second.value(); });
  for (size_t p = 1; p < sorted.size(); ++p) {
    SizeExpr gp = 0;
    for (size_t i = 0; i < p; ++i) gp = gcd(gp, sorted[i].second);
    if (gp.value() <= 1 || !exact_div(c, gp)) continue;
    Expr b, s(constant);
    for (size_t i = 0; i < p; ++i) b = b + Expr::scaled_atom(sorted[i].first, divided(sorted[i].second, gp));
    for (size_t i = p; i < sorted.size(); ++i) s = s + Expr::scaled_atom(sorted[i].first, sorted[i].second);
    if (s.lo() >= 0 && s.hi() < gp.value()) {
      g = gp;
      big = b;
      small = s;
      return true;
    }
  }
  return false;
}

}  // namespace

Expr floordiv(const Expr& a, const SizeExpr& c) {
  TORCH_INTERNAL_ASSERT(c.value() > 0, "index: division by ", c.str());
  if (c == 1) return a;
  if (a.lo() >= 0 && a.hi() < c.value()) return Expr();
  // a = c·q + rest with every coefficient of rest below c's multiples.
  Expr q, rest;
  if (a.constant_.is_constant() && c.is_constant()) {
    q.constant_ = floor_div(a.constant_.value(), c.value());
    rest.constant_ = floor_mod(a.constant_.value(), c.value());
  } else if (std::optional<SizeExpr> k = exact_div(a.constant_, c)) {
    q.constant_ = *k;
  } else {
    rest.constant_ = a.constant_;
  }
  for (const auto& [atom, k] : a.terms_) {
    if (std::optional<SizeExpr> kq = exact_div(k, c))
      q.add_term(atom, *kq);
    else
      rest.add_term(atom, k);
  }
  if (rest.lo() >= 0 && rest.hi() < c.value()) return q;
  SizeExpr sg = 1;
  Expr big, small;
  if (split(rest.constant_, rest.terms_, c, sg, big, small)) return q + floordiv(big, divided(c, sg));
  // floor(g·x / c) = floor(x / (c/g)) when g divides c and every coefficient.
  const SizeExpr g = gcd_of(rest.constant_, rest.terms_, c);
  if (g.value() > 1) {
    Expr reduced;
    reduced.constant_ = divided(rest.constant_, g);
    for (const auto& [atom, k] : rest.terms_) reduced.add_term(atom, divided(k, g));
    return q + floordiv(reduced, divided(c, g));
  }
  // floor(floor(y / d) / c) = floor(y / (d·c)).
  if (rest.constant_ == 0 && rest.terms_.size() == 1 && rest.terms_[0].second == 1 &&
      rest.terms_[0].first->kind == Atom::FloorDiv) {
    const Atom& inner = *rest.terms_[0].first;
    return q + floordiv(inner.arg, inner.divisor * c);
  }
  Expr r = q;
  r.add_term(make_atom(Atom::FloorDiv, rest, c), 1);
  r.normalize();
  return r;
}

Expr mod(const Expr& a, const SizeExpr& c) {
  TORCH_INTERNAL_ASSERT(c.value() > 0, "index: remainder by ", c.str());
  if (c == 1) return Expr();
  Expr rest;
  rest.constant_ = a.constant_.is_constant() && c.is_constant() ? SizeExpr(floor_mod(a.constant_.value(), c.value()))
                                                                : remainder_coefficient(a.constant_, c);
  for (const auto& [atom, k] : a.terms_) rest.add_term(atom, remainder_coefficient(k, c));
  if (rest.lo() >= 0 && rest.hi() < c.value()) return rest;
  SizeExpr sg = 1;
  Expr big, small;
  if (split(rest.constant_, rest.terms_, c, sg, big, small)) return mod(big, divided(c, sg)) * sg + small;
  const SizeExpr g = gcd_of(rest.constant_, rest.terms_, c);
  if (g.value() > 1) {
    Expr reduced;
    reduced.constant_ = divided(rest.constant_, g);
    for (const auto& [atom, k] : rest.terms_) reduced.add_term(atom, divided(k, g));
    return mod(reduced, divided(c, g)) * g;
  }
  // (y mod d) mod c = y mod c when c divides d.
  if (rest.constant_ == 0 && rest.terms_.size() == 1 && rest.terms_[0].second == 1 &&
      rest.terms_[0].first->kind == Atom::Mod && exact_div(rest.terms_[0].first->divisor, c))
    return mod(rest.terms_[0].first->arg, c);
  Expr r;
  r.add_term(make_atom(Atom::Mod, rest, c), 1);
  return r;
}

int64_t Expr::lo() const {
  int64_t v = constant_.value();
  for (const auto& [atom, k] : terms_) v += k.value() > 0 ? k.value() * atom->lo : k.value() * atom->hi;
  return v;
}

int64_t Expr::hi() const {
  int64_t v = constant_.value();
  for (const auto& [atom, k] : terms_) v += k.value() > 0 ? k.value() * atom->hi : k.value() * atom->lo;
  return v;
}

bool Expr::uses(const std::string& name) const {
  for (const auto& [atom, k] : terms_) {
    if (atom->kind == Atom::Var ? atom->name == name : atom->arg.uses(name)) return true;
  }
  return false;
}

bool Expr::affine_in(const std::string& name) const {
  for (const auto& [atom, k] : terms_)
    if (atom->kind != Atom::Var && atom->arg.uses(name)) return false;
  return true;
}

std::string Expr::str() const {
  std::string s;
  for (const auto& [atom, k] : terms_) {
    if (!s.empty()) s += " + ";
    if (!(k == 1)) s += k.factor_str() + "*";
    s += atom->text;
  }
  if (!(constant_ == 0) || s.empty()) s += (s.empty() ? "" : " + ") + constant_.str();
  return s;
}

std::vector<Expr> unravel(const Expr& flat, const std::vector<SizeExpr>& sizes) {
  std::vector<Expr> idx(sizes.size());
  SizeExpr stride = 1;
  for (size_t k = sizes.size(); k-- > 0;) {
    // (A size-0 tensor has no elements: any index is as good, but it must
    // keep mentioning the loop variable.)
    const int64_t n = sizes[k].value();
    idx[k] = n == 1 ? Expr() : n == 0 ? floordiv(flat, stride) : mod(floordiv(flat, stride), sizes[k]);
    if (n != 0) stride = stride * sizes[k];
  }
  return idx;
}

std::vector<Expr> unravel(const Expr& flat, const std::vector<int64_t>& sizes) { return unravel(flat, spelled(sizes)); }

Expr dot(const std::vector<Expr>& index, const std::vector<SizeExpr>& strides, const SizeExpr& offset) {
  Expr e(offset);
  for (size_t k = 0; k < index.size(); ++k) e = e + index[k] * strides[k];
  return e;
}

Expr dot(const std::vector<Expr>& index, const std::vector<int64_t>& strides, int64_t offset) {
  return dot(index, spelled(strides), spelled(offset));
}

std::vector<SizeExpr> contiguous_strides(const std::vector<SizeExpr>& sizes) {
  std::vector<SizeExpr> s(sizes.size());
  SizeExpr acc = 1;
  for (size_t k = sizes.size(); k-- > 0;) {
    s[k] = acc;
    if (sizes[k].value() != 0) acc = acc * sizes[k];
  }
  return s;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> s(sizes.size());
  int64_t acc = 1;
  for (size_t k = sizes.size(); k-- > 0;) {
    s[k] = acc;
    acc *= std::max<int64_t>(sizes[k], 1);
  }
  return s;
}

}  // namespace crucible::inductor::detail
