// Private: the scheduler (torch/_inductor/scheduler.py): a lowered
// program's loops grouped into kernels, decided on loop sizes and on the
// index expressions of what each loop reads, never on target syntax (Note
// [Fusion] in scheduler.cpp).
#pragma once

#include "schedule.h"

#include <crucible/ir/graph.h>

#include <vector>

namespace crucible::inductor::detail {

/// What the scheduler decides for a program: its loops grouped into
/// kernels, the order in which those kernels and the extern kernels run,
/// and which of each group's buffers reach memory.
struct Fusion {
  std::vector<Group> groups;
  /// Run order: extern kernels, and groups (Step::kernel indexes groups).
  std::vector<Schedule::Step> steps;
  /// Per group: the buffers its loops write, and those of them read from
  /// outside it (another group, an extern kernel, the graph's outputs) or
  /// written in place (graph inputs); the others stay in registers or
  /// scratch rows.
  std::vector<GroupInfo> info;
};

/// Groups the loops of `p`, lowered from `graph`, into kernels (Note
/// [Fusion]): vertically, a loop joining the group its operands come from
/// when its sizes fit the group's tiling; horizontally, a loop joining an
/// earlier group it shares an operand with (Note [Horizontal fusion]); on a
/// GPU, only related loops (Note [Independent loops on a GPU]).
Fusion fuse(const Program& p, const ir::Graph& graph);

}  // namespace crucible::inductor::detail
