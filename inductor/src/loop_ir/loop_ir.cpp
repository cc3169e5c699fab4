#include "loop_ir/loop_ir.h"

#include <crucible/ir/tensor_meta.h>

#include <algorithm>
#include <optional>

namespace crucible::inductor::detail {

int64_t Buffer::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

int64_t Loop::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

int64_t Loop::rnumel() const {
  int64_t n = 1;
  for (int64_t s : rsizes) n *= s;
  return n;
}

// Note [Reduced-precision loops]
// bf16 and f16 tensors are read and written by the loops as 16-bit
// patterns, converted to float on load and rounded to nearest even on
// store; everything between is float, as ATen's kernels compute them (its
// opmath type) and as TorchInductor's generated kernels do. A fused chain
// therefore rounds once, where eager rounds after every op: its result is
// as close to the exact one or closer, and differs from eager's by the
// roundings eager makes. An explicit conversion to bf16 or f16 (to,
// _to_copy, a fill of that dtype) rounds where it stands, also inlined,
// since the program asked for the rounding (an autocast's cast to bf16
// then back to float gives eager's values). Sums accumulate as float sums
// do (double on the CPU, float on a GPU).
bool reduced_precision(c10::ScalarType t) { return t == c10::kBFloat16 || t == c10::kHalf; }

std::string storage_ctype_of(c10::ScalarType t) { return reduced_precision(t) ? "uint16_t" : ctype_of(t); }

std::string from_storage(c10::ScalarType t, const std::string& stored) {
  if (t == c10::kBFloat16) return "crucible_bf16_to_float(" + stored + ")";
  if (t == c10::kHalf) return "crucible_f16_to_float(" + stored + ")";
  return stored;
}

std::string to_storage(c10::ScalarType t, const std::string& value) {
  if (t == c10::kBFloat16) return "crucible_float_to_bf16(" + value + ")";
  if (t == c10::kHalf) return "crucible_float_to_f16(" + value + ")";
  return value;
}

std::string round_to(c10::ScalarType t, const std::string& value) {
  return reduced_precision(t) ? from_storage(t, to_storage(t, value)) : value;
}

std::string ctype_of(c10::ScalarType t) {
  switch (t) {
    case c10::kBFloat16:
    case c10::kHalf:
    case c10::kFloat:
      return "float";
    case c10::kDouble:
      return "double";
    case c10::kLong:
      return "int64_t";
    case c10::kInt:
      return "int32_t";
    case c10::kBool:
      return "bool";
    default:
      return {};
  }
}

int level_of(const Expr& e) {
  if (e.uses("r") || e.uses("rh") || e.uses("rl") || e.uses("ol")) return 2;
  return e.uses("o") || e.uses("oh") ? 1 : 0;
}

namespace {

// A body that only records the loads (for dependency analysis) and names
// values by their text (for printing the IR).
class RecordingBody : public Body {
 public:
  explicit RecordingBody(const Program& p) : p_(p) {}
  Val load(int b, const std::vector<Expr>& index) override {
    const Buffer& buf = p_.buffers[b];
    Expr flat = iteration_position(p_, b, index);
    reads.push_back({b, flat});
    std::string text = "load(" + buf.name + ", " + flat.str() + ")";
    return compute(text, level_of(flat), ctype_of(buf.dtype));
  }
  Val compute(const std::string& expr, int level, const std::string&) override {
    auto [it, fresh] = names_.emplace(expr, "t" + std::to_string(names_.size()));
    if (fresh) lines.push_back(it->second + " = " + expr);
    return {it->second, level};
  }
  std::vector<Read> reads;
  std::vector<std::string> lines;

