// Folding chains of views.
//
// Traced graphs stack reshapes: at::matmul's fold of a batched product ends
// in an _unsafe_view, and the caller's own view or reshape follows
// (`_unsafe_view -> _unsafe_view`, `view -> view`), and decompositions add
// more. Each is a dispatcher call and a fresh TensorImpl at run time, and a
// node every later pass walks. A chain of views of x is one view of x.
// Inductor needs no such pass (its lowering folds every view into the
// indexing of the kernel that reads it); a graph run op by op needs the fold
// as a rewrite.
#pragma once

#include <crucible/ir/graph.h>
#include <crucible/ir/pattern_matcher.h>

#include <cstddef>
#include <vector>

namespace crucible::ir {

/// The rewrites fold_view_chains applies: for outer and inner each of
/// aten::view, aten::_unsafe_view and aten::reshape,
///   outer(inner(x, s1), s2) -> outer(x, s2)
/// where inner's result is read by outer alone. Only where every step is a
/// view of its input (a reshape that copies stays: the copy is what its
/// readers see), and x itself can be viewed with sizes s2, so the folded
/// call is a view of x exactly as the chain's end was. See Note [Folding
/// views] for aliasing.
std::vector<Rewrite> view_chain_rewrites();

/// Applies view_chain_rewrites() until every chain is one call; returns the
/// number of calls folded away. Bitwise: views move no data.
size_t fold_view_chains(Graph& graph);

}  // namespace crucible::ir
