#include "runtime/cuda_graphs.h"

#include <crucible/inductor/compile_fx.h>
#include <crucible/inductor/error.h>
#include <crucible/ir/effects.h>
#include <crucible/ir/graph.h>
#include <crucible/ir/op_classes.h>

#include <c10/util/Exception.h>

#ifdef CRUCIBLE_HAVE_CUDA_GRAPHS
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>
#endif

namespace crucible::inductor {

// Note [CUDA graphs]
// Launching a kernel costs the host microseconds; a GPT-2 training step makes
// about 2,000 launches and dispatcher calls, so the GPU waits on the host. A
// CUDA graph records the launches of one call and replays them all with one,
// as torch.compile's mode="reduce-overhead" does (torch/_inductor/
// compile_fx.py's cudagraphify, cudagraph_trees.py). A replay repeats the
// recorded device work exactly — the same kernels on the same addresses with
// the same arguments — and none of the host's. Hence:
//  - a graph is captured only when all it computes is work on one device
//    (cuda_graph_blocker): a CPU input such as a learning rate or a step count
//    would be read once, at capture, and baked in (TrainStepOptions::
//    capturable keeps them on the device), and an op that reads a value back
//    to the host (item, nonzero) cannot be captured at all, nor a collective
//    (c10d tracks its work on the host);
//  - the first call runs as compiled (a warm-up: modules load, cuBLAS makes
//    its handles and workspaces outside any capture); the second captures,
//    on a side stream and into a private pool of the caching allocator, then
//    replays; later calls replay. The warm-up runs on that stream and
//    allocates into that pool too (Note [One pool for the warm-up and the
//    capture]);
//  - inputs that are module or optimizer state (InputKind Parameter, Buffer,
//    State) are read and written where they are, as PyTorch's static inputs;
//    when one of them is at another address at a later call (state loaded
//    anew), the graph is captured again. The other inputs (a batch) are
//    copied into buffers the capture reads, and copied back where the graph
//    writes into them;
//  - outputs live in the capture's pool, which the next replay overwrites,
//    so a call returns copies — except an output that is one of the inputs
//    or a view of a state input, which is returned as it is. A copy is made
//    of an output's storage, once per storage, and the output is made again
//    on it with its sizes, strides and offset: a view with gaps keeps
//    eager's strides, and outputs that view one another still do (Note
//    [Eager's strides at the outputs] in fx_passes/layout_opt.cpp);
//  - a capture that fails anyway (an op that syncs without saying so) is
//    ended and discarded, and the graph runs without CUDA graphs from then
//    on, with a warning.
// Random ops draw new numbers at every replay: the CUDA generator registers
// with the capture and advances its offset at each replay.

// Note [One pool for the warm-up and the capture]
// A capture allocates from a private pool, which only its graph's replays
// use. Had the warm-up allocated from the caching allocator's shared pool,
// its activations, freed when it returned, would stay reserved there beside
// the pool the capture then filled with the same activations again: a
// GPT-2 step reserved about 15 GiB more than it needed. So the warm-up runs
// on the capture's stream with that stream's allocations routed into the
// capture's pool (beginAllocateToPool), as torch's cudagraph_trees warm up
// inside the tree's pool, and the capture reuses the blocks the warm-up
// freed. The runner holds the pool from the warm-up on (a pool whose users
// all left may be handed back to the device) and lets it go when it is
// destroyed or when its capture failed; a capture again, after state was
// loaded anew, has no warm-up to share with and takes a new pool.

namespace {

std::string where_tensor_is(const ir::Value* v) {
  return v->has_meta() ? "a tensor on " + v->meta().device.str() : std::string("a tensor without metadata");
}

}  // namespace

namespace detail {

std::string cuda_graph_blocker(const ir::Graph& graph, c10::Device device) {
  if (!device.is_cuda()) return "the graph runs on " + device.str() + ", not on a GPU";
  for (const ir::Node* n : graph.nodes()) {
    if (n->is_placeholder()) {
      const ir::Value* v = n->result();
      if (!v->is_tensor() || !v->has_meta() || v->meta().device != device)
        return "input %" + v->name() + " is " + (v->is_tensor() ? where_tensor_is(v) : std::string("not a tensor")) +
               ": a replay would reuse the value it had at capture; keep it on " + device.str() +
               " (a training step's learning rate and step counts: TrainStepOptions::capturable)";
      continue;
    }
    if (!n->is_call()) continue;
    // A guard or a barrier has no result to name.
    const std::string what = n->num_results() ? "%" + n->result()->name() + " (" + n->target() + ")" : n->target();
    if (ir::is_op_class(n->target(), ir::OpClass::HostSync)) return what + " reads a tensor's value back to the host";
    // c10d keeps each collective's work on the host (issued, then waited),
    // which a replay would not redo.
    if (ir::is_collective(*n)) return what + " is a collective, which c10d tracks on the host";
    for (const auto& r : n->results()) {
      // An output the op leaves undefined (convolution_backward's unused
      // gradients) has neither metadata nor readers.
      if (!r->has_meta() && !r->has_users()) continue;
      if (!r->is_tensor())
        return "%" + r->name() + " (" + n->target() + ") is a value on the host, which a replay would not compute";
      if (!r->has_meta() || r->meta().device != device)
        return "%" + r->name() + " (" + n->target() + ") is " + where_tensor_is(r.get()) +
               ", which a replay would not compute";
    }
  }
  return {};
}

#ifdef CRUCIBLE_HAVE_CUDA_GRAPHS
namespace {

struct Captured {
  at::cuda::CUDAGraph graph;
  std::vector<at::Tensor> inputs;          // what the capture read: state inputs, copies of the others
  std::vector<const void*> addresses;      // the state inputs' data at capture
  std::vector<at::Tensor> outputs;         // in the capture's pool (or inputs / views of state)
  std::vector<int> output_input;           // per output: the input it is, or -1
  std::vector<bool> output_is_state_view;  // per output: a view of a state input (returned as is)
};

// A hold on a private pool of the caching allocator: see Note [One pool for
// the warm-up and the capture].
class PoolHold {
 public:
  explicit PoolHold(c10::DeviceIndex device) : device_(device), id_(at::cuda::graph_pool_handle()) {}
  PoolHold(const PoolHold&) = delete;
  PoolHold& operator=(const PoolHold&) = delete;
  ~PoolHold() {
    if (held_) c10::cuda::CUDACachingAllocator::releasePool(device_, id_);
  }
  c10::MempoolId_t id() const { return id_; }
  // Runs `body` with the allocations of `stream` routed into the pool, which
  // creates it; it is held from then on. Called once.
  template <typename F>
  auto allocate_into(const c10::cuda::CUDAStream& stream, F&& body) {
    c10::cuda::CUDACachingAllocator::beginAllocateToPool(device_, id_,
                                                         [s = stream.stream()](cudaStream_t t) { return t == s; });
    held_ = true;
    struct End {
      c10::DeviceIndex device;
      c10::MempoolId_t id;
      ~End() { c10::cuda::CUDACachingAllocator::endAllocateToPool(device, id); }
    } end{device_, id_};
    return body();
  }

