// Private: lowering (torch/_inductor/lowering.py and graph.py): an
// ATen-level graph to the loop-level IR (Note [Lowering] in
// lowering/lowering.cpp).
#pragma once

#include "loop_ir/loop_ir.h"

#include <crucible/ir/graph.h>

namespace crucible::inductor::detail {

/// Lowers `graph` (functional, ATen-level, metadata on every tensor) to a
/// Program (Note [Lowering]). Never fails on an op it does not know: that
/// op is an extern kernel.
Program lower(const ir::Graph& graph);

}  // namespace crucible::inductor::detail