 private:
  const Program& p_;
  std::unordered_map<std::string, std::string> names_;
};

}  // namespace

LoopVars loop_vars(const SizeExpr& outer, const SizeExpr& inner, int64_t osplit, int64_t rsplit) {
  auto var = [](const std::string& name, int64_t extent, int64_t split) {
    if (split <= 0) return Expr::var(name, extent);
    return Expr::var(name + "h", extent / split) * spelled(split) + Expr::var(name + "l", split);
  };
  return {outer.value(), inner.value(), inner, var("o", outer.value(), osplit), var("r", inner.value(), rsplit)};
}

Val body_value(Body& b, const Loop& loop, const LoopVars& v) {
  if (loop.reduction) return loop.rfn(b, unravel(v.o, spelled_sizes(loop)), unravel(v.r, spelled_rsizes(loop)));
  Expr flat = loop.numel() == v.outer ? v.o : v.o * v.inner_size + v.r;
  return loop.fn(b, loop_index(loop, flat));
}

Val body_value(Body& b, const Loop& loop, const SizeExpr& outer, const SizeExpr& inner) {
  return body_value(b, loop, loop_vars(outer, inner));
}

namespace {

// `exprs` where they spell `sizes`, else spelled() of each.
std::vector<SizeExpr> spelled_as(const std::vector<SizeExpr>& exprs, const std::vector<int64_t>& sizes) {
  const bool same =
      exprs.size() == sizes.size() && std::equal(exprs.begin(), exprs.end(), sizes.begin(),
                                                 [](const SizeExpr& e, int64_t v) { return e.value() == v; });
  return same ? exprs : spelled(sizes);
}

SizeExpr product(const std::vector<SizeExpr>& v) {
  SizeExpr p = 1;
  for (const SizeExpr& e : v) p = p * e;
  return p;
}

}  // namespace

std::vector<SizeExpr> spelled_sizes(const Loop& loop) { return spelled_as(loop.size_exprs, loop.sizes); }
std::vector<SizeExpr> spelled_rsizes(const Loop& loop) { return spelled_as(loop.rsize_exprs, loop.rsizes); }
SizeExpr spelled_numel(const Loop& loop) { return product(spelled_sizes(loop)); }
SizeExpr spelled_rnumel(const Loop& loop) { return product(spelled_rsizes(loop)); }

std::vector<SizeExpr> spelled_strides(const Buffer& b) {
  if (std::optional<std::vector<SizeExpr>> s = layout_strides(b.value, b.strides)) return *s;
  if (b.strides == contiguous_strides(b.sizes)) return contiguous_strides(spelled_sizes(b.value, b.sizes));
  return spelled(b.strides);
}

Expr iteration_position(const Program& p, int b, const std::vector<Expr>& index) {
  const Buffer& buf = p.buffers[static_cast<size_t>(b)];
  const bool in_memory_order = buf.loop >= 0 && !p.loops[static_cast<size_t>(buf.loop)].order.empty();
  return dot(index, in_memory_order ? spelled_strides(buf) : contiguous_strides(spelled_sizes(buf.value, buf.sizes)));
}

std::vector<Expr> loop_index(const Loop& loop, const Expr& flat) {
  const std::vector<SizeExpr> spelled = spelled_sizes(loop);
  if (loop.order.empty()) return unravel(flat, spelled);
  std::vector<SizeExpr> sizes;
  for (int d : loop.order) sizes.push_back(spelled[static_cast<size_t>(d)]);
  const std::vector<Expr> in_order = unravel(flat, sizes);
  std::vector<Expr> index(loop.sizes.size());
  for (size_t k = 0; k < loop.order.size(); ++k) index[static_cast<size_t>(loop.order[k])] = in_order[k];
  return index;
}

Expr store_offset(const Program& p, const Loop& loop, const Expr& flat) {
  return dot(loop_index(loop, flat), spelled_strides(p.buffers[static_cast<size_t>(loop.buffer)]));
}

std::vector<Read> reads_of(const Program& p, const Loop& loop, const SizeExpr& outer, const SizeExpr& inner) {
  RecordingBody b(p);
  body_value(b, loop, outer, inner);
  return std::move(b.reads);
}

std::string to_text(const Program& p) {
  auto dims = [](const std::vector<int64_t>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  };
  std::string out;
  for (const Item& it : p.items) {
    if (it.extern_node) {
      const ir::Node* n = it.extern_node;
      out += "extern " + (n->num_results() ? "%" + n->result(0)->name() + " = " : std::string()) + n->target() + "\n";
      continue;
    }
    const Loop& l = p.loops[it.loop];
    const Buffer& buf = p.buffers[l.buffer];
    RecordingBody b(p);
    Val v = l.reduction ? body_value(b, l, l.numel(), l.rnumel()) : body_value(b, l, l.numel(), 1);
    out += buf.name + " : " + c10::toString(buf.dtype) + dims(buf.sizes) + " stride=" + dims(buf.strides) + " = ";
    if (l.reduction) {
      const char* kind = l.rtype == ReductionType::Sum ? "sum" : l.rtype == ReductionType::Max ? "max" : "min";
      out += std::string("reduction(") + kind + ", o < " + std::to_string(l.numel()) + ", r < " +
             std::to_string(l.rnumel()) + ") {\n";
    } else {
      out += "pointwise(o < " + std::to_string(l.numel()) + ") {\n";
    }
    for (const std::string& line : b.lines) out += "  " + line + "\n";
    out += "  " + std::string(l.reduction ? "combine " : "store ") + v.name;
    if (!l.finalize.empty()) out += ", then " + l.finalize;
    out += "\n}\n";
  }
  return out;
}

c10::Device loop_device(const ir::Graph& graph) {
  for (const ir::Node* n : graph.nodes())
    for (const auto& r : n->results())
      if (r->is_tensor() && r->has_meta() && r->meta().device.is_cuda()) return r->meta().device;
  return c10::kCPU;
}

}  // namespace crucible::inductor::detail
