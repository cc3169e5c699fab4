#include <crucible/ir/fuse_attention.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>

namespace crucible::ir {

namespace {

using P = Pattern;

// An operand of at::matmul's batched product as the tracer records it
// (aten/src/ATen/native/LinearAlgebra.cpp, _matmul_impl): expanded to the
// broadcast batch sizes, then flattened to 3-D by reshape, which is a view
// where the layout allows (view, or _reshape_alias with strides: k^T of a
// contiguous k) and a contiguous copy where not (q and k read through the
// head transpose).
P batched_operand(P x, const std::string& name) {
  auto expand = [&x, &name] { return P::call("aten::expand", {x, P::ignored()}).named(name + "_expand"); };
  return P::any_of({
      P::call("aten::view", {expand(), P::ignored()}).named(name + "_3d"),
      P::call("aten::_reshape_alias", {expand(), P::ignored(), P::ignored()}).named(name + "_3d"),
      P::call("aten::_unsafe_view", {P::call("aten::clone", {expand(), P::ignored()}), P::ignored()})
          .named(name + "_3d"),
  });
}

// at::matmul(a, b) of 4-D a and b: bmm over the flattened batch, viewed back.
P matmul(P a, P b, const std::string& name) {
  return P::call("aten::_unsafe_view", {P::call("aten::bmm", {batched_operand(std::move(a), name + "_a"),
                                                              batched_operand(std::move(b), name + "_b")}),
                                        P::ignored()})
      .named(name);
}

constexpr double kInf = std::numeric_limits<double>::infinity();

enum class Scale { Mul, Div, None };
enum class Mask { Fill, Add, None };

P scaled(P scores, Scale s) {
  switch (s) {
    case Scale::Mul:
      return P::call("aten::mul.Scalar", {std::move(scores), P::bind("scale")});
    case Scale::Div:
      return P::call("aten::div.Scalar", {std::move(scores), P::bind("divisor")});
    case Scale::None:
      break;
  }
  return scores;
}

P masked(P x, Mask m) {
  switch (m) {
    case Mask::Fill:
      return P::call("aten::masked_fill.Scalar", {std::move(x), P::bind("cond"), P::constant(-kInf)});
    case Mask::Add:
      return P::call("aten::add.Tensor", {std::move(x), P::bind("bias"), P::constant(int64_t{1})});
    case Mask::None:
      break;
  }
  return x;
}

// `x` or its cast _to_copy(x, dtype) (no other change: pin_memory and
// memory format None; layout and device None or x's, which computes_attention
// checks). Under CUDA autocast the softmax runs in float32 (autocast's fp32
// policy casts the bf16 scores up, naming layout and device) and at::matmul
// casts the probabilities back down (naming neither).
P maybe_cast(P x, const std::string& name) {
  const c10::IValue none;
  P cast = P::call("aten::_to_copy", {x, P::bind(name + "_dtype"), P::bind(name + "_layout"), P::bind(name + "_device"),
                                      P::constant(none), P::ignored(), P::constant(none)});
  return P::any_of({std::move(x), std::move(cast)});
}

// The cast `name` changes nothing but the dtype: its layout is None or
// strided, its device None or `device`.
bool casts_dtype_alone(const Match& m, const std::string& name, const c10::Device& device) {
  const c10::IValue& layout = m.constant(name + "_layout");
  const c10::IValue& to = m.constant(name + "_device");
  return (layout.isNone() || (layout.isInt() && layout.toInt() == static_cast<int64_t>(c10::kStrided))) &&
         (to.isNone() || (to.isDevice() && to.toDevice() == device));
}

int64_t normalized_dim(const c10::IValue& d, size_t rank) {
  const int64_t dim = d.toInt();
  return dim < 0 ? dim + static_cast<int64_t>(rank) : dim;
}

bool is_floating(const TensorMeta& t) { return c10::isFloatingType(t.dtype); }

// `small` broadcasts to `sizes` (right-aligned, each dimension 1 or equal).
bool broadcasts_to(const TensorMeta& small, const std::vector<int64_t>& sizes) {
  if (small.sizes.size() > sizes.size()) return false;
  const size_t skip = sizes.size() - small.sizes.size();
  for (size_t d = 0; d < small.sizes.size(); ++d)
    if (small.sizes[d] != 1 && small.sizes[d] != sizes[skip + d]) return false;
  return true;
}

// What the pattern matched computes attention: shapes, dtypes, the
// transpose of k's last two dimensions, expands that broadcast nothing.
bool computes_attention(const Match& m, Scale s, Mask mask) {
  const TensorMeta &q = m.meta("q"), &k = m.meta("k"), &v = m.meta("v");
  if (q.sizes.size() != 4 || k.sizes.size() != 4 || v.sizes.size() != 4) return false;
  if (!is_floating(q) || q.dtype != k.dtype || q.dtype != v.dtype) return false;
  if (q.device != k.device || q.device != v.device) return false;
  const int64_t b = q.sizes[0], h = q.sizes[1], t = q.sizes[2], e = q.sizes[3], src = k.sizes[2];
  if (k.sizes != std::vector<int64_t>{b, h, src, e} || v.sizes[0] != b || v.sizes[1] != h || v.sizes[2] != src)
    return false;
  const int64_t d0 = normalized_dim(m.constant("kd0"), 4), d1 = normalized_dim(m.constant("kd1"), 4);
  if (!((d0 == 2 && d1 == 3) || (d0 == 3 && d1 == 2))) return false;
  for (const char* x : {"scores_a", "scores_b", "out_a", "out_b"})
    if (m.meta(std::string(x) + "_expand").sizes !=
        m.value(std::string(x) + "_expand")->node()->arg(0).value()->meta().sizes)
      return false;
  const std::vector<int64_t> scores{b, h, t, src};
  if (m.meta("scores").sizes != scores || m.meta("probs").sizes != scores) return false;
  if (m.meta("scores_a_3d").sizes != std::vector<int64_t>{b * h, t, e} ||
      m.meta("scores_b_3d").sizes != std::vector<int64_t>{b * h, e, src} ||
      m.meta("out_a_3d").sizes != std::vector<int64_t>{b * h, t, src} ||
      m.meta("out_b_3d").sizes != std::vector<int64_t>{b * h, src, v.sizes[3]})
    return false;
  if (normalized_dim(m.constant("dim"), 4) != 3) return false;
  // Casts around the softmax: up to float32 from q's (reduced) dtype, and
  // back; the fused kernels compute the softmax in float32 too.
  if (m.has("upcast_dtype") != m.has("downcast_dtype")) return false;
  if (m.has("upcast_dtype") &&
      (!c10::isReducedFloatingType(q.dtype) || m.constant("upcast_dtype").toScalarType() != at::kFloat ||
       m.constant("downcast_dtype").toScalarType() != q.dtype || !casts_dtype_alone(m, "upcast", q.device) ||
       !casts_dtype_alone(m, "downcast", q.device)))
    return false;
  if (s == Scale::Mul && !m.constant("scale").isDouble()) return false;
  if (mask == Mask::Fill && (m.meta("cond").dtype != at::kBool || !broadcasts_to(m.meta("cond"), scores))) return false;
  if (mask == Mask::Add && (m.meta("bias").dtype != q.dtype || !broadcasts_to(m.meta("bias"), scores))) return false;
  return true;
}

// Which attentions a rewrite list fuses, by q's dtype and device.
enum class Where {
  Everywhere,
  ReducedPrecision,  // q in bf16 or f16
  FlashKernel,       // q in bf16 or f16, or on a CPU (flash kernels there)
};

bool fused_there(const TensorMeta& q, Where where) {
  switch (where) {
    case Where::Everywhere:
      return true;
    case Where::ReducedPrecision:
      return c10::isReducedFloatingType(q.dtype);
    case Where::FlashKernel:
      return c10::isReducedFloatingType(q.dtype) || q.device.is_cpu();
  }
  return false;
}

Rewrite attention(Scale s, Mask mask, Where where) {
  P k_t = P::call("aten::transpose.int", {P::bind("k"), P::bind("kd0"), P::bind("kd1")});
  P scores = matmul(P::bind("q"), std::move(k_t), "scores");
  P probs = P::call("aten::_softmax", {maybe_cast(masked(scaled(std::move(scores), s), mask), "upcast"), P::bind("dim"),
                                       P::constant(false)})
                .named("probs");
  P out = matmul(maybe_cast(std::move(probs), "downcast"), P::bind("v"), "out");

  // A query whose keys are all masked: NaN in the written-out form (softmax
  // of -inf's), 0 from the fused kernels; a NaN query row keeps eager's NaN,
  // forward and backward.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  P query = P::bind("q");
  if (mask != Mask::None) {
    P masked_out =
        mask == Mask::Fill ? P::bind("cond") : P::call("aten::eq.Scalar", {P::bind("bias"), P::constant(-kInf)});
    P no_key = P::call("aten::all.dim", {std::move(masked_out), P::constant(int64_t{-1}), P::constant(true)});
    query = P::call("aten::masked_fill.Scalar", {std::move(query), std::move(no_key), P::constant(nan)});
  }
  if (s == Scale::Div) query = P::call("aten::div.Scalar", {std::move(query), P::bind("divisor")});
  P attn_mask = mask == Mask::Fill  ? P::call("aten::logical_not", {P::bind("cond")})
                : mask == Mask::Add ? P::bind("bias")
                                    : P::constant(c10::IValue());
  P scale = s == Scale::Mul ? P::bind("scale") : P::constant(1.0);
  P sdpa =
      P::call("aten::scaled_dot_product_attention", {std::move(query), P::bind("k"), P::bind("v"), std::move(attn_mask),
                                                     P::constant(0.0), P::constant(false), std::move(scale)});
  // The fused kernels return [B, H, T, Ev] in [B, T, H, Ev]'s layout; the
  // written-out form's readers saw a contiguous tensor.
  P replacement =
      P::call("aten::clone", {std::move(sdpa), P::constant(static_cast<int64_t>(c10::MemoryFormat::Contiguous))});
  const char* scale_name = s == Scale::Mul ? "mul" : s == Scale::Div ? "div" : "unscaled";
  const char* mask_name = mask == Mask::Fill ? "masked_fill" : mask == Mask::Add ? "additive mask" : "no mask";
  return Rewrite{
      std::string("attention: ") + scale_name + ", " + mask_name, std::move(out), std::move(replacement),
      [s, mask, where](const Match& m) { return computes_attention(m, s, mask) && fused_there(m.meta("q"), where); }};
}

std::vector<Rewrite> rewrites(Where where) {
  std::vector<Rewrite> r;
  for (Scale s : {Scale::Mul, Scale::Div, Scale::None})
    for (Mask m : {Mask::Fill, Mask::Add, Mask::None}) r.push_back(attention(s, m, where));
  return r;
}

}  // namespace

std::vector<Rewrite> attention_rewrites() { return rewrites(Where::Everywhere); }

size_t fuse_attention(Graph& graph) {
  static const std::vector<Rewrite> all = rewrites(Where::Everywhere);
  return apply_rewrites(graph, all);
}

size_t fuse_reduced_precision_attention(Graph& graph) {
  static const std::vector<Rewrite> reduced = rewrites(Where::ReducedPrecision);
  return apply_rewrites(graph, reduced);
}

size_t fuse_flash_attention(Graph& graph) {
  static const std::vector<Rewrite> flash = rewrites(Where::FlashKernel);
  return apply_rewrites(graph, flash);
}

}  // namespace crucible::ir
