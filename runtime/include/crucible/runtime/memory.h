// The memory a process has used at its most, where Crucible's memory figures
// come from (the benches, `crucible train --json`): compile, CUDA-graph
// capture and steps all count, as torch.cuda.max_memory_allocated() and
// max_memory_reserved() count them for PyTorch.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>

namespace crucible::runtime {

/// Peaks since the process started or since the last reset_memory_peaks(),
/// in bytes.
struct MemoryPeaks {
  /// The process's resident set at its highest (VmHWM of /proc/self/status):
  /// CPU memory, LibTorch's and the compiler's alike.
  int64_t rss_bytes = 0;
  /// On a GPU, the caching allocator's bytes handed out to tensors at their
  /// highest (max_memory_allocated), and held from the driver (reserved:
  /// those, its cache and CUDA graphs' private pools; max_memory_reserved).
  std::optional<int64_t> device_allocated_bytes{};
  std::optional<int64_t> device_reserved_bytes{};
};

/// The peaks so far; the device's where `device` is a GPU. Throws nothing
/// (a figure it cannot read is 0).
MemoryPeaks memory_peaks(c10::Device device = c10::kCPU);

/// Starts the peaks again from what is in use now (VmHWM through
/// /proc/self/clear_refs, the allocator's peak statistics on `device`), so
/// that the next memory_peaks() measures what runs in between. Throws
/// nothing.
void reset_memory_peaks(c10::Device device = c10::kCPU);

}  // namespace crucible::runtime
