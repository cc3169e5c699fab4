// See collectives.h.
#include "group_state.h"

#include <crucible/spmd/collectives.h>
#include <crucible/spmd/error.h>

#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace crucible::spmd {

namespace {

// A collective issued and not yet waited for, keyed by the storage of the
// tensor it writes (wait_tensor may see another TensorImpl of it).
struct Pending {
  c10::intrusive_ptr<c10d::Work> work;
  at::Tensor out;
  int64_t divisor = 1;  // Avg on a backend without AVG: divide after the sum
  ProcessGroup group;
  const char* what = "crucible::wait_tensor: an all_reduce";  // the collective, as a failure names it
  uint64_t issued = 0;                                        // the collectives issued before it in this process
  bool reduce_scatter = false;                                // counted against kReduceScattersInFlight
};

std::mutex pending_mu;
uint64_t issued_collectives = 0;  // guarded by pending_mu
std::unordered_map<const c10::StorageImpl*, Pending>& pending() {
  static std::unordered_map<const c10::StorageImpl*, Pending> p;
  return p;
}

ReduceOp parse_reduce_op(c10::string_view s) {
  if (s == "sum") return ReduceOp::Sum;
  if (s == "avg") return ReduceOp::Avg;
  if (s == "max") return ReduceOp::Max;
  if (s == "min") return ReduceOp::Min;
  throw SpmdError("crucible::all_reduce: unknown reduce_op \"" + std::string(s) +
                  "\"; use \"sum\", \"avg\", \"max\" or \"min\"");
}

// The group a collective runs on, checked against the tensor it is given:
// Gloo reduces CPU tensors, and CUDA tensors where LibTorch is a CUDA
// build; NCCL reduces CUDA tensors only.
ProcessGroup group_for(const at::Tensor& t, c10::string_view group_name, const char* op_name) {
  ProcessGroup group = resolve_process_group(std::string(group_name));
  if (group.backend() == "nccl" && !t.is_cuda())
    throw SpmdError(std::string(op_name) + ": a " + t.device().str() + " tensor given to " + group.describe() +
                    ", which reduces CUDA tensors");
  return group;
}

// c10d's reduce op for `reduce_op` on `group`, and what the result is divided
// by once waited for (Avg on a backend without AVG sums first).
std::pair<c10d::ReduceOp, int64_t> c10d_reduce_op(c10::string_view reduce_op, const ProcessGroup& group) {
  switch (parse_reduce_op(reduce_op)) {
    case ReduceOp::Sum:
      return {c10d::ReduceOp::SUM, 1};
    case ReduceOp::Max:
      return {c10d::ReduceOp::MAX, 1};
    case ReduceOp::Min:
      return {c10d::ReduceOp::MIN, 1};
    case ReduceOp::Avg:
      break;
  }
  if (group.state()->native_avg) return {c10d::ReduceOp::AVG, 1};
  return {c10d::ReduceOp::SUM, group.size()};
}

void complete(Pending& p);

// Note [Reduce-scatters in flight]
// ProcessGroupNCCL may hold a collective's input until it is waited for
// (TORCH_NCCL_AVOID_RECORD_STREAMS: so that the caching allocator cannot
// hand its memory to the compute stream early), and the backends sink each
// wait to the first kernel that reads its result (Note [Sinking waits]):
// for a fully-sharded step's reduce_scatters, the update at the step's
// end. Every bucket of whole gradients would then live through the
// backward, which is the memory sharding exists to save. So issuing a
// reduce_scatter completes those issued more than kReduceScattersInFlight
// before it on its group, as FSDP2 waits for one reduce_scatter before
// issuing the next: for NCCL the compute stream waits for its end (long
// past, normally), and its input is let go. Its own wait_tensor then finds
// it done.
constexpr int kReduceScattersInFlight = 2;

// Records `work`, which writes `out` (the collective's own buffer, which
// nothing else reads), as pending until wait_tensor. `issue` starts it. A
// `reduce_scatter` completes those of its group beyond
// kReduceScattersInFlight.
template <typename Issue>
void issue(const at::Tensor& out, ProcessGroup group, int64_t divisor, const char* op_name, const char* what,
           Issue&& start, bool reduce_scatter = false) {
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = start(*group.state()->backend);
  } catch (const std::exception& e) {
    throw SpmdError(std::string(op_name) + " could not be issued on " + group.describe() + ": " +
                    detail::message_of(e));
  }
  std::optional<Pending> oldest;
  {
    std::lock_guard lock(pending_mu);
    const c10::StorageImpl* key = out.storage().unsafeGetStorageImpl();
    pending().insert_or_assign(
        key, Pending{std::move(work), out, divisor, group, what, issued_collectives++, reduce_scatter});
    if (!reduce_scatter) return;
    std::vector<decltype(pending().begin())> scatters;
    for (auto it = pending().begin(); it != pending().end(); ++it)
      if (it->second.reduce_scatter && it->second.group.state() == group.state()) scatters.push_back(it);
    if (scatters.size() <= kReduceScattersInFlight) return;
    auto first = *std::min_element(scatters.begin(), scatters.end(),
                                   [](const auto& a, const auto& b) { return a->second.issued < b->second.issued; });
    oldest.emplace(std::move(first->second));
    pending().erase(first);
  }
  complete(*oldest);
}