 private:
  c10::DeviceIndex device_;
  c10::MempoolId_t id_;
  bool held_ = false;
};

struct CudaGraphRunner {
  ir::CompiledFn fn;
  c10::Device device = c10::kCUDA;
  std::vector<bool> is_state;  // per input: read in place (Parameter, Buffer, State)
  std::vector<bool> written;   // per input: the graph writes into it
  std::mutex mu;               // one call at a time: replays share the buffers
  int64_t calls = 0;
  bool disabled = false;
  // The stream the warm-up and the captures run on, and their pool.
  std::optional<c10::cuda::CUDAStream> stream;
  std::unique_ptr<PoolHold> pool;
  std::unique_ptr<Captured> captured;

  std::vector<at::Tensor> operator()(std::vector<at::Tensor>& inputs) {
    std::lock_guard lock(mu);
    if (disabled) return fn(inputs);
    if (calls++ == 0) return warm_up(inputs);
    if (inputs.size() != is_state.size())
      throw InductorError("inductor: the compiled graph takes " + std::to_string(is_state.size()) + " inputs, got " +
                          std::to_string(inputs.size()));
    if (!captured || !same_state(inputs)) {
      if (captured) {
        // A capture again (state loaded anew) takes a pool of its own: the
        // pinned-host side of a graph's pool may not be reused once the
        // graph that made it is gone (CachingHostAllocator refuses it).
        captured.reset();
        pool = std::make_unique<PoolHold>(device.index());
      }
      if (!capture(inputs)) {
        disabled = true;
        pool.reset();
        return fn(inputs);
      }
    } else {
      for (size_t i = 0; i < inputs.size(); ++i)
        if (!is_state[i]) captured->inputs[i].copy_(inputs[i]);
    }
    // The replay writes state inputs in place without the dispatcher: Note
    // [Version counters of inputs written in place] in
    // runtime/kernel_runner.cpp.
    for (size_t i = 0; i < inputs.size(); ++i)
      if (written[i] && is_state[i]) inputs[i].unsafeGetTensorImpl()->bump_version();
    captured->graph.replay();
    std::vector<at::Tensor> out;
    out.reserve(captured->outputs.size());
    std::vector<std::pair<const c10::StorageImpl*, c10::Storage>> copies;  // a storage of the pool, its copy
    for (size_t j = 0; j < captured->outputs.size(); ++j) {
      const int in = captured->output_input[j];
      const at::Tensor& o = captured->outputs[j];
      if (in >= 0) {
        out.push_back(inputs[static_cast<size_t>(in)]);
      } else if (captured->output_is_state_view[j] || !o.defined()) {
        out.push_back(o);
      } else {
        const c10::StorageImpl* storage = o.storage().unsafeGetStorageImpl();
        auto copy = std::find_if(copies.begin(), copies.end(), [&](const auto& c) { return c.first == storage; });
        if (copy == copies.end())
          copy = copies.emplace(copies.end(), storage,
                                at::empty({0}, o.options().dtype(at::kByte)).set_(o.storage()).clone().storage());
        out.push_back(at::empty({0}, o.options()).set_(copy->second, o.storage_offset(), o.sizes(), o.strides()));
      }
    }
    for (size_t i = 0; i < inputs.size(); ++i)
      if (written[i] && !is_state[i]) inputs[i].copy_(captured->inputs[i]);
    inputs.clear();
    return out;
  }

