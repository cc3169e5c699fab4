// Private: the choice among a CUDA kernel's configurations, timed at its
// first run (torch/_inductor/runtime/triton_heuristics.py's
// CachingAutotuner; Note [Autotuning] in runtime/autotune.cpp).
#pragma once

#include "runtime/plan.h"

#include <optional>
#include <string>

namespace crucible::inductor::detail {

/// The configuration stored in `cache_dir` for the kernels of `tuning_key`
/// on `tuning_device` (device_identity), one of `n`: nullopt where none is
/// stored, or what is stored is of another count or torn.
std::optional<int> stored_configuration(const std::string& cache_dir, const std::string& tuning_key,
                                        const std::string& tuning_device, int n);

/// The index in `st.configs` of the configuration to launch `st` with on
/// `stream` (its arguments `args`, as CudaLibrary::launch takes them):
/// chosen already, remembered in the plan or the cache directory, or timed
/// now on these arguments (every configuration launched; the chosen one
/// last). 0 while `stream` captures a CUDA graph. Throws InductorError when
/// the driver refuses the first configuration.
int choose_configuration(const Plan& plan, const Step& st, void* stream, void** args);

}  // namespace crucible::inductor::detail
