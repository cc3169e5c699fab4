// Private: the run-time plan of a compiled graph (torch/_inductor's
// generated wrapper code, as data): slots for the tensors, and the steps
// that run extern kernels and generated ones in schedule order.
#pragma once

#include "codecache/cpp_builder.h"
#include "runtime/cuda_library.h"
#include "runtime/host_arith.h"
#include "runtime/threads.h"
#include "schedule.h"

#include <crucible/ir/graph.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace crucible::inductor::detail {

// Note [Run-time plan]
// compile_fx_inner turns the schedule into flat steps once; a call only
// indexes arrays. Every tensor the graph makes or takes has a slot (an
// IValue); a step is an extern kernel (a boxed dispatcher call, as the
// interpreter makes) or a generated kernel (raw pointers of its inputs, fresh
// contiguous outputs, one call into the loaded library). After each step the
// slots whose last reader it was are cleared, so a buffer lives from its
// producer to its last consumer. The graph is functional, and fused nodes are
// pure, so running steps in schedule order keeps every side effect where the
// graph put it (Note [Order of side effects]).

/// No slot.
inline constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();

/// Where an argument's value comes from: a slot, a constant of the graph,
/// or a list of either.
struct Source {
  enum Kind : uint8_t { Slot, Constant, TensorList, OptionalTensorList } kind = Slot;
  uint32_t slot = kNone;
  const c10::IValue* constant = nullptr;
  std::vector<Source> elements;  // lists; a None element is a Constant of None
};

/// A generated C++ kernel: its buffers' pointers, in signature order, and
/// the values of the graph's size symbols (Note [Dynamic sizes]).
using KernelFn = void (*)(void* const*, const int64_t*);

/// One buffer of a generated kernel's signature: read from a slot (checked
/// against the layout the code was generated for) or written into a fresh
/// tensor of that layout.
struct KernelArg {
  bool written = false;
  bool host_scalar = false;  // a 0-dim CPU tensor passed to a CUDA kernel by value
  Source source;             // read
  uint32_t slot = kNone;     // written
  uint32_t reuse = kNone;    // written: a dead buffer whose memory it takes (Note [Buffer reuse])
  uint32_t arena = kNone;    // written: the arena it lies in (Note [Arena]); kNone: a tensor of its own
  int64_t arena_offset = 0;  // and where, in bytes
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype = c10::kFloat;
};

/// One step of the plan: an extern kernel (a boxed dispatcher call, or
/// host arithmetic) or a generated kernel.
struct Step {
  // Extern kernel.
  const ir::Node* node = nullptr;
  std::optional<c10::OperatorHandle> op;
  std::vector<Source> args;
  std::vector<std::vector<uint32_t>> returns;  // per schema return: one slot, or a Tensor[]'s slots
  std::vector<bool> list_return;
  std::optional<HostArith> host;  // computed without the dispatcher (Note [Host arithmetic])
  // A result an arena holds (Note [Arena]): the op's out= overload, given
  // the result's layout at out_offset bytes into arena out_arena.
  std::optional<c10::OperatorHandle> out_op;
  uint32_t out_arena = kNone;
  int64_t out_offset = 0;
  std::vector<int64_t> out_sizes, out_strides;
  c10::ScalarType out_dtype = c10::kFloat;
  // Generated kernel: a C++ function, or a CUDA kernel and its launch.
  KernelFn fn = nullptr;
  void* cuda_kernel = nullptr;
  Launch launch;
  std::string kernel_name;
  // Note [Autotuning]: the configurations to choose from at the first run
  // (cuda_kernel and launch are the first), and the one chosen (-1: none yet).
  struct Config {
    void* kernel = nullptr;
    std::string name;
    Launch launch;
  };
  std::vector<Config> configs;
  std::string tuning_key;
  std::unique_ptr<std::atomic<int>> chosen;
  std::string fuses;  // what the kernel computes (for the profile)
  std::vector<KernelArg> kernel_args;
  // Both: slots to clear after the step, and the arenas allocated before it
  // and let go after it (Note [Arena]).
  std::vector<uint32_t> dead;
  std::vector<uint32_t> arenas_made, arenas_let_go;
};

/// A step's time over the calls profiled (Note [Per-step profile]).
struct StepTime {
  double ms = 0;
  int64_t calls = 0;
};

/// A compiled graph's plan, shared by its CompiledFn's calls.
struct Plan {
  /// With profile, prints where the calls spent their time (Note [Per-step
  /// profile] in runtime/profile.cpp).
  ~Plan();
  std::shared_ptr<ir::Graph> graph;  // owns the nodes and constants steps point at
  c10::Device device = c10::kCPU;    // where generated kernels run
  Library library;
  std::shared_ptr<CudaLibrary> cuda;
  size_t num_slots = 0;
  std::vector<uint32_t> input_slots;
  std::vector<Step> steps;
  std::vector<Source> outputs;
  /// Note [Arena]: the bytes of each arena a call allocates.
  std::vector<int64_t> arena_bytes;
  /// The values of the size symbols s0, s1, ... the graph was lowered at,
  /// which its C++ kernels take (Note [Dynamic sizes]); empty: none.
  std::vector<int64_t> size_symbols;
  bool profile = false;
  std::vector<StepTime> times;   // per step, with profile
  std::vector<double> first_ms;  // per step, the first call's share of times (the warm-up)
  // Note [Autotuning]: choices by tuning key, and where they are kept.
  mutable std::mutex tuning_mutex;
  mutable std::unordered_map<std::string, int> tuned;
  std::string cache_dir;
  std::string tuning_device;  // CudaLibrary::identity(), found once
  // Note [Threads on a shared machine]: the calls' thread count on the CPU
  // (none: OpenMP's own, or InductorOptions::threads baked into the code).
  std::unique_ptr<ThreadTuner> threads;
};

}  // namespace crucible::inductor::detail