// Issues an all-reduce of `out` in place.
void issue_all_reduce(const at::Tensor& out, c10::string_view reduce_op, c10::string_view group_name,
                      const char* op_name) {
  ProcessGroup group = group_for(out, group_name, op_name);
  c10d::AllreduceOptions o;
  o.timeout = group.timeout();
  int64_t divisor = 1;
  std::tie(o.reduceOp, divisor) = c10d_reduce_op(reduce_op, group);
  issue(out, std::move(group), divisor, op_name, "crucible::wait_tensor: an all_reduce", [&](c10d::Backend& b) {
    std::vector<at::Tensor> tensors{out};
    return b.allreduce(tensors, o);
  });
}

at::Tensor all_reduce_kernel(const at::Tensor& input, c10::string_view reduce_op, c10::string_view group_name) {
  at::Tensor out = input.clone(at::MemoryFormat::Contiguous);
  issue_all_reduce(out, reduce_op, group_name, "crucible::all_reduce");
  return out;
}

// The numel of a bucket of `inputs`, which must hold one dtype on one device.
// Checked before dispatch too: the dispatcher cannot route an empty list.
int64_t bucket_numel(const at::TensorList inputs) {
  if (inputs.empty()) throw SpmdError("crucible::all_reduce_bucket: the bucket is empty; give it one tensor or more");
  int64_t numel = 0;
  for (const at::Tensor& t : inputs) {
    if (t.scalar_type() != inputs[0].scalar_type() || t.device() != inputs[0].device())
      throw SpmdError("crucible::all_reduce_bucket: a bucket holds one dtype on one device, but has " +
                      std::string(c10::toString(inputs[0].scalar_type())) + " on " + inputs[0].device().str() +
                      " and " + c10::toString(t.scalar_type()) + " on " + t.device().str() + "; bucket them apart");
    numel += t.numel();
  }
  return numel;
}

at::Tensor bucket_buffer(const at::TensorList inputs) {
  return at::empty({bucket_numel(inputs)}, inputs[0].options().memory_format(at::MemoryFormat::Contiguous));
}

// DDP's bucket: the inputs packed end to end into one buffer (the only copy:
// all_reduce would copy the packed bucket once more) and reduced as one.
at::Tensor all_reduce_bucket_kernel(const at::TensorList inputs, c10::string_view reduce_op,
                                    c10::string_view group_name) {
  at::Tensor out = bucket_buffer(inputs);
  std::vector<at::Tensor> flat;
  flat.reserve(inputs.size());
  for (const at::Tensor& t : inputs) flat.push_back(t.reshape({-1}));
  at::cat_out(out, flat);
  issue_all_reduce(out, reduce_op, group_name, "crucible::all_reduce_bucket");
  return out;
}

