// Private: lowering (torch/_inductor/lowering.py and graph.py): an
// ATen-level graph to the loop-level IR (Note [Lowering] in
// lowering/lowering.cpp).
#pragma once

#include "loop_ir/loop_ir.h"

#include <crucible/ir/graph.h>

#include <string_view>

namespace crucible::inductor::detail {

/// A node tag (ir::Node::add_tag) by which a graph pass asks the lowering
/// to realize a pointwise result into a buffer of its own instead of
/// inlining it into its readers: a narrowed copy that lets a wider buffer
/// die early (Note [Narrow max-pool indices]).
inline constexpr std::string_view kRealizeTag = "realize";

/// Lowers `graph` (functional, ATen-level, metadata on every tensor) to a
/// Program (Note [Lowering]). Never fails on an op it does not know: that
/// op is an extern kernel.
Program lower(const ir::Graph& graph);

}  // namespace crucible::inductor::detail
