// Private: the C++/OpenMP renderer (torch/_inductor/codegen/cpp.py).
#pragma once

#include "schedule.h"

#include <string>

namespace crucible::inductor::detail {

/// The C++ function `name` (`extern "C" void name(void* const* b)`, b[i]
/// the i-th buffer of `sig`) computing group `g` of `p` on the CPU:
/// OpenMP-parallel outer loops (`threads` > 0 fixes their thread count),
/// `omp simd` inner loops, and the forms Notes [Split loops], [Split
/// reductions] and [Kept row values] describe. Fills `sig`'s buffers.
std::string render_cpp_group(const Program& p, const Group& g, const GroupInfo& info, const std::string& name,
                             int threads, KernelSignature& sig);

}  // namespace crucible::inductor::detail
