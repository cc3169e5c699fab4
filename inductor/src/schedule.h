// Private: what the scheduler decides, and the renderers and the run-time
// plan read: loops grouped into kernels (Group), the stage each loop takes
// in its kernel and which of a group's buffers reach memory (GroupInfo),
// how a CUDA kernel is launched (Launch), a generated kernel's signature,
// and a graph's compiled form (Schedule).
#pragma once

#include "loop_ir/loop_ir.h"

#include <string>
#include <unordered_set>
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
  /// outer and inner as kernel text spells them: the spelled extents of
  /// the loops that set them (Note [Dynamic sizes]).
  SizeExpr outer_size = 1, inner_size = 1;
  bool tiled = false;
  std::vector<int> loops;  // stage order
};

/// How a loop runs inside its group: once per outer index (Scalar), over
/// the inner range (Inner), or combined over the inner range (Reduce).
enum class Stage { Scalar, Inner, Reduce };

inline Stage stage_of(const Loop& l, const Group& g) {
  if (l.reduction) return Stage::Reduce;
  return l.numel() == g.outer ? Stage::Scalar : Stage::Inner;
}

/// The buffers a group's loops write, and those someone outside the group
/// reads (the graph, an extern kernel, another group): only the latter
/// reach memory.
struct GroupInfo {
  std::unordered_set<int> produced;  // buffers the group's loops write
  std::unordered_set<int> external;  // ... that someone outside reads
};

/// How a CUDA kernel is launched: `block` threads per block, and enough
/// blocks to cover `units` work items at `per_block` items a block (unless
/// `exact`, the runtime caps the grid at a few waves of the device; kernels
/// loop over what a grid does not cover). `shared_bytes` of dynamic shared
/// memory. A split column reduction (Note [Split column reductions]) also
/// takes, after its buffers, a workspace of `partial_bytes` and `arrivals`
/// zeroed unsigned counters, made by the runtime for each launch.
struct Launch {
  int block = 0;
  int64_t units = 0;
  int64_t per_block = 1;
  int shared_bytes = 0;
  bool exact = false;  // exactly units / per_block blocks, never capped (combined launches)
  int64_t partial_bytes = 0;
  int64_t arrivals = 0;
};

/// One way to run a CUDA kernel: the kernel `name` (the signature's own, or
/// a variant rendered beside it with the same parameters) launched as
/// `launch`.
struct KernelConfig {
  std::string name;
  Launch launch;
};

/// A generated kernel's signature as the runtime needs it: the buffers
/// passed to it, in argument order, and which of them it writes.
struct KernelSignature {
  std::string name;
  std::vector<int> buffers;
  std::vector<bool> written;
  Launch launch;      // CUDA kernels only
  std::string fuses;  // the graph nodes it computes, as its comment lists them
  /// CUDA kernels the runtime may autotune (Note [Autotuning] in
  /// runtime/autotune.cpp): every configuration to try at the first run, the
  /// first of them {name, launch}; empty for a kernel with one.
  std::vector<KernelConfig> configs;
  /// With configs: a hash of the kernel's text up to its buffers' names,
  /// what its tuned choice is remembered by on disk.
  std::string tuning_key;
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
  /// C++ (program.device is the CPU) or CUDA C++; empty when there is no
  /// generated kernel.
  std::string source;
};

}  // namespace crucible::inductor::detail
