#include "loop_ir/size_expr.h"

#include <algorithm>
#include <numeric>

namespace crucible::inductor::detail {

SizeExpr::SizeExpr(int64_t c) : value_(c) {
  if (c != 0) terms_.push_back({{}, c});
}

SizeExpr SizeExpr::symbol(int index, int64_t value) {
  SizeExpr s;
  s.terms_.push_back({{{index, 1}}, 1});
  s.symbols_.push_back({index, value});
  s.value_ = value;
  return s;
}

bool SizeExpr::is_constant() const { return terms_.empty() || (terms_.size() == 1 && terms_[0].first.empty()); }

void SizeExpr::add_term(const Monomial& m, int64_t c) {
  if (c == 0) return;
  auto it =
      std::lower_bound(terms_.begin(), terms_.end(), m, [](const auto& t, const Monomial& k) { return t.first < k; });
  if (it != terms_.end() && it->first == m) {
    it->second += c;
    if (it->second == 0) terms_.erase(it);
  } else {
    terms_.insert(it, {m, c});
  }
}

void SizeExpr::merge_values(const SizeExpr& o) {
  for (const auto& v : o.symbols_) {
    auto it = std::lower_bound(symbols_.begin(), symbols_.end(), v);
    if (it == symbols_.end() || it->first != v.first) symbols_.insert(it, v);
  }
}

SizeExpr operator+(const SizeExpr& a, const SizeExpr& b) {
  SizeExpr r = a;
  r.merge_values(b);
  for (const auto& [m, c] : b.terms_) r.add_term(m, c);
  r.value_ = a.value_ + b.value_;
  return r;
}

SizeExpr operator-(const SizeExpr& a, const SizeExpr& b) { return a + b * SizeExpr(-1); }

SizeExpr operator*(const SizeExpr& a, const SizeExpr& b) {
  SizeExpr r;
  for (const auto& [ma, ca] : a.terms_) {
    for (const auto& [mb, cb] : b.terms_) {
      SizeExpr::Monomial m = ma;
      for (const auto& [s, e] : mb) {
        auto it = std::lower_bound(m.begin(), m.end(), s, [](const auto& p, int k) { return p.first < k; });
        if (it != m.end() && it->first == s)
          it->second += e;
        else
          m.insert(it, {s, e});
      }
      r.add_term(m, ca * cb);
    }
  }
  r.symbols_ = a.symbols_;
  r.merge_values(b);
  r.value_ = a.value_ * b.value_;
  return r;
}

std::optional<SizeExpr> exact_div(const SizeExpr& a, const SizeExpr& b) {
  if (a == b && !b.terms_.empty()) return SizeExpr(1);
  if (b.terms_.size() != 1) return std::nullopt;
  const auto& [mb, cb] = b.terms_[0];
  SizeExpr r;
  for (const auto& [ma, ca] : a.terms_) {
    if (ca % cb != 0) return std::nullopt;
    SizeExpr::Monomial m;
    size_t j = 0;
    for (const auto& [s, e] : ma) {
      int left = e;
      if (j < mb.size() && mb[j].first == s) left -= mb[j++].second;
      if (left < 0) return std::nullopt;
      if (left > 0) m.push_back({s, left});
    }
    if (j != mb.size()) return std::nullopt;  // a symbol of b that a's term lacks
    r.add_term(m, ca / cb);
  }
  r.symbols_ = a.symbols_;
  r.value_ = a.value_ / b.value_;
  return r;
}

SizeExpr gcd(const SizeExpr& a, const SizeExpr& b) {
  int64_t content = 0;
  std::optional<SizeExpr::Monomial> common;
  for (const SizeExpr* e : {&a, &b}) {
    for (const auto& [m, c] : e->terms_) {
      content = std::gcd(content, c);
      if (!common) {
        common = m;
        continue;
      }
      SizeExpr::Monomial both;
      for (const auto& [s, x] : *common) {
        auto it = std::find_if(m.begin(), m.end(), [s = s](const auto& p) { return p.first == s; });
        if (it != m.end()) both.push_back({s, std::min(x, it->second)});
      }
      common = both;
    }
  }
  if (content == 0) return SizeExpr(0);
  SizeExpr g(content);
  g.symbols_ = a.symbols_;
  g.merge_values(b);
  for (const auto& [s, x] : *common) {
    const auto v = std::lower_bound(g.symbols_.begin(), g.symbols_.end(), std::pair<int, int64_t>{s, 0});
    for (int k = 0; k < x; ++k) g.value_ *= v->second;
  }
  g.terms_[0].first = *common;
  return g;
}

std::string SizeExpr::str() const {
  std::string out;
  auto term = [](const Monomial& m, int64_t c) {
    std::string t;
    if (m.empty() || (c != 1 && c != -1)) t = std::to_string(c);
    if (!m.empty() && c == -1) t = "-";
    for (const auto& [s, e] : m) {
      for (int k = 0; k < e; ++k) t += (t.empty() || t == "-" ? "" : "*") + std::string("s") + std::to_string(s);
    }
    return t;
  };
  // Symbolic terms first, the constant last: "64*s0 + 3".
  for (const auto& [m, c] : terms_)
    if (!m.empty()) out += (out.empty() ? "" : " + ") + term(m, c);
  if (!terms_.empty() && terms_[0].first.empty()) out += (out.empty() ? "" : " + ") + term({}, terms_[0].second);
  return out.empty() ? "0" : out;
}

std::string SizeExpr::factor_str() const { return terms_.size() > 1 ? "(" + str() + ")" : str(); }

void SizeTable::add(const SizeExpr& e) {
  // 0 and 1 are never symbols' values (specialized): a size of either is a
  // literal wherever it comes from.
  if (e.value() == 0 || e.value() == 1) return;
  auto [it, fresh] = spellings_.emplace(e.value(), e);
  if (!fresh && it->second && !(*it->second == e)) it->second.reset();
}

SizeExpr SizeTable::spell(int64_t v) const {
  auto it = spellings_.find(v);
  return it != spellings_.end() && it->second ? *it->second : SizeExpr(v);
}

void SizeTable::add_layout(const ir::Value* v, size_t position, SpelledLayout layout) {
  std::string text;
  bool symbolic = false;
  for (const std::vector<SizeExpr>* list : {&layout.sizes, &layout.strides}) {
    text += text.empty() ? "[" : "] [";
    for (size_t i = 0; i < list->size(); ++i) {
      text += (i ? ", " : "") + (*list)[i].str();
      symbolic |= !(*list)[i].is_constant();
    }
  }
  if (symbolic) layout_text_[position] = text + "]";
  layouts_[v] = std::move(layout);
}

const SpelledLayout* SizeTable::layout(const ir::Value* v) const {
  auto it = layouts_.find(v);
  return it == layouts_.end() ? nullptr : &it->second;
}

std::string SizeTable::str() const {
  std::string out;
  for (const auto& [v, e] : spellings_)
    if (e && !e->is_constant()) out += std::to_string(v) + " = " + e->str() + "\n";
  for (const auto& [position, text] : layout_text_) out += "value " + std::to_string(position) + ": " + text + "\n";
  return out;
}

namespace {
thread_local const SizeTable* current_table = nullptr;
}  // namespace

SizeExpr spelled(int64_t v) { return current_table ? current_table->spell(v) : SizeExpr(v); }

std::vector<SizeExpr> spelled(const std::vector<int64_t>& v) {
  std::vector<SizeExpr> out;
  out.reserve(v.size());
  for (int64_t x : v) out.push_back(spelled(x));
  return out;
}

namespace {

bool same_values(const std::vector<SizeExpr>& spelled, const std::vector<int64_t>& values) {
  return spelled.size() == values.size() && std::equal(spelled.begin(), spelled.end(), values.begin(),
                                                       [](const SizeExpr& e, int64_t v) { return e.value() == v; });
}

const SpelledLayout* layout_in_force(const ir::Value* v) {
  return current_table && v ? current_table->layout(v) : nullptr;
}

}  // namespace

std::vector<SizeExpr> spelled_sizes(const ir::Value* v, const std::vector<int64_t>& sizes) {
  if (const SpelledLayout* l = layout_in_force(v); l && same_values(l->sizes, sizes)) return l->sizes;
  return spelled(sizes);
}

std::optional<std::vector<SizeExpr>> layout_strides(const ir::Value* v, const std::vector<int64_t>& strides) {
  if (const SpelledLayout* l = layout_in_force(v); l && same_values(l->strides, strides)) return l->strides;
  return std::nullopt;
}

SizeScope::SizeScope(const SizeTable& table) : previous_(current_table) { current_table = &table; }

SizeScope::~SizeScope() { current_table = previous_; }

const SizeTable* SizeScope::current() { return current_table; }

}  // namespace crucible::inductor::detail
