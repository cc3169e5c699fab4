// Private: automatic dynamic sizes, the inductor's counterpart of
// torch._dynamo's automatic_dynamic_shapes for the kernels it generates
// (Note [Dynamic sizes] in dynamic_sizes.cpp).
#pragma once

#include "loop_ir/size_expr.h"

#include <crucible/ir/graph.h>

namespace crucible::inductor::detail {

/// The sizes `graph` (a CPU graph compile_fx_inner lowers) is lowered with.
/// The first graph of its structure (ir::graph_hash without sizes) gets an
/// empty table: every size a literal. A later one marks the placeholder
/// dimensions whose sizes differ from that first graph's as dynamic (for
/// good), makes each distinct size among them a symbol, and spells the
/// sizes, strides and products of sizes of every tensor of the graph over
/// them, by what they were in the first graph and are now. Thread-safe;
/// the structures seen are remembered for the process's life. Throws
/// nothing (a graph it cannot hash gets an empty table).
SizeTable dynamic_sizes(const ir::Graph& graph);

}  // namespace crucible::inductor::detail