// The sizes of an all_gather's result (dim 0 times group_size) and of a
// reduce_scatter's (dim 0 divided by it).
std::vector<int64_t> collective_sizes(const at::Tensor& input, int64_t group_size, const char* op_name) {
  if (group_size < 1)
    throw SpmdError(std::string(op_name) + ": group_size is " + std::to_string(group_size) + "; give the group's size");
  if (input.dim() == 0)
    throw SpmdError(std::string(op_name) + " takes a tensor of one dimension or more and was given a 0-dim one; " +
                    "view it as [1]");
  return input.sizes().vec();
}
std::vector<int64_t> gathered_sizes(const at::Tensor& input, int64_t group_size, const char* op_name) {
  std::vector<int64_t> sizes = collective_sizes(input, group_size, op_name);
  sizes[0] *= group_size;
  return sizes;
}
std::vector<int64_t> scattered_sizes(const at::Tensor& input, int64_t group_size, const char* op_name) {
  std::vector<int64_t> sizes = collective_sizes(input, group_size, op_name);
  if (sizes[0] % group_size != 0)
    throw SpmdError(std::string(op_name) + ": dim 0 of the input (" + std::to_string(sizes[0]) +
                    ") is not a multiple of group_size " + std::to_string(group_size) + "; pad it to one");
  sizes[0] /= group_size;
  return sizes;
}

// `group_size` is part of the op for its meta kernel, which knows no group:
// it must be the group's.
void check_group_size(const ProcessGroup& group, int64_t group_size, const char* op_name) {
  if (group_size != group.size())
    throw SpmdError(std::string(op_name) + ": group_size " + std::to_string(group_size) + " but " + group.describe() +
                    " has " + std::to_string(group.size()) + " ranks");
}

// What a collective along dim 0 works on: the group, checked against the
// input and `group_size`; a new result of `sizes`; the input, contiguous.
struct Dim0Collective {
  ProcessGroup group;
  at::Tensor out, in;
};
Dim0Collective dim0_collective(const at::Tensor& input, const std::vector<int64_t>& sizes, int64_t group_size,
                               c10::string_view group_name, const char* op_name) {
  ProcessGroup group = group_for(input, group_name, op_name);
  check_group_size(group, group_size, op_name);
  return {std::move(group), at::empty(sizes, input.options().memory_format(at::MemoryFormat::Contiguous)),
          input.contiguous()};
}

at::Tensor all_gather_into_tensor_kernel(const at::Tensor& input, int64_t group_size, c10::string_view group_name) {
  constexpr const char* kOp = "crucible::all_gather_into_tensor";
  Dim0Collective c = dim0_collective(input, gathered_sizes(input, group_size, kOp), group_size, group_name, kOp);
  c10d::AllgatherOptions o;
  o.timeout = c.group.timeout();
  issue(c.out, std::move(c.group), 1, kOp, "crucible::wait_tensor: an all_gather",
        [&](c10d::Backend& b) { return b._allgather_base(c.out, c.in, o); });
  return c.out;
}

at::Tensor reduce_scatter_tensor_kernel(const at::Tensor& input, c10::string_view reduce_op, int64_t group_size,
                                        c10::string_view group_name) {
  constexpr const char* kOp = "crucible::reduce_scatter_tensor";
  Dim0Collective c = dim0_collective(input, scattered_sizes(input, group_size, kOp), group_size, group_name, kOp);
  c10d::ReduceScatterOptions o;
  o.timeout = c.group.timeout();
  int64_t divisor = 1;
  std::tie(o.reduceOp, divisor) = c10d_reduce_op(reduce_op, c.group);
  issue(
      c.out, std::move(c.group), divisor, kOp, "crucible::wait_tensor: a reduce_scatter",
      [&](c10d::Backend& b) { return b._reduce_scatter_base(c.out, c.in, o); }, /*reduce_scatter=*/true);
  return c.out;
}

