// What a call does besides computing its results: the facts DCE and CSE need
// to know which nodes they may drop or merge.
#pragma once

#include <crucible/ir/graph.h>

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

}  // namespace crucible::ir
