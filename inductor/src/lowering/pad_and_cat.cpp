// Lowering of constant_pad_nd and cat: pointwise values whose inputs are
// read where they are chosen (Note [Masked loads]).
#include "lowering/lowerer.h"
#include "lowering/pointwise_table.h"

#include <algorithm>
#include <numeric>

namespace crucible::inductor::detail {

namespace {

// The most inputs a cat is lowered with (torch/_inductor/config.py's
// max_pointwise_cat_inputs): every element runs each input's code.
constexpr size_t kMaxCatInputs = 8;

}  // namespace

// constant_pad_nd(x, pads, value) lowered: a float tensor padded by
// constants, each side at most the dimension's size (Note [Lowering]).
bool Lowerer::pad_ok(const ir::Node* n) const {
  if (n->args().size() != 3 || !n->arg(0).is_value() || !loop_tensor(n->arg(0).value()) || !n->arg(1).is_constant() ||
      !numeric_constant(n->arg(2)) || !is_float(n->result()->meta().dtype))
    return false;
  const std::vector<int64_t>& sizes = n->arg(0).value()->meta().sizes;
  const std::vector<int64_t> pads = n->arg(1).constant().toIntVector();
  if (pads.size() % 2 != 0 || pads.size() / 2 > sizes.size()) return false;
  for (size_t k = 0; k < pads.size(); ++k) {
    const int64_t size = sizes[sizes.size() - 1 - k / 2];
    if (pads[k] < 0 || pads[k] > size) return false;
  }
  return true;
}

// cat(tensors, dim)'s dimension, when lowered (Note [Masked loads]): 1
// to kMaxCatInputs inputs of the result's rank that the loops read, each
// of the result's sizes but along dim, besides the 1-d empty tensors cat
// skips.
std::optional<int64_t> Lowerer::cat_dim(const ir::Node* n) const {
  if (n->args().empty() || n->args().size() > 2 || !n->arg(0).is_value_list() ||
      (n->args().size() == 2 && !(n->arg(1).is_constant() && n->arg(1).constant().isInt())))
    return std::nullopt;
  const std::vector<int64_t>& sizes = n->result()->meta().sizes;
  if (sizes.empty()) return std::nullopt;
  const int64_t dim = wrap_dim(n->args().size() == 2 ? n->arg(1).constant().toInt() : 0, sizes.size());
  size_t parts = 0;
  for (const ir::Value* v : n->arg(0).value_list()) {
    if (!loop_tensor(v)) return std::nullopt;
    const std::vector<int64_t>& in = v->meta().sizes;
    if (in.size() == 1 && in[0] == 0 && sizes.size() != 1) continue;  // skipped by cat
    if (in.size() != sizes.size()) return std::nullopt;
    for (size_t d = 0; d < in.size(); ++d)
      if (static_cast<int64_t>(d) != dim && in[d] != sizes[d]) return std::nullopt;
    parts += in[dim] > 0;
  }
  if (parts == 0 || parts > kMaxCatInputs) return std::nullopt;
  return dim;
}

// constant_pad_nd: element i of a padded dimension of size N (pad lo
// before) is x[i - lo] where lo <= i < lo + N, else the value. The load
// goes to (i + N - lo) mod N, which equals i - lo inside and stays in
// bounds outside (lo <= N): nothing is read out of bounds, and a pointwise
// producer of x fuses with the pad (pad_mm's padded gradients are written
// once, padded).
void Lowerer::lower_pad(const ir::Node* n) {
  const Lazy& in = lazy_.at(n->arg(0).value());
  const ir::Value* out = n->result();
  const std::vector<int64_t> pads = n->arg(1).constant().toIntVector();
  const size_t rank = in.sizes.size();
  std::vector<int64_t> before(rank, 0);
  std::vector<bool> padded(rank, false);
  for (size_t k = 0; k < pads.size(); k += 2) {
    const size_t d = rank - 1 - k / 2;
    before[d] = pads[k];
    padded[d] = pads[k] > 0 || pads[k + 1] > 0;
  }
  Lazy l;
  l.sizes = out->meta().sizes;
  l.dtype = out->meta().dtype;
  l.ops = in.ops + 1;
  l.nodes = in.nodes;
  l.nodes.push_back(n);
  const std::string T = ctype_of(l.dtype);
  const std::string fill = literal(n->arg(2).constant(), T);
  const std::string I = ctype_of(in.dtype);
  l.fn = [in, before, padded, T, I, fill](Body& b, const std::vector<Expr>& index) {
    std::vector<Expr> src(index.size());
    std::string inside;
    int level = 0;
    for (size_t d = 0; d < index.size(); ++d) {
      if (!padded[d]) {
        src[d] = index[d];
        continue;
      }
      const SizeExpr size = spelled(in.sizes[d]), pad = spelled(before[d]);
      src[d] = mod(index[d] + (size - pad), size);
      const std::string i = "(" + index[d].str() + ")";
      const std::string lower = before[d] > 0 ? i + " >= " + pad.factor_str() + " && " : "";
      inside += std::string(inside.empty() ? "" : " && ") + "(" + lower + i + " < " + (pad + size).factor_str() + ")";
      level = std::max(level, level_of(index[d]));
    }
    Val v = in.fn(b, src);
    std::string x = I == T ? v.name : "static_cast<" + T + ">(" + v.name + ")";
    return b.compute(inside.empty() ? x : "(" + inside + " ? " + x + " : " + fill + ")", std::max(level, v.level), T);
  };
  define_lazy(out, std::move(l));
  realize_if_costly(out);
}

// Note [Masked loads]
// cat(tensors, dim) is a pointwise value, as in TorchInductor's
// pointwise_cat: element i along dim is input k's element i - offset_k,
// k the input whose range [offset_k, offset_k + size_k) holds i, chosen
// by comparisons of i. Each input's code (its loads, and those of the
// producers inlined into it) runs under a mask saying i is in its range
// (Body::push_mask): memory is read only for the input chosen, and the
// other inputs' loads give 0, on which their code computes harmlessly
// (the loops' ops are total: no integer division, nothing that traps).
// So producers fuse into the cat and the cat into its readers: a GPT's
// q, k and v gradients, read through their head transposes, are written
// into one [B, T, 3C] buffer by one kernel, where an extern cat wrote a
// copy of three realized tensors. A reader whose index range lies inside
// one input's (a slice of the cat) reads that input alone, unmasked.
// Shifted indices i - offset_k are negative where k is not chosen; index
// expressions divide with floor semantics (loop_ir/index.cpp), so that
// every / and % the kernel computes is of a non-negative value where
// chosen.
void Lowerer::lower_cat(const ir::Node* n) {
  struct Part {
    Lazy in;
    int64_t offset, size;
  };
  const int64_t dim = *cat_dim(n);
  const ir::Value* out = n->result();
  Lazy l;
  l.sizes = out->meta().sizes;
  l.dtype = out->meta().dtype;
  l.ops = 1;
  std::vector<Part> parts;
  int64_t offset = 0;
  for (const ir::Value* v : n->arg(0).value_list()) {
    const Lazy& in = lazy_.at(v);
    if (in.sizes.size() != l.sizes.size() || in.sizes[dim] == 0) continue;
    parts.push_back({in, offset, in.sizes[dim]});
    offset += in.sizes[dim];
    l.ops += in.ops;
    for (const ir::Node* m : in.nodes)
      if (std::find(l.nodes.begin(), l.nodes.end(), m) == l.nodes.end()) l.nodes.push_back(m);
  }
  l.nodes.push_back(n);
  const c10::ScalarType dtype = l.dtype;
  // The inputs' ranges are compared in units of g elements, the greatest
  // common divisor of their offsets and sizes: where a loop walks the
  // inner elements of a unit as its innermost variable (Note [Split
  // loops]), the choice depends on the outer ones alone.
  int64_t g = 0;
  for (const Part& p : parts) g = std::gcd(g, std::gcd(p.offset, p.size));
  l.fn = [parts, dim, dtype, g](Body& b, const std::vector<Expr>& index) {
    const Expr& i = index[dim];
    const Expr unit = floordiv(i, g);
    const std::string at = "(" + unit.str() + ")", T = ctype_of(dtype);
    std::string value;
    int level = level_of(unit);
    for (size_t k = parts.size(); k-- > 0;) {  // the last first: the others wrap it
      const Part& p = parts[k];
      const int64_t end = p.offset + p.size;
      if (i.hi() < p.offset || i.lo() >= end) continue;  // never chosen here
      std::vector<Expr> src = index;
      // i - offset; where size divides offset, i mod size, the same where
      // chosen and simpler to index with (equal inputs: a reshape of q,
      // k or v reads its heads at i mod C).
      src[dim] = p.offset % p.size == 0 ? mod(i, spelled(p.size)) : i + spelled(p.offset) * -1;
      std::string inside;
      if (i.lo() < p.offset) inside = at + " >= " + std::to_string(p.offset / g);
      if (i.hi() >= end) inside += std::string(inside.empty() ? "" : " && ") + at + " < " + std::to_string(end / g);
      if (!inside.empty()) b.push_mask("(" + inside + ")", level_of(unit));
      const Val v = p.in.fn(b, src);
      if (!inside.empty()) b.pop_mask();
      level = std::max(level, v.level);
      std::string x = v.name;
      if (p.in.dtype != dtype) {
        x = "static_cast<" + T + ">(" + x + ")";
        if (reduced_precision(dtype)) x = round_to(dtype, x);  // Note [Reduced-precision loops]
      }
      value = value.empty() ? x : at + " < " + std::to_string(end / g) + " ? " + x + " : " + value;
    }
    return b.compute(value, level, T);
  };
  define_lazy(out, std::move(l));
  // Read twice, a cat is made once: each reader would gather from every
  // input again, with the choice and its masks (a GPT's q, k, v gradient
  // is read by the projection's matmuls and by its bias's gradient).
  if (out->users().size() > 1)
    realize(out);
  else
    realize_if_costly(out);
}

}  // namespace crucible::inductor::detail
