// Private: a graph's code generation from end to end (torch/_inductor's
// GraphLowering.codegen with the wrapper's kernel definitions): lowering,
// the scheduler's groups, each group rendered for the loops' device, each
// distinct kernel defined once, after its target's prelude.
#pragma once

#include "loop_ir/size_expr.h"
#include "schedule.h"

#include <crucible/ir/graph.h>

namespace crucible::inductor::detail {

/// Lowers (Note [Lowering]), schedules (Note [Fusion]) and renders `graph`:
/// as C++/OpenMP when its loops run on the CPU (`threads` > 0 fixes the
/// OpenMP thread count of every parallel loop), as CUDA C++ on a CUDA
/// device, with runs of independent pointwise kernels launched as one
/// (Note [Combined launches]) and a kernel equal to an earlier one defined
/// once (Note [Identical kernels]). Sizes are spelled as `sizes` spells
/// them (Note [Dynamic sizes]; CPU graphs only: a CUDA graph's table must
/// be empty).
Schedule compile_schedule(const ir::Graph& graph, int threads, const SizeTable& sizes = {});

}  // namespace crucible::inductor::detail
