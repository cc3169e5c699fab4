// Private: the CUDA C++ renderer (torch/_inductor/codegen/triton.py's
// part): the scheduler's groups as CUDA kernels compiled by NVRTC (Note
// [CUDA rendering] in codegen/cuda.cpp).
#pragma once

#include "schedule.h"

#include <string>
#include <vector>

namespace crucible::inductor::detail {

/// The CUDA C++ kernel `name` computing group `g` (Note [CUDA rendering]);
/// fills `sig`'s buffers and launch, and for a row kernel the
/// configurations the runtime may autotune (Note [Autotuning]). May add
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
/// (Note [Parallel NVRTC] in codecache/cuda_builder.cpp).
inline constexpr const char* kCudaUnitBreak = "// ---- unit break (Note [Parallel NVRTC]) ----\n";

}  // namespace crucible::inductor::detail