  bool same_state(const std::vector<at::Tensor>& inputs) const {
    for (size_t i = 0; i < inputs.size(); ++i) {
      const at::Tensor& t = inputs[i];
      const at::Tensor& c = captured->inputs[i];
      if (is_state[i] ? (t.const_data_ptr() != captured->addresses[i] || t.strides() != c.strides())
                      : t.scalar_type() != c.scalar_type())
        return false;
      if (t.sizes() != c.sizes() || t.device() != c.device()) return false;
    }
    return true;
  }

  // The first call, run as compiled on the capture's stream and into its
  // pool (Note [One pool for the warm-up and the capture]); the caller's
  // stream waits for it.
  std::vector<at::Tensor> warm_up(std::vector<at::Tensor>& inputs) {
    c10::cuda::CUDAGuard guard(device);
    const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(device.index());
    stream = c10::cuda::getStreamFromPool(false, device.index());
    pool = std::make_unique<PoolHold>(device.index());
    at::cuda::CUDAEvent ready;
    ready.record(caller);
    ready.block(*stream);
    std::vector<at::Tensor> out;
    {
      c10::cuda::CUDAStreamGuard on_side(*stream);
      out = pool->allocate_into(*stream, [&] { return fn(inputs); });
    }
    at::cuda::CUDAEvent done;
    done.record(*stream);
    done.block(caller);
    return out;
  }

