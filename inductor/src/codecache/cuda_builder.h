// Private: NVRTC compilation of generated CUDA C++ into cubins (cached on
// disk beside the C++ libraries) and the driver-API library that launches
// their kernels. The driver is opened with dlopen: it is installed with the
// GPU's driver, so a build links and runs on machines without one.
#pragma once

#include "schedule.h"

#include <crucible/inductor/options.h>

#include <memory>
#include <string>
#include <vector>

namespace crucible::inductor::detail {

/// Whether this build has NVRTC (found at configure time).
bool have_nvrtc();

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
/// ("sm_90"), through the cache: the key hashes the source, the
/// architecture, NVRTC's version and kCodegenVersion, and the source is
/// kept beside the cubin as k<key>.cu. Runs without a GPU. Throws
/// InductorError naming that file and quoting NVRTC's log when NVRTC
/// rejects the source, and when this build has no NVRTC.
std::string compile_cubin(const std::string& source, const std::string& arch, const InductorOptions& options);

/// The architecture of CUDA device `device` as NVRTC names it ("sm_90").
/// Throws InductorError where the driver cannot be loaded or the device
/// is newer than this NVRTC knows.
std::string device_arch(int device);

/// Cubins loaded for one device (the driver's context-independent
/// libraries, cuLibraryLoadData), their kernels looked up by name.
class CudaLibrary {
 public:
  /// Throws InductorError when the driver rejects one of `cubins` (a
  /// corrupt file, another architecture), quoting its error.
  CudaLibrary(const std::vector<std::string>& cubins, int device);
  ~CudaLibrary();
  CudaLibrary(const CudaLibrary&) = delete;
  CudaLibrary& operator=(const CudaLibrary&) = delete;

  /// The kernel `name`. Throws InductorError if no cubin has it.
  void* kernel(const std::string& name) const;

  /// Launches `kernel` on `stream` (a cudaStream_t of this library's
  /// device) with `args` (a pointer to each
  /// argument's value): launch.block threads a block, enough blocks for
  /// launch.units at launch.per_block each, at most a few waves of the
  /// device (kernels loop over the rest). Does nothing for no units.
  /// Throws InductorError naming `name` when the driver refuses.
  void launch(void* kernel, const std::string& name, const Launch& launch, void* stream, void** args) const;

  /// The device as timings made on it are remembered by: its name and its
  /// multiprocessor count ("NVIDIA H100 80GB HBM3, 132 SMs").
  std::string identity() const;

  /// The blocks launch() gives `launch`.
  int64_t blocks(const Launch& launch) const;

  /// Whether `stream` is capturing a CUDA graph (its work then only
  /// recorded: nothing on it can be timed or waited for). Throws
  /// InductorError when the driver cannot say.
  bool capturing(void* stream) const;

 private:
  std::vector<void*> libraries_;
  int device_ = 0;
  int64_t max_blocks_ = 0;
};

}  // namespace crucible::inductor::detail
