// Private: NVRTC compilation of generated CUDA C++ into cubins (cached on
// disk beside the C++ libraries) and the driver-API library that launches
// their kernels. The driver is opened with dlopen: it is installed with the
// GPU's driver, so a build links and runs on machines without one.
#pragma once

#include "codegen.h"

#include <crucible/inductor/options.h>

#include <memory>
#include <string>

namespace crucible::inductor::detail {

/// Whether this build has NVRTC (found at configure time).
bool have_nvrtc();

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

/// A cubin loaded for one device (the driver's context-independent
/// library, cuLibraryLoadData), its kernels looked up by name.
class CudaLibrary {
 public:
  /// Throws InductorError when the driver rejects `cubin` (a corrupt file,
  /// another architecture), quoting its error.
  CudaLibrary(const std::string& cubin, int device);
  ~CudaLibrary();
  CudaLibrary(const CudaLibrary&) = delete;
  CudaLibrary& operator=(const CudaLibrary&) = delete;

  /// The kernel `name`. Throws InductorError if the cubin has none.
  void* kernel(const std::string& name) const;

  /// Launches `kernel` on `stream` (a cudaStream_t of this library's
  /// device) with `args` (a pointer to each
  /// argument's value): launch.block threads a block, enough blocks for
  /// launch.units at launch.per_block each, at most a few waves of the
  /// device (kernels loop over the rest). Does nothing for no units.
  /// Throws InductorError naming `name` when the driver refuses.
  void launch(void* kernel, const std::string& name, const Launch& launch, void* stream, void** args) const;

 private:
  void* library_ = nullptr;
  int device_ = 0;
  int64_t max_blocks_ = 0;
};

}  // namespace crucible::inductor::detail
