#include <crucible/ir/aliasing.h>

#include "alias_annotations.h"

#include <array>

namespace crucible::ir {

Value* aliased_argument(const Value& v) {
  const Node* n = v.node();
  if (!n->is_call() || !v.is_tensor()) return nullptr;
  // Views whose schemas drop the alias annotation (the "unsafe" variants,
  // which autograd and functionalization treat as fresh tensors).
  static const std::array<c10::OperatorHandle, 4> unsafe_views = {
      resolve_operator("aten::_unsafe_view"), resolve_operator("aten::unsafe_split.Tensor"),
      resolve_operator("aten::unsafe_split_with_sizes"), resolve_operator("aten::unsafe_chunk")};
  for (const c10::OperatorHandle& op : unsafe_views)
    if (n->op() == op) return n->arg(0).value();
  // One return of a Tensor[] type (split) stands for all the results.
  const auto& returns = n->schema().returns();
  const c10::AliasInfo* alias = returns.at(returns.size() == 1 ? 0 : v.index()).alias_info();
  if (!alias) return nullptr;
  // `Tensor(a)[]` keeps its set on the element type.
  auto aliases = [alias](const c10::AliasInfo& formal) {
    if (detail::sets_overlap(*alias, formal)) return true;
    for (const c10::AliasInfo& element : alias->containedTypes())
      if (detail::sets_overlap(element, formal)) return true;
    return false;
  };
  const auto& formals = n->schema().arguments();
  for (size_t i = 0; i < formals.size(); ++i)
    if (formals[i].alias_info() && aliases(*formals[i].alias_info()) && n->arg(i).is_value()) return n->arg(i).value();
  return nullptr;
}

Value* storage_root(const Value* v) {
  Value* root = v->node()->result(v->index());
  while (Value* base = aliased_argument(*root)) root = base;
  return root;
}

}  // namespace crucible::ir
