// Which Values share storage: what a schema's alias annotations say about a
// call's results (`Tensor(a) self -> Tensor(a)`), followed back to the Value
// that allocated the memory. Rewrites that must not change what a view
// views, or what a caller sees through one, walk these chains.
#pragma once

#include <crucible/ir/graph.h>

namespace crucible::ir {

/// The argument whose storage the call result `v` shares: the argument its
/// schema marks with the same alias set (a view such as aten::permute or
/// aten::reshape, a Tensor[] element of aten::split, an in-place op's
/// result), or the input of aten::_unsafe_view, aten::unsafe_split and
/// aten::unsafe_chunk (views though their schemas do not say so). nullptr for a fresh result, a placeholder, a constant
/// and a non-tensor Value. Throws nothing.
Value* aliased_argument(const Value& v);

/// The Value whose storage `v` lives on: aliased_argument followed until a
/// result that allocated its own memory, a placeholder or a constant
/// (`v` itself when it is one). Throws nothing.
Value* storage_root(const Value* v);

}  // namespace crucible::ir
