#include "fx_passes/fx_passes.h"

#include "loop_ir/loop_ir.h"

#include <crucible/ir/aliasing.h>
#include <crucible/ir/graph.h>
#include <crucible/ir/propagate_meta.h>

#include <ATen/Context.h>

#include <map>
#include <string_view>
#include <tuple>
#include <unordered_set>
#include <vector>

namespace crucible::inductor::detail {

// Note [Padding matmuls]
// cuBLAS's tensor-core kernels move rows in 16-byte pieces; a matrix whose
// rows do not start at multiples of 16 bytes (a leading dimension of 50257
// floats: GPT-2's vocabulary) gets slower kernels. GPT-2's three lm-head
// matmuls took 5 ms each on an H100 (fp32 with TF32), where 632 GFLOP at
// the tensor cores' rate is under 2 ms. As torch/_inductor/fx_passes/
// pad_mm.py does, a large matmul with a dimension that is not a multiple of
// the alignment (16 bytes: 4 floats when TF32 is on, 8 halves; fp32 without
// TF32 and fp64 use no tensor cores and are left alone) gets zero-padded
// operands and its result is sliced back to its sizes: the zeros add
// nothing to any dot product, so the kept elements are the same sums.
// PyTorch benchmarks the padded matmul against the plain one; here a size
// rule stands in for that: at least 2^30 multiply-adds, where copying the
// operands costs a few percent of the product.
//  - An operand that is a transpose of a 2-D tensor is padded through the
//    transpose (the base padded, then transposed): the result is the padded
//    copy the same tensor needs untransposed, so a forward's t(W) and a
//    backward's W, or a gradient read as g and t(g), share one pad.
//  - A matmul whose result the graph returns, or a view of it (GPT-2's
//    logits: the product viewed as [B, T, V]), is left alone: a sliced
//    result would have strides eager does not give (Note [Eager's strides
//    at the outputs] in fx_passes/layout_opt.cpp).
namespace {

constexpr int64_t kMinMultiplyAdds = int64_t{1} << 30;

int64_t alignment(c10::ScalarType t) {
  switch (t) {
    case c10::kHalf:
    case c10::kBFloat16:
      return 8;
    case c10::kFloat:
      return at::globalContext().float32MatmulPrecision() == at::Float32MatmulPrecision::HIGHEST ? 0 : 4;
    default:
      return 0;
  }
}

int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// The 2-D tensor `v` is a transpose of, or nullptr.
ir::Value* transposed_base(const ir::Value* v) {
  const ir::Node* n = v->node();
  if (!n->is_call() || n->args().empty() || !n->arg(0).is_value()) return nullptr;
  ir::Value* base = n->arg(0).value();
  if (!base->has_meta() || base->meta().sizes.size() != 2) return nullptr;
  if (n->target() == "aten::t") return base;
  if (n->target() == "aten::transpose.int" && n->args().size() == 3 && n->arg(1).is_constant() &&
      n->arg(2).is_constant() && n->arg(1).constant().toInt() != n->arg(2).constant().toInt())
    return base;
  if (n->target() == "aten::permute" && n->arg(1).is_constant() &&
      n->arg(1).constant().toIntVector() == std::vector<int64_t>{1, 0})
    return base;
  return nullptr;
}

// A call with its metadata (what the next rewrite reads).
ir::Value* add(ir::Graph& g, std::string_view op, std::vector<ir::Argument> args) {
  ir::Node* n = g.add_call(op, std::move(args));
  ir::infer_meta(*n);
  return n->result();
}

class Padder {
 public:
  explicit Padder(ir::Graph& g) : g_(g) {}

  // `v` ([rows, cols]) padded with zeros to [rows + extra_rows, cols + extra_cols].
  ir::Value* pad(ir::Value* v, int64_t extra_rows, int64_t extra_cols) {
    if (extra_rows == 0 && extra_cols == 0) return v;
    if (ir::Value* base = transposed_base(v)) return add(g_, "aten::t", {pad(base, extra_cols, extra_rows)});
    auto key = std::make_tuple(v, extra_rows, extra_cols);
    if (auto it = pads_.find(key); it != pads_.end()) return it->second;
    return pads_[key] = add(g_, "aten::constant_pad_nd",
                            {v, std::vector<int64_t>{0, extra_cols, 0, extra_rows}, c10::Scalar(0)});
  }

 private:
  ir::Graph& g_;
  std::map<std::tuple<ir::Value*, int64_t, int64_t>, ir::Value*> pads_;
};

// The storage roots of the graph's outputs: the values they are, or view.
std::unordered_set<const ir::Value*> returned(const ir::Graph& g) {
  std::unordered_set<const ir::Value*> roots;
  for (const ir::Value* v : g.outputs()) roots.insert(ir::storage_root(v));
  return roots;
}

}  // namespace

void pad_mm(ir::Graph& g) {
  if (!loop_device(g).is_cuda()) return;
  std::vector<ir::Node*> mms;
  for (ir::Node* n : g.nodes())
    if (n->is_call() && n->target() == "aten::mm") mms.push_back(n);
  const std::unordered_set<const ir::Value*> roots = returned(g);
  Padder padder(g);
  for (ir::Node* n : mms) {
    if (!n->arg(0).is_value() || !n->arg(1).is_value()) continue;
    ir::Value* a = n->arg(0).value();
    ir::Value* b = n->arg(1).value();
    ir::Value* c = n->result();
    if (!a->has_meta() || !b->has_meta() || !c->has_meta() || roots.contains(c)) continue;
    const ir::TensorMeta &ma = a->meta(), &mb = b->meta();
    const int64_t align = alignment(ma.dtype);
    if (align == 0 || mb.dtype != ma.dtype || !ma.device.is_cuda() || mb.device != ma.device) continue;
    const int64_t m = ma.sizes[0], k = ma.sizes[1], n_cols = mb.sizes[1];
    if (m * k * n_cols < kMinMultiplyAdds) continue;
    const int64_t mp = round_up(m, align), kp = round_up(k, align), np = round_up(n_cols, align);
    if (mp == m && kp == k && np == n_cols) continue;
    ir::Graph::InsertGuard before(g, n);
    ir::Value* product = add(g, "aten::mm", {padder.pad(a, mp - m, kp - k), padder.pad(b, kp - k, np - n_cols)});
    if (mp > m) product = add(g, "aten::slice.Tensor", {product, int64_t{0}, int64_t{0}, m, int64_t{1}});
    if (np > n_cols) product = add(g, "aten::slice.Tensor", {product, int64_t{1}, int64_t{0}, n_cols, int64_t{1}});
    c->replace_all_uses_with(product);
    g.erase(n);
  }
}

}  // namespace crucible::inductor::detail
