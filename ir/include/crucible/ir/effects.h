// What a call does besides computing its results: the facts DCE and CSE need
// to know which nodes they may drop or merge.
#pragma once

#include <crucible/ir/graph.h>

#include <vector>

namespace crucible::ir {

/// True for collective communication: every op of the c10d,
/// _c10d_functional and _c10d_functional_autograd namespaces, and Crucible's
/// own collectives, crucible::{all_reduce, all_gather, reduce_scatter,
/// broadcast, all_to_all, wait_tensor, barrier}* (any name starting with one
/// of these). A collective talks to other processes: every rank must issue
/// the same ones in the same order, whatever their results are used for.
bool is_collective(const Node& node);

/// True when dropping or merging the call could change the program beyond its
/// results: it writes an argument (its schema has `Tensor(a!)`), is a
/// collective, draws from the RNG (at::Tag::nondeterministic_seeded; dropping
/// one shifts the random stream of every later RNG op), or returns nothing
/// (asserts, prints: its effect is all it does, as FX's
/// _side_effectful_functions). False for other node kinds.
bool has_side_effects(const Node& node);

// Note [Order of side effects]
// Graphs carry no effect tokens: the order of the nodes is the order of
// their effects. A pass may drop, merge, recompute or move a node without
// side effects as its data dependencies allow, but must keep every node with
// side effects (has_side_effects) and keep them in the order they had, as if
// each took the previous one's token: RNG draws in the order eager drew them
// (so a graph and eager draw the same numbers), writes to an input in the
// order the function wrote it, collectives in the order every rank issues
// them. DCE and CSE never drop, merge or move them; a pass that reorders
// (a scheduler, a partitioner recomputing in another graph) orders them by
// side_effect_order() and may recompute only nodes without side effects.

/// The nodes with side effects, in graph order: the chain a reordering pass
/// must keep (Note [Order of side effects]).
std::vector<const Node*> side_effect_order(const Graph& graph);

}  // namespace crucible::ir
