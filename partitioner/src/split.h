// Private: splitting a joint graph into forward and backward graphs, given
// what the forward saves (the default partition's rule, or a chosen set).
#pragma once

#include <crucible/partitioner/partition.h>

#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace crucible::partitioner::detail {

using ValueMap = std::unordered_map<const ir::Value*, ir::Value*>;

/// Copies a call or constant node `n` into `g` at its insertion point, with
/// its source, tags and metadata; the arguments are read through `map`
/// (which must hold every Value `n` reads), and old -> new results recorded
/// there. `keep_names`: the copies take `n`'s result names (which `g` must
/// not have yet); else fresh names made from them.
void copy_node(const ir::Node* n, ir::Graph& g, ValueMap& map, bool keep_names = true);

/// Splits `joint` per Note [Joint graph contract]. Without `saved_only`, the
/// backward saves every forward tensor it reads (Note [Default partition]).
/// With it, the forward also computes every value of `saved_only` (which
/// must not depend on a tangent) and the backward saves those and the
/// primals it reads, and recomputes every other forward value it needs.
/// Errors are PartitionError, prefixed with `who`.
PartitionResult split(const ir::Graph& joint, size_t num_fwd_outputs,
                      const std::unordered_set<const ir::Value*>* saved_only, std::string_view who);

}  // namespace crucible::partitioner::detail
