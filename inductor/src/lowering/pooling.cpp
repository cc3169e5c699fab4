// Lowering of max_pool2d_with_indices and, on a GPU, its backward (Note
// [Max pooling]).
#include "lowering/lowerer.h"
#include "lowering/pointwise_table.h"

#include <algorithm>
#include <utility>

namespace crucible::inductor::detail {

// The window of max_pool2d_with_indices(x, kernel, stride, padding,
// dilation, ceil_mode) (first = 1) or of its backward (grad, x, kernel,
// ..., indices: first = 2, indices at 7), when lowered (Note [Max
// pooling]): a float input of 3 or 4 dims, constant sizes, no dilation,
// padding within each dim.
std::optional<Lowerer::Window> Lowerer::window_of(const ir::Node* n, size_t first, size_t indices) const {
  if (n->args().size() < std::max(first + 5, indices + 1)) return std::nullopt;
  for (size_t i = 0; i < first; ++i)
    if (!n->arg(i).is_value() || !loop_tensor(n->arg(i).value()) || !is_float(n->arg(i).value()->meta().dtype))
      return std::nullopt;
  if (indices && (!n->arg(indices).is_value() || !loop_tensor(n->arg(indices).value()) ||
                  n->arg(indices).value()->meta().dtype != c10::kLong))
    return std::nullopt;
  for (size_t i = first; i < first + 5; ++i)
    if (!n->arg(i).is_constant()) return std::nullopt;
  const std::vector<int64_t>& x = n->arg(first - 1).value()->meta().sizes;
  if (x.size() != 3 && x.size() != 4) return std::nullopt;
  auto pair = [&](size_t i, int64_t fallback) -> std::optional<std::pair<int64_t, int64_t>> {
    const std::vector<int64_t> v = n->arg(i).constant().toIntVector();
    if (v.empty()) return std::make_pair(fallback, fallback);
    if (v.size() == 1) return std::make_pair(v[0], v[0]);
    if (v.size() == 2) return std::make_pair(v[0], v[1]);
    return std::nullopt;
  };
  const auto kernel = pair(first, 0);
  if (!kernel) return std::nullopt;
  const auto stride = n->arg(first + 1).constant().toIntVector().empty() ? kernel : pair(first + 1, 0);
  const auto padding = pair(first + 2, 0), dilation = pair(first + 3, 1);
  if (!stride || !padding || !dilation || *dilation != std::make_pair<int64_t, int64_t>(1, 1)) return std::nullopt;
  Window w{kernel->first, kernel->second, stride->first, stride->second, padding->first, padding->second};
  const int64_t h = x[x.size() - 2], wd = x.back();
  if (indices) {  // the backward counts the gradient's rows and columns modulo their numbers
    const std::vector<int64_t>& g = n->arg(0).value()->meta().sizes;
    if (g.size() != x.size() || g[g.size() - 2] < 1 || g.back() < 1) return std::nullopt;
  }
  if (w.kh < 1 || w.kw < 1 || w.sh < 1 || w.sw < 1 || w.ph < 0 || w.pw < 0 || w.ph > h || w.pw > wd || h < 1 || wd < 1)
    return std::nullopt;
  return w;
}

// Note [Max pooling]
// max_pool2d_with_indices is a pointwise loop over its output: element
// (oh, ow) takes the largest of its kh x kw window of x, rows then
// columns, a later element replacing it when greater or NaN, and its
// index (ih * W + iw) with it; the first element inside the input
// starts the search, as in ATen's kernels, so ties and -inf keep
// ATen's index. Positions outside the input are skipped, their loads
// sent to (i mod H) as constant_pad_nd's are, so nothing is read out of
// bounds and a pointwise producer of x fuses into the window.
// Its backward is a pointwise loop over x: element (ih, iw) sums, in
// the order of the windows, the gradient of every output whose window
// covers it and whose index names it: at most ceil(kh / sh) rows of
// outputs, counted down from floor((ih + ph) / sh), times as many
// columns. (TorchInductor lowers both the same way, without the scatter
// ATen's backward makes with atomic adds on a GPU.) On the CPU the
// backward stays ATen's: the gather's divisions and remainders of the
// index, which the vectorizer cannot take, cost more than ATen's scatter
// (0.67 against 0.13 ms a step in the ConvNet's, with ReLU's backward).
// The indices are written beside the values (the same search, in the
// same kernel) when anything reads them: the backward reads each up to
// ceil(kh / sh)·ceil(kw / sw) times, a search recomputed as often.
void Lowerer::lower_max_pool(const ir::Node* n) {
  const Window w = *window_of(n, 1, 0);
  const Lazy& in = lazy_.at(n->arg(0).value());
  const size_t rank = in.sizes.size();
  const int64_t H = in.sizes[rank - 2], W = in.sizes[rank - 1];
  const std::string T = ctype_of(in.dtype);
  // The search, for the value (want_index false) or the index.
  auto search = [in, w, rank, H, W, T](Body& b, const std::vector<Expr>& index, bool want_index) {
    const Expr &oh = index[rank - 2], &ow = index[rank - 1];
    std::string best = "-std::numeric_limits<" + T + ">::infinity()", at = "int64_t(-1)";
    int level = std::max(level_of(oh), level_of(ow));
    for (int64_t i = 0; i < w.kh; ++i)
      for (int64_t j = 0; j < w.kw; ++j) {
        const Expr ih = oh * w.sh + (i - w.ph), iw = ow * w.sw + (j - w.pw);
        std::vector<Expr> src = index;
        src[rank - 2] = mod(oh * w.sh + (i - w.ph + w.ph * H), H);
        src[rank - 1] = mod(ow * w.sw + (j - w.pw + w.pw * W), W);
        std::string inside;
        auto bound = [&](const Expr& e, int64_t size) {
          if (e.lo() < 0) inside += std::string(inside.empty() ? "" : " && ") + "(" + e.str() + ") >= 0";
          if (e.hi() >= size)
            inside += std::string(inside.empty() ? "" : " && ") + "(" + e.str() + ") < " + std::to_string(size);
        };
        bound(ih, H);
        bound(iw, W);
        const Val v = in.fn(b, src);
        level = std::max(level, v.level);
        const std::string better =
            i == 0 && j == 0 ? "true"
                             : "(" + at + " < 0 || " + v.name + " > " + best + " || " + v.name + " != " + v.name + ")";
        const Val take = b.compute(inside.empty() ? better : "(" + inside + ") && " + better, level, "bool");
        best = b.compute(take.name + " ? " + v.name + " : " + best, level, T).name;
        at = b.compute(take.name + " ? int64_t(" + (ih * W + iw).str() + ") : " + at, level, "int64_t").name;
      }
    return b.compute(want_index ? at : best, level, want_index ? "int64_t" : T);
  };
  for (size_t r = 0; r < 2; ++r) {
    const ir::Value* out = n->result(r);
    Lazy l;
    l.sizes = out->meta().sizes;
    l.dtype = out->meta().dtype;
    l.ops = in.ops * static_cast<int>(w.kh * w.kw) + 1;
    l.nodes = in.nodes;
    l.nodes.push_back(n);
    l.fn = [search, r](Body& b, const std::vector<Expr>& index) { return search(b, index, r == 1); };
    define_lazy(out, std::move(l));
    if (r == 1 && !out->users().empty())
      realize(out);
    else
      realize_if_costly(out);
  }
}

void Lowerer::lower_max_pool_backward(const ir::Node* n) {
  const Window w = *window_of(n, 2, 7);
  const Lazy &grad = lazy_.at(n->arg(0).value()), &indices = lazy_.at(n->arg(7).value());
  const ir::Value* out = n->result();
  const size_t rank = out->meta().sizes.size();
  const int64_t W = out->meta().sizes[rank - 1];
  const int64_t OH = grad.sizes[rank - 2], OW = grad.sizes[rank - 1];
  const int64_t rows = (w.kh + w.sh - 1) / w.sh, cols = (w.kw + w.sw - 1) / w.sw;
  const std::string T = ctype_of(out->meta().dtype), G = ctype_of(grad.dtype);
  Lazy l;
  l.sizes = out->meta().sizes;
  l.dtype = out->meta().dtype;
  l.ops = static_cast<int>(rows * cols) * (grad.ops + indices.ops + 2);
  l.nodes = grad.nodes;
  for (const ir::Node* m : indices.nodes)
    if (std::find(l.nodes.begin(), l.nodes.end(), m) == l.nodes.end()) l.nodes.push_back(m);
  l.nodes.push_back(n);
  l.fn = [grad, indices, w, rank, W, OH, OW, rows, cols, T, G](Body& b, const std::vector<Expr>& index) {
    const Expr &ih = index[rank - 2], &iw = index[rank - 1];
    const Expr top = floordiv(ih + w.ph, w.sh), left = floordiv(iw + w.pw, w.sw);
    const std::string here = "int64_t(" + (ih * W + iw).str() + ")";
    std::string sum = T + "(0)";
    int level = std::max(level_of(ih), level_of(iw));
    // Output rows top - (rows - 1) .. top, columns likewise, in ATen's order.
    for (int64_t a = rows - 1; a >= 0; --a)
      for (int64_t c = cols - 1; c >= 0; --c) {
        const Expr oh = top + (-a), ow = left + (-c);
        std::vector<Expr> src = index;
        src[rank - 2] = mod(top + (rows * OH - a), OH);
        src[rank - 1] = mod(left + (cols * OW - c), OW);
        // The window of (oh, ow) covers (ih, iw): oh >= 0, oh < OH and
        // oh·sh - ph + kh > ih (oh·sh - ph <= ih holds as oh <= top).
        std::string covers;
        auto need = [&](const std::string& cond) { covers += std::string(covers.empty() ? "" : " && ") + cond; };
        if (oh.lo() < 0) need("(" + oh.str() + ") >= 0");
        if (oh.hi() >= OH) need("(" + oh.str() + ") < " + std::to_string(OH));
        if (ow.lo() < 0) need("(" + ow.str() + ") >= 0");
        if (ow.hi() >= OW) need("(" + ow.str() + ") < " + std::to_string(OW));
        const Expr row_end = oh * w.sh + (w.kh - w.ph), col_end = ow * w.sw + (w.kw - w.pw);
        need("(" + row_end.str() + ") > (" + ih.str() + ")");
        need("(" + col_end.str() + ") > (" + iw.str() + ")");
        const Val i = indices.fn(b, src), g = grad.fn(b, src);
        level = std::max({level, i.level, g.level});
        const std::string x = G == T ? g.name : "static_cast<" + T + ">(" + g.name + ")";
        sum =
            b.compute("(" + covers + " && " + i.name + " == " + here + ") ? " + sum + " + " + x + " : " + sum, level, T)
                .name;
      }
    return b.compute(sum, level, T);
  };
  define_lazy(out, std::move(l));
  realize_if_costly(out);
}

}  // namespace crucible::inductor::detail