  // Captures one call on the state in `inputs` and the values of the others;
  // false when the capture failed (then nothing ran: a capture only records).
  bool capture(const std::vector<at::Tensor>& inputs) {
    auto c = std::make_unique<Captured>();
    for (size_t i = 0; i < inputs.size(); ++i) {
      const at::Tensor& t = inputs[i];
      if (is_state[i]) {
        c->inputs.push_back(t);
        c->addresses.push_back(t.const_data_ptr());
        continue;
      }
      // Dense inputs keep their strides (the kernels expect the graph's);
      // others (expanded) become contiguous, and the plan copies them.
      at::Tensor s = t.is_non_overlapping_and_dense() ? at::empty_strided(t.sizes(), t.strides(), t.options())
                                                      : at::empty(t.sizes(), t.options());
      s.copy_(t);
      c->inputs.push_back(std::move(s));
      c->addresses.push_back(nullptr);
    }
    c10::cuda::CUDAGuard guard(device);
    const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(device.index());
    const c10::cuda::CUDAStream side = *stream;
    at::cuda::CUDAEvent ready;
    ready.record(caller);  // the copies above
    ready.block(side);
    std::vector<at::Tensor> outputs;
    {
      c10::cuda::CUDAStreamGuard on_side(side);
      try {
        c->graph.capture_begin(pool->id());
        std::vector<at::Tensor> in = c->inputs;
        outputs = fn(in);
        c->graph.capture_end();
      } catch (const std::exception& e) {
        end_failed_capture(side);
        TORCH_WARN("inductor: CUDA graph capture failed (", e.what(), "); this graph runs without CUDA graphs");
        return false;
      }
    }
    for (const at::Tensor& o : outputs) {
      int input = -1;
      bool state_view = false;
      for (size_t i = 0; i < c->inputs.size(); ++i) {
        if (o.unsafeGetTensorImpl() == c->inputs[i].unsafeGetTensorImpl()) input = static_cast<int>(i);
        if (is_state[i] && o.storage().is_alias_of(c->inputs[i].storage())) state_view = true;
      }
      c->output_input.push_back(input);
      c->output_is_state_view.push_back(state_view);
    }
    c->outputs = std::move(outputs);
    captured = std::move(c);
    return true;
  }

  // After an exception inside a capture: the stream may still be capturing
  // (or its capture invalidated); end it and drop what it recorded.
  static void end_failed_capture(const c10::cuda::CUDAStream& stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream.stream(), &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
      cudaGraph_t g = nullptr;
      if (cudaStreamEndCapture(stream.stream(), &g) == cudaSuccess && g) cudaGraphDestroy(g);
    }
    (void)cudaGetLastError();  // an invalidated capture leaves its error here
  }
};

}  // namespace

ir::CompiledFn cudagraphify(ir::CompiledFn fn, const ir::Graph& graph, c10::Device device) {
  auto runner = std::make_shared<CudaGraphRunner>();
  runner->fn = std::move(fn);
  runner->device = device;
  const std::vector<ir::Value*> placeholders = graph.placeholders();
  const auto& specs = graph.signature().inputs;
  for (size_t i = 0; i < placeholders.size(); ++i) {
    const ir::InputKind k = specs.size() == placeholders.size() ? specs[i].kind : ir::InputKind::UserInput;
    runner->is_state.push_back(k == ir::InputKind::Parameter || k == ir::InputKind::Buffer ||
                               k == ir::InputKind::State);
  }
  runner->written = ir::placeholders_written(graph);
  return [runner](std::vector<at::Tensor>& inputs) { return (*runner)(inputs); };
}
#else
ir::CompiledFn cudagraphify(ir::CompiledFn, const ir::Graph&, c10::Device device) {
  throw InductorError("inductor: CUDA graphs for a graph on " + device.str() +
                      " need a LibTorch with CUDA and the CUDA runtime's headers and library (Crucible's build "
                      "found none)");
}
#endif

ir::CompiledFn with_cuda_graphs(ir::CompiledFn fn, const ir::Graph& graph, c10::Device device, bool cuda_graphs,
                                bool profile) {
  if (!cuda_graphs) return fn;
  const std::string blocker =
      profile ? std::string("profiling times each step apart") : cuda_graph_blocker(graph, device);
  if (!blocker.empty()) {
    TORCH_WARN("inductor: skipping CUDA graphs: ", blocker);
    return fn;
  }
  return cudagraphify(std::move(fn), graph, device);
}

}  // namespace detail

}  // namespace crucible::inductor
