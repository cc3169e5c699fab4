// The memory a process has used at its most, where Crucible's memory figures
// come from (the benches, `crucible train --json`): compile, CUDA-graph
// capture and steps all count, as torch.cuda.max_memory_allocated() and
// max_memory_reserved() count them for PyTorch. And the memory a backend's
// plan says one call of a compiled graph holds, to set beside them.
#pragma once

#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

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

/// What a backend's run-time plan for one call of a compiled graph holds in
/// memory, by the plan alone (the graph's metadata: nothing runs), in
/// bytes. Memory the graph's inputs hold (parameters, optimizer state, the
/// batch) is the caller's and not counted; every buffer the call makes is,
/// from its allocation to the end of the step that reads it last, outputs
/// to the end of the call. Not counted: what extern kernels allocate for
/// themselves and free before they return (cuBLAS and cuDNN workspaces,
/// ATen's temporaries), and copies of inputs given in other strides than
/// the graph's. On a GPU each buffer counts as the caching allocator rounds
/// it (to 512 bytes), so that the peak compares with
/// max_memory_allocated() over the call minus what was allocated before.
/// The counterpart of torch/_inductor/memory.py's estimate_peak_memory.
struct PlannedMemory {
  /// The most the call holds at once beyond its inputs.
  int64_t peak_bytes = 0;
  /// Where: the step (in run order, from 0) during which it peaks, and what
  /// that step runs (an extern kernel's op name or a generated kernel's).
  size_t peak_step = 0;
  std::string peak_at{};
  /// What the outputs hold beyond the inputs when the call returns.
  int64_t output_bytes = 0;
  /// The bytes of every buffer the call makes, summed: what it would hold
  /// with nothing freed and nothing reused.
  int64_t allocated_bytes = 0;
  /// The graph's tensor inputs (storages the plan reads), summed.
  int64_t input_bytes = 0;
  /// Steps of the plan, buffers it allocates, and of those, how many take
  /// the memory of a dead buffer instead (Note [Buffer reuse] in the
  /// inductor) and how many lie in the call's arena (Note [Arena]).
  size_t steps = 0, buffers = 0, reused = 0, in_arena = 0;
  /// The arenas: how many, and their bytes summed. Each is one allocation,
  /// held from its first buffer's step to its last buffer's.
  size_t arenas = 0;
  int64_t arena_bytes = 0;
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
