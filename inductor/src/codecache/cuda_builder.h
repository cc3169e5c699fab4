// Private: NVRTC compilation of generated CUDA C++ into cubins (cached on
// disk beside the C++ libraries). What loads and launches them is the
// run-time side's (runtime/cuda_library.h): a package loads without NVRTC.
#pragma once

#include <crucible/inductor/options.h>

#include <string>
#include <vector>

namespace crucible::inductor::detail {

/// The translation units of a generated CUDA source (Note [Parallel
/// NVRTC] in codecache/cuda_builder.cpp): the prelude and a share of the kernels
/// each, every kernel in one unit; the whole source when it has no unit
/// break. Deterministic: the same source splits the same way on every
/// machine, so each unit's cubin is found in the cache again.
std::vector<std::string> cuda_units(const std::string& source);

/// The cubins of `source`'s units (cuda_units), compiled by compile_cubin
/// on up to one thread per hardware thread. Throws what compile_cubin
/// throws for the first unit that fails.
std::vector<std::string> compile_cubins(const std::string& source, const std::string& arch,
                                        const InductorOptions& options);

/// The cubin (its bytes) of CUDA C++ `source` compiled by NVRTC for `arch`
/// ("sm_90"), or its PTX (text) for a virtual architecture ("compute_90",
/// which the driver compiles at load time for its GPU, of that
/// architecture or a newer one), through the cache: the key hashes the
/// source, the architecture, NVRTC's version and kCodegenVersion, and the
/// source is kept beside the cubin as k<key>.cu. Runs without a GPU.
/// Throws InductorError naming that file and quoting NVRTC's log when
/// NVRTC rejects the source (or the architecture), and when this build has
/// no NVRTC.
std::string compile_cubin(const std::string& source, const std::string& arch, const InductorOptions& options);

/// The architecture of CUDA device `device` as NVRTC names it ("sm_90").
/// Throws InductorError where the driver cannot be loaded or the device
/// is newer than this NVRTC knows.
std::string device_arch(int device);

}  // namespace crucible::inductor::detail