// Note [Waiting for NCCL]
// WorkNCCL::wait with a timeout blocks the host until the collective ends,
// polling it between sleeps; the host then stops launching the rest of the
// step, the GPU drains, and bucketed all_reduces overlap with nothing (the
// first 2-GPU run of GPT-2 small: 1.1 ms per bucket, 57 ms for 50 buckets
// that NCCL moves in under 2). Without a timeout it makes the current stream
// wait for the collective's end event and returns at once, as PyTorch's
// _c10d_functional wait_tensor does. The timeout must still hold: a rank
// that died leaves the others' NCCL kernels waiting for it, and reading the
// loss would then block for good (ProcessGroupNCCL's watchdog notices after
// the timeout, but only ends the process a minute or more later, with no
// error for the program to catch: seen on 2 H100s). So an SpmdStep call
// keeps the collectives it waited for this way (AwaitedCollectives) and,
// once the whole step is launched, blocks on them with the timeout: by then
// the host has nothing left to launch, and the GPU runs the update while it
// waits. It polls them itself, every few microseconds: WorkNCCL::wait with
// a timeout sleeps between its polls, which each rank then added to its
// step at random, and the next step's first collective waited for the
// slowest rank (ResNet-18 on 4 H200s: 13.5 ms a step through
// WorkNCCL::wait, 8.9 ms polled here, 8.4 ms on one GPU). A timeout aborts
// the communicator and becomes an SpmdError naming the rank, as on Gloo,
// which completes on the host and waits with the timeout at wait_tensor
// itself.
//
// Note [A failed collective]
// Once one collective of a group failed, none of its others can complete.
// The first failure forgets the group's other pending collectives, whose
// results are lost with it (on two H100s, a Gloo survivor that kept them
// crashed at exit) and aborts the backend (ncclCommAbort for NCCL; Gloo,
// whose pairs are already closed, has nothing to abort). An aborted NCCL
// backend is then never destroyed: ProcessGroupNCCL's destructor joins its
// watchdog, which stays on the dead peer's work (a survivor wrote its
// error, then hung at exit until launch killed it). The group stays
// registered, and its later collectives fail.
void abandon(const ProcessGroup& group) {
  const c10::intrusive_ptr<c10d::Backend>& backend = group.state()->backend;
  try {
    backend->abort();
  } catch (const std::exception&) {  // already broken: nothing more to stop
  }
  if (group.backend() == "nccl") static_cast<void>(new c10::intrusive_ptr<c10d::Backend>(backend));  // leaked
  std::lock_guard lock(pending_mu);
  std::erase_if(pending(), [&](const auto& kv) { return kv.second.group.state() == group.state(); });
}

// `what`: the collective, as the error names it (AwaitedCollectives::Entry::what).
[[noreturn]] void collective_failed(int64_t numel, const ProcessGroup& group, const std::exception& e,
                                    const char* what = "crucible::wait_tensor: an all_reduce") {
  abandon(group);
  throw SpmdError(std::string(what) + " of " + std::to_string(numel) + " elements failed on " + group.describe() +
                  " after at most " + std::to_string(group.timeout().count() / 1000) +
                  " s: another rank died, timed out or issued other collectives (" + detail::message_of(e) + ")");
}

// Waits for `p`, taken out of pending() (Note [Waiting for NCCL]), and
// finishes its result.
void complete(Pending& p) {
  try {
    // See Note [Waiting for NCCL].
    if (p.group.backend() == "nccl") {
      p.work->wait();
      detail::keep_awaited({p.work, p.out.numel(), p.group});
    } else {
      p.work->wait(p.group.timeout());
    }
  } catch (const std::exception& e) {
    collective_failed(p.out.numel(), p.group, e, p.what);
  }
  if (p.divisor != 1) p.out.div_(p.divisor);
}

at::Tensor wait_tensor_kernel(const at::Tensor& input) {
  std::optional<Pending> found;
  {
    std::lock_guard lock(pending_mu);
    auto it = pending().find(input.storage().unsafeGetStorageImpl());
    if (it == pending().end()) return input;
    found.emplace(std::move(it->second));
    pending().erase(it);
  }
  complete(*found);
  return input;
}

