// Lowering of pointwise ops (Note [Lowering]'s table, in
// lowering/pointwise_table.cpp): a body inlined into its readers, or
// realized where inlining does not pay.
#include "lowering/lowerer.h"
#include "lowering/pointwise_table.h"

#include <crucible/ir/op_classes.h>

#include <algorithm>

namespace crucible::inductor::detail {

// Operand `v` read at `index` (the result's multi-index): broadcast by
// aligning sizes right, size-1 dimensions read at 0.
std::vector<Expr> Lowerer::broadcast(const std::vector<int64_t>& from, const std::vector<Expr>& index) {
  std::vector<Expr> out(from.size());
  size_t lead = index.size() - from.size();
  for (size_t d = 0; d < from.size(); ++d) out[d] = from[d] == 1 ? Expr() : index[lead + d];
  return out;
}

void Lowerer::lower_pointwise(const ir::Node* n) {
  const PointwiseOp& op = pointwise_ops().at(n->target());
  const ir::Value* out = n->result();
  std::vector<Lazy> operands;
  std::vector<bool> masks;
  Lazy l;
  l.sizes = out->meta().sizes;
  l.dtype = out->meta().dtype;
  l.ops = 1;
  for (size_t i : op.tensor_args) {
    const Lazy& a = lazy_.at(n->arg(i).value());
    operands.push_back(a);
    masks.push_back(std::find(op.bool_args.begin(), op.bool_args.end(), i) != op.bool_args.end());
    l.ops += a.ops;
    for (const ir::Node* m : a.nodes)
      if (std::find(l.nodes.begin(), l.nodes.end(), m) == l.nodes.end()) l.nodes.push_back(m);
  }
  l.nodes.push_back(n);
  std::string T = ctype_of(compute_type(n, op));
  std::string R = ctype_of(l.dtype);
  // A conversion to bf16 or f16, or a fill of that dtype, rounds where it
  // stands (Note [Reduced-precision loops]).
  bool rounds = reduced_precision(l.dtype) && operands.empty();
  for (size_t k = 0; k < operands.size(); ++k) rounds = rounds || (!masks[k] && operands[k].dtype != l.dtype);
  const c10::ScalarType dtype = l.dtype;
  const bool one_hot = selects_one(n);
  l.fn = [operands, masks, T, R, n, &op, rounds, dtype, one_hot](Body& b, const std::vector<Expr>& index) {
    std::vector<std::string> x;
    int level = 0;
    Val condition;
    for (size_t k = 0; k < operands.size(); ++k) {
      // Note [One-hot selections]: the selected operand read where chosen.
      if (one_hot && k == 1) b.push_mask(condition.name, condition.level);
      Val v = operands[k].fn(b, broadcast(operands[k].sizes, index));
      if (one_hot && k == 1) b.pop_mask();
      if (k == 0) condition = v;
      level = std::max(level, v.level);
      std::string t = ctype_of(operands[k].dtype);
      x.push_back(masks[k] || t == T ? v.name : "static_cast<" + T + ">(" + v.name + ")");
    }
    if (op.reads_index) level = std::max(level, level_of(index[0]));
    std::string e = op.render(PointwiseOp::Ctx{x, n, T, index});
    if (R != T) e = "static_cast<" + R + ">(" + e + ")";
    if (rounds) e = round_to(dtype, e);
    return b.compute(e, level, R);
  };
  define_lazy(out, std::move(l));
  realize_if_costly(out);
}

// Note [One-hot selections]
// where(i == t, v, 0), with i counting along a dimension d (an arange
// viewed along it) and t constant along d, selects at most one element of
// each line along d: nll_loss's decomposition picks the target's
// log-probability so, and sums over the classes. Its value operand, and
// the producers inlined into it, are then read under the condition
// (Body::push_mask, Note [Masked loads]): memory is read at the selected
// element alone, where the sum would otherwise walk the whole line of the
// value from memory (GPT-2's log-probabilities over its 50257-word
// vocabulary: a second pass over the logits, after the one that makes the
// maximum and the sum of exponentials). A masked operand is read one
// element at a time, which costs nothing here: almost nothing is read.
bool Lowerer::selects_one(const ir::Node* n) const {
  if (n->target() != "aten::where.self" && n->target() != "aten::where.ScalarOther") return false;
  const ir::Value* cond = n->arg(0).value();
  if (!cond->node()->is_call() || cond->node()->target() != "aten::eq.Tensor") return false;
  const ir::Node* eq = cond->node();
  for (int side = 0; side < 2; ++side) {
    const ir::Argument &i = eq->arg(side), &t = eq->arg(1 - side);
    if (!i.is_value() || !t.is_value() || !i.value()->has_meta() || !t.value()->has_meta()) continue;
    const std::vector<int64_t>&is = i.value()->meta().sizes, &ts = t.value()->meta().sizes;
    // i counts along its one dimension d of more than one element.
    const auto counting = [](int64_t s) { return s > 1; };
    const auto d = std::find_if(is.begin(), is.end(), counting);
    if (is.size() != ts.size() || d == is.end() || std::find_if(d + 1, is.end(), counting) != is.end()) continue;
    if (ts[static_cast<size_t>(d - is.begin())] == 1 && counts(i.value())) return true;
  }
  return false;
}

// `v` is an arange (integers counting by a step that is not 0), seen
// through views that keep its elements in order.
bool Lowerer::counts(const ir::Value* v) {
  const ir::Node* n = v->node();
  while (n->is_call() && ir::is_op_class(n->target(), ir::OpClass::RowMajorView) && n->arg(0).is_value())
    n = n->arg(0).value()->node();
  if (!n->is_call() || !n->result()->has_meta() || !c10::isIntegralType(n->result()->meta().dtype, false)) return false;
  if (n->target() == "aten::arange" || n->target() == "aten::arange.start") return true;
  return n->target() == "aten::arange.start_step" && n->arg(2).is_constant() &&
         n->arg(2).constant().toScalar().toDouble() != 0;
}

}  // namespace crucible::inductor::detail
