// Private: the scheduler (loops grouped into kernels) and the C++/OpenMP
// rendering of each kernel.
#pragma once

#include "loop_ir.h"

#include <string>
#include <vector>

namespace crucible::inductor::detail {

/// Loops fused into one kernel: an outer loop over `outer` (parallel) and,
/// when `tiled`, per outer index a sequence of stages over the inner range
/// `inner` — torch/_inductor's (numel, rnumel) groups. A stage is a
/// reduction (combined over inner), a pointwise loop of outer·inner
/// elements, or one of `outer` elements (computed once per outer index).
struct Group {
  int64_t outer = 1;
  int64_t inner = 1;
  bool tiled = false;
  std::vector<int> loops;  // stage order
};

/// A generated kernel's signature as the runtime needs it: the buffers
/// passed to it, in argument order, and which of them it writes.
struct KernelSignature {
  std::string name;
  std::vector<int> buffers;
  std::vector<bool> written;
};

/// The compiled form of a Program: steps in run order, each an extern
/// kernel or a generated one, and the translation unit.
struct Schedule {
  Program program;
  std::vector<Group> groups;
  struct Step {
    const ir::Node* extern_node = nullptr;  // set: run through the dispatcher
    int kernel = -1;                        // otherwise: kernels[kernel]
  };
  std::vector<Step> steps;
  std::vector<KernelSignature> kernels;
  std::string source;  // empty when there is no generated kernel
};

/// Lowers, schedules (Note [Fusion]) and renders `graph`. `threads` > 0
/// fixes the OpenMP thread count of every parallel loop.
Schedule compile_schedule(const ir::Graph& graph, int threads);

}  // namespace crucible::inductor::detail
