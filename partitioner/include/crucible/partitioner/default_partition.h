// The default partition: save whatever the backward reads from the forward,
// recompute nothing (torch/_functorch/partitioners.py's default_partition).
#pragma once

#include <crucible/partitioner/partition.h>

namespace crucible::partitioner {

// Note [Default partition]
// The forward part is every node the forward outputs need (walking inputs
// back from them). The backward part is every node the gradients need,
// walking back until a forward value is reached. A forward tensor value so
// reached is a saved value: the forward returns it, the backward takes it as
// a placeholder; each is saved once however many backward nodes read it, in
// joint-graph order. Nodes that depend only on primals but are not needed
// by the forward outputs (a transpose of a weight used only by the backward)
// go to the backward, computed from saved primals, as in the seed where
// primals are saved values like any other.
// Differences from the seed, which keeps symbolic values (SymInts) among
// saved values (its saved_sym_nodes): here a non-tensor forward value the
// backward reads is recomputed in the backward from its inputs (which are
// saved in turn), since CompiledFn passes tensors only; the names are listed
// in PartitionResult::saved_symbols. Constants the backward reads are copied
// into it, not saved.
// No rematerialization: the min-cut partitioner trades saved memory for
// recomputation; this one saves.

/// Splits `joint` per Note [Joint graph contract] and Note [Default partition].
/// Value names, metadata, sources and tags are kept in both parts.
/// Throws PartitionError if num_fwd_outputs exceeds the outputs, a primal
/// follows a tangent, a forward output depends on a tangent, or the graph
/// has no output node.
PartitionResult default_partition(const ir::Graph& joint, size_t num_fwd_outputs);

}  // namespace crucible::partitioner