at::Tensor tag_grad_kernel(const at::Tensor& grad) { return grad.clone(); }

at::Tensor like_meta(const at::Tensor& input) { return at::empty_like(input, at::MemoryFormat::Contiguous); }
at::Tensor all_reduce_meta(const at::Tensor& input, c10::string_view reduce_op, c10::string_view /*group*/) {
  parse_reduce_op(reduce_op);
  return like_meta(input);
}
at::Tensor all_reduce_bucket_meta(const at::TensorList inputs, c10::string_view reduce_op, c10::string_view /*group*/) {
  parse_reduce_op(reduce_op);
  return bucket_buffer(inputs);
}
at::Tensor all_gather_into_tensor_meta(const at::Tensor& input, int64_t group_size, c10::string_view /*group*/) {
  return at::empty(gathered_sizes(input, group_size, "crucible::all_gather_into_tensor"),
                   input.options().memory_format(at::MemoryFormat::Contiguous));
}
at::Tensor reduce_scatter_tensor_meta(const at::Tensor& input, c10::string_view reduce_op, int64_t group_size,
                                      c10::string_view /*group*/) {
  parse_reduce_op(reduce_op);
  return at::empty(scattered_sizes(input, group_size, "crucible::reduce_scatter_tensor"),
                   input.options().memory_format(at::MemoryFormat::Contiguous));
}
at::Tensor wait_tensor_meta(const at::Tensor& input) { return input; }

}  // namespace

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

at::Tensor all_reduce(const at::Tensor& input, ReduceOp op, const std::string& group_name) {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("crucible::all_reduce", "")
                                 .typed<at::Tensor(const at::Tensor&, c10::string_view, c10::string_view)>();
  return handle.call(input, to_string(op), group_name);
}

at::Tensor all_reduce_bucket(const std::vector<at::Tensor>& inputs, ReduceOp op, const std::string& group_name) {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("crucible::all_reduce_bucket", "")
                                 .typed<at::Tensor(at::TensorList, c10::string_view, c10::string_view)>();
  bucket_numel(inputs);
  return handle.call(inputs, to_string(op), group_name);
}

at::Tensor all_gather_into_tensor(const at::Tensor& input, int64_t group_size, const std::string& group_name) {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("crucible::all_gather_into_tensor", "")
                                 .typed<at::Tensor(const at::Tensor&, int64_t, c10::string_view)>();
  return handle.call(input, group_size, group_name);
}

at::Tensor reduce_scatter_tensor(const at::Tensor& input, ReduceOp op, int64_t group_size,
                                 const std::string& group_name) {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("crucible::reduce_scatter_tensor", "")
                                 .typed<at::Tensor(const at::Tensor&, c10::string_view, int64_t, c10::string_view)>();
  return handle.call(input, to_string(op), group_size, group_name);
}

at::Tensor wait_tensor(const at::Tensor& input) {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("crucible::wait_tensor", "")
                                 .typed<at::Tensor(const at::Tensor&)>();
  return handle.call(input);
}

at::Tensor tag_grad(const at::Tensor& grad) {
  static const auto handle =
      c10::Dispatcher::singleton().findSchemaOrThrow("crucible::tag_grad", "").typed<at::Tensor(const at::Tensor&)>();
  return handle.call(grad);
}

size_t pending_collectives() {
  std::lock_guard lock(pending_mu);
  return pending().size();
}

