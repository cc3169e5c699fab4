// Dead-code elimination.
//
// Tracing records every op the program ran, including ones whose results
// nobody reads (the unused mean/rstd of a layer norm, a size query, ops that
// a later pass made redundant, CSE's leftovers). They cost time and keep
// memory alive in every backend, so passes run this after any rewrite.
// Mirrors torch.fx.Graph.eliminate_dead_code.
#pragma once

#include <crucible/ir/graph.h>

#include <cstddef>

namespace crucible::ir {

/// Erases every call and constant node none of whose results is used,
/// transitively (a node whose only readers were dead goes too). Keeps the
/// placeholders, the output node and every call with side effects (see
/// has_side_effects in effects.h: in-place and out= ops, collectives, RNG
/// ops, ops that return nothing); see Note [DCE keeps what it cannot prove
/// dead]. Returns the number of nodes removed.
size_t eliminate_dead_code(Graph& graph);

}  // namespace crucible::ir
