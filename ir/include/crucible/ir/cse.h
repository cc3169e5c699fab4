// Common-subexpression elimination.
//
// Traced graphs repeat work the source wrote once per use: the same
// transpose of a weight in forward and backward, the same mask or scale
// computed in every layer, duplicates that decompositions introduce. Merging
// them saves the compute and the memory of the copies. Mirrors MLIR's
// eliminateCommonSubExpressions and PyTorch's fx_passes CSE.
#pragma once

#include <crucible/ir/graph.h>

#include <cstddef>

namespace crucible::ir {

/// Replaces every call that repeats an earlier one — same operator, same
/// argument Values, constants equal by value (1 and 1.0 differ) — by the
/// earlier one's results, and erases it. Never merges calls with side effects
/// (has_side_effects in effects.h: in-place ops, collectives, RNG ops), calls
/// whose results are written in place anywhere in the graph, nor two calls
/// with a mutation of one of their inputs between them; see
/// Note [CSE and mutation]. Returns the number of nodes removed.
size_t eliminate_common_subexpressions(Graph& graph);

}  // namespace crucible::ir
