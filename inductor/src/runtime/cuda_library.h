// Private: the driver-API side of generated CUDA kernels: cubins loaded
// for a device, their kernels looked up and launched. The driver is opened
// with dlopen: it is installed with the GPU's driver, so a build links and
// runs on machines without one. No NVRTC here (codecache/cuda_builder.h
// compiles the cubins): a compiled graph read back from a package loads
// its cubins with this alone.
#pragma once

#include "schedule.h"

#include <cstdint>
#include <string>
#include <vector>

namespace crucible::inductor::detail {

/// Whether `arch` names a virtual architecture ("compute_90": PTX, which
/// the driver compiles when loading it, for a GPU of that architecture or
/// a newer one) rather than a real one ("sm_90": a cubin for that GPU's
/// architecture only).
inline bool is_virtual_arch(const std::string& arch) { return arch.starts_with("compute_"); }

/// The file of `arch`'s code for the generated source's unit `unit`
/// (NVRTC's units, Note [Parallel NVRTC]) in an exported package: a cubin,
/// or PTX for a virtual architecture (Note [Packaged cubins] in
/// runtime/load_compiled.cpp).
inline std::string packaged_cubin(const std::string& arch, size_t unit) {
  return "inductor_" + arch + "_" + std::to_string(unit) + (is_virtual_arch(arch) ? ".ptx" : ".cubin");
}

/// The compute capability of CUDA device `device` as one number (major *
/// 10 + minor: 90 for an H100). Throws InductorError where the driver
/// cannot be loaded or has no such device, and where this build has no
/// CUDA driver header.
int compute_capability(int device);

/// CUDA device `device` as autotuning choices are remembered by (Note
/// [Autotuning]): its name and its multiprocessor count ("NVIDIA H100 80GB
/// HBM3, 132 SMs"). Throws as compute_capability does.
std::string device_identity(int device);

/// Cubins (or PTX, which the driver compiles for the device) loaded for
/// one device (the driver's context-independent libraries,
/// cuLibraryLoadData), their kernels looked up by name.
class CudaLibrary {
 public:
  /// Throws InductorError when the driver rejects one of `cubins` (a
  /// corrupt file, another architecture, PTX newer than the device),
  /// quoting its error.
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

  /// device_identity of the library's device.
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
