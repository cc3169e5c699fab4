// Private: the scheduler (loops grouped into kernels) and the C++/OpenMP
// rendering of each kernel.
#pragma once

#include "loop_ir/loop_ir.h"

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
  /// compile_fx.cpp): every configuration to try at the first run, the
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

/// Lowers, schedules (Note [Fusion]) and renders `graph`: as C++/OpenMP
/// when its loops run on the CPU (`threads` > 0 fixes the OpenMP thread
/// count of every parallel loop), as CUDA C++ on a CUDA device.
Schedule compile_schedule(const ir::Graph& graph, int threads);

struct GroupInfo;

/// The CUDA C++ kernel `name` computing group `g` (cuda_codegen.cpp,
/// Note [CUDA rendering]); fills `sig`'s buffers and launch. May add
/// buffers to `info.external` (scratch rows too large for shared memory).
std::string render_cuda_group(const Program& p, const Group& g, GroupInfo& info, const std::string& name,
                              KernelSignature& sig);

/// One CUDA kernel launching the pointwise `groups` (independent of each
/// other) together: each runs its own grid-stride loop over a range of the
/// blocks (Note [Combined launches]); fills `sig` (the union of the groups'
/// buffers; a launch of exactly the blocks the parts take).
std::string render_cuda_combined(const Program& p, const std::vector<const Group*>& groups,
                                 const std::vector<GroupInfo*>& infos, const std::string& name, KernelSignature& sig);

/// The line the CUDA renderer puts before each kernel it renders: the
/// source splits there into units NVRTC compiles side by side, each of
/// them the prelude (everything before the first break) and some kernels
/// (Note [Parallel NVRTC] in cuda_builder.cpp).
inline constexpr const char* kCudaUnitBreak = "// ---- unit break (Note [Parallel NVRTC]) ----\n";

/// What every generated CUDA translation unit starts with: the integer
/// types and math functions the loop bodies name, for NVRTC, which has no
/// standard library.
const char* cuda_prelude();

/// The conversions between float and the 16-bit patterns of bf16 and f16
/// that loads and stores of such buffers call (Note [Reduced-precision
/// loops]), for NVRTC; a translation unit carries them where it names them.
const char* cuda_reduced_precision_prelude();

}  // namespace crucible::inductor::detail
