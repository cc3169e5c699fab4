// Lowering of views: a change of index folded into the readers' index
// expressions, never a copy (Note [Lowering]).
#include "lowering/lowerer.h"

#include <algorithm>
#include <functional>

namespace crucible::inductor::detail {

void Lowerer::lower_view(const ir::Node* n) {
  const ir::Value* base = n->arg(0).value();
  Lazy in = lazy_.at(base);
  const std::string& t = n->target();
  const std::vector<int64_t>& is = in.sizes;
  for (size_t k = 0; k < n->num_results(); ++k) {
    const ir::Value* out = n->result(k);
    const std::vector<int64_t>& os = out->meta().sizes;
    std::function<std::vector<Expr>(const std::vector<Expr>&)> map;
    if (t == "aten::view" || t == "aten::_unsafe_view" || t == "aten::reshape") {
      map = [in_sizes = spelled_sizes(base, is), out_strides = contiguous_strides(spelled_sizes(out, os))](
                const std::vector<Expr>& i) { return unravel(dot(i, out_strides), in_sizes); };
    } else if (t == "aten::expand") {
      map = [is](const std::vector<Expr>& i) { return broadcast(is, i); };
    } else if (t == "aten::permute" || t == "aten::transpose.int" || t == "aten::t") {
      std::vector<int64_t> perm(is.size());
      for (size_t d = 0; d < perm.size(); ++d) perm[d] = static_cast<int64_t>(d);
      if (t == "aten::permute") {
        auto p = n->arg(1).constant().toIntVector();
        for (size_t d = 0; d < p.size(); ++d) perm[d] = wrap_dim(p[d], is.size());
      } else if (is.size() == 2 || t == "aten::transpose.int") {
        int64_t a = t == "aten::t" ? 0 : wrap_dim(n->arg(1).constant().toInt(), is.size());
        int64_t b = t == "aten::t" ? 1 : wrap_dim(n->arg(2).constant().toInt(), is.size());
        if (!is.empty()) std::swap(perm[a], perm[b]);
      }
      map = [perm](const std::vector<Expr>& i) {
        std::vector<Expr> r(perm.size());
        for (size_t d = 0; d < perm.size(); ++d) r[perm[d]] = i[d];
        return r;
      };
    } else if (t == "aten::unsqueeze" || t == "aten::squeeze.dim" || t == "aten::squeeze.dims" ||
               t == "aten::squeeze") {
      if (t == "aten::unsqueeze") {
        int64_t d0 = wrap_dim(n->arg(1).constant().toInt(), os.size());
        map = [d0](const std::vector<Expr>& i) {
          std::vector<Expr> r;
          for (size_t d = 0; d < i.size(); ++d)
            if (static_cast<int64_t>(d) != d0) r.push_back(i[d]);
          return r;
        };
      } else {
        std::vector<bool> dropped(is.size(), false);
        if (t == "aten::squeeze") {
          for (size_t d = 0; d < is.size(); ++d) dropped[d] = is[d] == 1;
        } else {
          const c10::IValue& a = n->arg(1).constant();
          std::vector<int64_t> ds = a.isInt() ? std::vector<int64_t>{a.toInt()} : a.toIntVector();
          for (int64_t d : ds) {
            int64_t w = wrap_dim(d, is.size());
            if (w < static_cast<int64_t>(is.size()) && is[w] == 1) dropped[w] = true;
          }
        }
        map = [dropped](const std::vector<Expr>& i) {
          std::vector<Expr> r(dropped.size());
          size_t j = 0;
          for (size_t d = 0; d < dropped.size(); ++d) r[d] = dropped[d] ? Expr() : i[j++];
          return r;
        };
      }
    } else if (t == "aten::slice.Tensor" || t == "aten::split.Tensor" || t == "aten::split_with_sizes") {
      int64_t dim = 0, start = 0, step = 1;
      if (t == "aten::slice.Tensor") {
        dim = wrap_dim(n->arg(1).constant().toInt(), is.size());
        const c10::IValue& s = n->arg(2).constant();
        start = s.isNone() ? 0 : s.toInt();
        if (start < 0) start += is[dim];
        start = std::clamp<int64_t>(start, 0, is[dim]);
        step = n->arg(4).constant().toInt();
      } else {
        dim = wrap_dim(n->arg(2).constant().toInt(), is.size());
        for (size_t j = 0; j < k; ++j) start += n->result(j)->meta().sizes[dim];
      }
      map = [dim, start, step](const std::vector<Expr>& i) {
        std::vector<Expr> r = i;
        r[dim] = i[dim] * step + Expr(spelled(start));
        return r;
      };
    } else if (t == "aten::select.int" || t == "aten::unbind.int") {
      int64_t dim = wrap_dim(n->arg(1).constant().toInt(), is.size());
      int64_t index = t == "aten::unbind.int" ? static_cast<int64_t>(k) : n->arg(2).constant().toInt();
      if (index < 0) index += is[dim];
      map = [dim, index](const std::vector<Expr>& i) {
        std::vector<Expr> r = i;
        r.insert(r.begin() + dim, Expr(spelled(index)));
        return r;
      };
    } else {  // alias, detach, lift_fresh
      map = [](const std::vector<Expr>& i) { return i; };
    }
    Lazy l;
    l.sizes = os;
    l.dtype = out->meta().dtype;
    l.ops = in.ops;
    l.nodes = in.nodes;
    l.view = true;
    l.base = base;
    PointwiseFn f = in.fn;
    l.fn = [f, map](Body& b, const std::vector<Expr>& i) { return f(b, map(i)); };
    define_lazy(out, std::move(l));
  }
  bool tensor = false;
  for (const auto& r : n->results()) tensor = tensor || needs_tensor(r.get());
  if (tensor) ensure_tensor(n->result());
}

// The buffer a value's memory belongs to (a view's is its base's).
const ir::Value* Lowerer::root(const ir::Value* v) const {
  auto it = lazy_.find(v);
  while (it != lazy_.end() && it->second.view && it->second.base) {
    v = it->second.base;
    it = lazy_.find(v);
  }
  return v;
}

}  // namespace crucible::inductor::detail
