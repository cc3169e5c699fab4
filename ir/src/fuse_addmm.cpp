#include <crucible/ir/fuse_addmm.h>

#include <string>

namespace crucible::ir {

namespace {

using P = Pattern;

// The bias reaches the elements of a [M, N] product the way addmm's `self`
// does: at most `max_dim` dimensions, each 1 or the product's (right-aligned).
bool broadcasts_to(const TensorMeta& bias, const TensorMeta& product, size_t max_dim) {
  if (bias.sizes.size() > max_dim || bias.sizes.size() > product.sizes.size()) return false;
  const size_t skip = product.sizes.size() - bias.sizes.size();
  for (size_t d = 0; d < bias.sizes.size(); ++d)
    if (bias.sizes[d] != 1 && bias.sizes[d] != product.sizes[skip + d]) return false;
  return true;
}

bool same_kind(const TensorMeta& bias, const TensorMeta& product) {
  return bias.dtype == product.dtype && bias.device == product.device;
}

// `add` is aten::add.Tensor, or aten::add_.Tensor writing into the product
// (LibTorch's linear on other than 2-D input: `output.add_(bias)`).
Rewrite plain(const std::string& add_op, bool bias_first) {
  P mm = P::call("aten::mm", {P::bind("a"), P::bind("b")}).named("mm");
  P add = bias_first ? P::call(add_op, {P::bind("bias"), std::move(mm), P::bind("alpha")})
                     : P::call(add_op, {std::move(mm), P::bind("bias"), P::bind("alpha")});
  // bias + alpha * (a @ b) is addmm's beta = 1, alpha = alpha; (a @ b) + alpha * bias is beta = alpha, alpha = 1.
  P beta = bias_first ? P::constant(int64_t{1}) : P::bind("alpha");
  P alpha = bias_first ? P::bind("alpha") : P::constant(int64_t{1});
  return Rewrite{
      "addmm: " + add_op + "(" + (bias_first ? "bias, mm" : "mm, bias") + ")", std::move(add),
      P::call("aten::addmm", {P::bind("bias"), P::bind("a"), P::bind("b"), std::move(beta), std::move(alpha)}),
      [](const Match& m) {
        const TensorMeta &bias = m.meta("bias"), &product = m.meta("mm");
        return same_kind(bias, product) && broadcasts_to(bias, product, 2);
      }};
}

Rewrite through_view(const std::string& add_op, bool bias_first, const std::string& view) {
  P viewed =
      P::call(view, {P::call("aten::mm", {P::bind("a"), P::bind("b")}).named("mm"), P::bind("size")}).named("viewed");
  P add = bias_first ? P::call(add_op, {P::bind("bias"), std::move(viewed), P::bind("alpha")})
                     : P::call(add_op, {std::move(viewed), P::bind("bias"), P::bind("alpha")});
  P beta = bias_first ? P::constant(int64_t{1}) : P::bind("alpha");
  P alpha = bias_first ? P::bind("alpha") : P::constant(int64_t{1});
  P addmm = P::call("aten::addmm", {P::bind("bias"), P::bind("a"), P::bind("b"), std::move(beta), std::move(alpha)});
  return Rewrite{
      "addmm: " + add_op + "(" + (bias_first ? "bias, " : "") + view + "(mm)" + (bias_first ? ")" : ", bias)"),
      std::move(add), P::call(view, {std::move(addmm), P::bind("size")}), [](const Match& m) {
        // Through the view the bias must meet the same columns: one dimension
        // at most (or none), and the view keeps N last.
        const TensorMeta &bias = m.meta("bias"), &product = m.meta("mm"), &viewed = m.meta("viewed");
        return same_kind(bias, product) && broadcasts_to(bias, product, 1) && !viewed.sizes.empty() &&
               viewed.sizes.back() == product.sizes.back();
      }};
}

}  // namespace

std::vector<Rewrite> addmm_rewrites() {
  std::vector<Rewrite> r;
  for (const char* add_op : {"aten::add.Tensor", "aten::add_.Tensor"})
    for (bool bias_first : {false, true}) {
      if (bias_first && std::string(add_op) == "aten::add_.Tensor") continue;  // add_ writes its first argument
      r.push_back(plain(add_op, bias_first));
      for (const char* view : {"aten::_unsafe_view", "aten::view"}) r.push_back(through_view(add_op, bias_first, view));
    }
  return r;
}

size_t fuse_addmm(Graph& graph) {
  static const std::vector<Rewrite> rewrites = addmm_rewrites();
  return apply_rewrites(graph, rewrites);
}

}  // namespace crucible::ir
