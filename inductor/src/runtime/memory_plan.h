// Private: the run-time plan made from a compiled schedule: a slot for
// every tensor, steps in schedule order, each slot cleared after its last
// reader, and the memory of dead buffers reused (Note [Run-time plan] in
// runtime/plan.h, Note [Buffer reuse] in runtime/memory_plan.cpp); and the
// memory a call of it holds.
#pragma once

#include "codecache/graph_cache.h"
#include "runtime/plan.h"

#include <crucible/inductor/options.h>
#include <crucible/runtime/memory.h>

namespace crucible::inductor::detail {

/// Fills `plan` (its graph, device and loaded kernels set) with the slots,
/// steps and outputs of schedule `s`: each slot cleared after its last
/// reader, a generated kernel's output given the memory of a dead buffer of
/// the same span (Note [Buffer reuse]), or with options.memory_planning
/// (by default on the CPU) the buffers placed in arenas where that peaks
/// no higher (Note [Arena]); plan.device must be set. options.kernel_config >= 0 fixes every autotuned kernel's
/// configuration.
/// Without `bind_kernels` no kernel is looked up (none need be loaded): the
/// plan is for planned_memory, not to run.
/// Throws InductorError for a graph the plan cannot express (one that
/// returns a non-tensor, reads a value before defining it, or passes a list
/// argument of another kind than tensors).
void make_plan(Plan& plan, const CompiledSchedule& s, const InductorOptions& options, bool bind_kernels = true);

/// What one call of `plan` holds in memory, by its steps alone (Note
/// [Planned memory]).
runtime::PlannedMemory planned_memory(const Plan& plan);

}  // namespace crucible::inductor::detail
