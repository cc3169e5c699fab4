// Reading a schema's alias annotations (`Tensor(a) self -> Tensor(a)`,
// `Tensor(a!) self`): which results may share memory with which arguments.
#pragma once

#include <ATen/core/alias_info.h>
#include <ATen/core/jit_type.h>

namespace crucible::ir::detail {

/// True when two annotations name a common alias set (`(a)` and `(a!)` do).
inline bool sets_overlap(const c10::AliasInfo& a, const c10::AliasInfo& b) {
  for (const auto& s : a.beforeSets())
    if (b.beforeSets().count(s) || b.afterSets().count(s)) return true;
  return false;
}

/// True for Tensor[] (a schema type whose arguments are lists of Values and
/// whose returns expand to one result per element).
inline bool is_tensor_list(const c10::TypePtr& t) {
  auto l = t->cast<c10::ListType>();
  return l && l->getElementType()->kind() == c10::TypeKind::TensorType;
}

}  // namespace crucible::ir::detail