TORCH_LIBRARY_FRAGMENT(crucible, m) {
  m.def("all_reduce(Tensor input, str reduce_op, str group_name) -> Tensor");
  m.def("all_reduce_bucket(Tensor[] inputs, str reduce_op, str group_name) -> Tensor");
  m.def("all_gather_into_tensor(Tensor input, int group_size, str group_name) -> Tensor");
  m.def("reduce_scatter_tensor(Tensor input, str reduce_op, int group_size, str group_name) -> Tensor");
  m.def("wait_tensor(Tensor input) -> Tensor");
  m.def("tag_grad(Tensor grad) -> Tensor");
}
TORCH_LIBRARY_IMPL(crucible, CPU, m) {
  m.impl("all_reduce", &all_reduce_kernel);
  m.impl("all_reduce_bucket", &all_reduce_bucket_kernel);
  m.impl("all_gather_into_tensor", &all_gather_into_tensor_kernel);
  m.impl("reduce_scatter_tensor", &reduce_scatter_tensor_kernel);
  m.impl("wait_tensor", &wait_tensor_kernel);
  m.impl("tag_grad", &tag_grad_kernel);
}
TORCH_LIBRARY_IMPL(crucible, CUDA, m) {
  m.impl("all_reduce", &all_reduce_kernel);
  m.impl("all_reduce_bucket", &all_reduce_bucket_kernel);
  m.impl("all_gather_into_tensor", &all_gather_into_tensor_kernel);
  m.impl("reduce_scatter_tensor", &reduce_scatter_tensor_kernel);
  m.impl("wait_tensor", &wait_tensor_kernel);
  m.impl("tag_grad", &tag_grad_kernel);
}
TORCH_LIBRARY_IMPL(crucible, Meta, m) {
  m.impl("all_reduce", &all_reduce_meta);
  m.impl("all_reduce_bucket", &all_reduce_bucket_meta);
  m.impl("all_gather_into_tensor", &all_gather_into_tensor_meta);
  m.impl("reduce_scatter_tensor", &reduce_scatter_tensor_meta);
  m.impl("wait_tensor", &wait_tensor_meta);
  m.impl("tag_grad", &like_meta);
}

namespace detail {

namespace {
thread_local AwaitedCollectives* innermost = nullptr;
}

AwaitedCollectives::AwaitedCollectives() : outer_(innermost) { innermost = this; }
AwaitedCollectives::~AwaitedCollectives() { innermost = outer_; }

void AwaitedCollectives::await() {
  std::vector<Entry> entries = std::move(entries_);
  entries_.clear();
  for (Entry& e : entries) {
    try {
      // See Note [Waiting for NCCL]. Past the deadline, wait() throws the
      // timeout: the work started before it.
      const auto deadline = std::chrono::steady_clock::now() + e.group.timeout();
      while (!e.work->isCompleted() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      e.work->wait(e.group.timeout());
    } catch (const std::exception& err) {
      collective_failed(e.numel, e.group, err, e.what);
    }
  }
}

// A WorkNCCL holds its collective's output until it goes (for a gather, a
// whole parameter). Kept until the step's end, every parameter a
// fully-sharded step gathered lived through the step, which then peaked
// where replicate's does (2 H200s, GPT-2 small, batch 2 a GPU: 4734 MiB,
// replicate's 4763; 4548 once let go). So each new entry first drops those
// already complete without error: only a collective still in flight, or
// one that failed, has anything left for await() to report.
void keep_awaited(AwaitedCollectives::Entry entry) {
  if (innermost == nullptr) return;
  std::erase_if(innermost->entries_, [](const AwaitedCollectives::Entry& e) {
    return e.work->isCompleted() && e.work->exception() == nullptr;
  });
  innermost->entries_.push_back(std::move(entry));
}

void broadcast_awaited(const ProcessGroup& group, at::Tensor& tensor, int root, const char* what) {
  try {
    std::vector<at::Tensor> one{tensor};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.timeout = group.timeout();
    c10::intrusive_ptr<c10d::Work> work = group.state()->backend->broadcast(one, o);
    // See Note [Waiting for NCCL].
    if (group.backend() == "nccl") {
      work->wait();
      keep_awaited({work, tensor.numel(), group, what});
    } else {
      work->wait(group.timeout());
    }
  } catch (const std::exception& e) {
    collective_failed(tensor.numel(), group, e, what);
  }
}

}  // namespace detail

}  // namespace crucible::spmd
