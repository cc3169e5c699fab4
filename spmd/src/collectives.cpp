// See collectives.h.
#include "group_state.h"

#include <crucible/spmd/collectives.h>
#include <crucible/spmd/error.h>

#include <ATen/ATen.h>
#include <torch/library.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

namespace crucible::spmd {

namespace {

// A collective issued and not yet waited for, keyed by the storage of the
// tensor it writes (wait_tensor may see another TensorImpl of it).
struct Pending {
  c10::intrusive_ptr<c10d::Work> work;
  at::Tensor out;
  int64_t divisor = 1;  // Avg on a backend without AVG: divide after the sum
  ProcessGroup group;
};

std::mutex pending_mu;
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

// Issues an all-reduce of `out` in place and records it as pending until
// wait_tensor; `out` is the collective's own buffer, which nothing else reads.
void issue_all_reduce(const at::Tensor& out, c10::string_view reduce_op, c10::string_view group_name,
                      const char* op_name) {
  const ReduceOp op = parse_reduce_op(reduce_op);
  ProcessGroup group = resolve_process_group(std::string(group_name));
  const detail::GroupState& s = *group.state();
  // Gloo reduces CPU tensors, and CUDA tensors where LibTorch is a CUDA
  // build; NCCL reduces CUDA tensors only.
  if (s.backend_name == "nccl" && !out.is_cuda())
    throw SpmdError(std::string(op_name) + ": a " + out.device().str() + " tensor given to " + group.describe() +
                    ", which reduces CUDA tensors");
  c10d::AllreduceOptions o;
  o.timeout = group.timeout();
  int64_t divisor = 1;
  switch (op) {
    case ReduceOp::Sum:
      o.reduceOp = c10d::ReduceOp::SUM;
      break;
    case ReduceOp::Max:
      o.reduceOp = c10d::ReduceOp::MAX;
      break;
    case ReduceOp::Min:
      o.reduceOp = c10d::ReduceOp::MIN;
      break;
    case ReduceOp::Avg:
      o.reduceOp = s.native_avg ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;
      divisor = s.native_avg ? 1 : group.size();
      break;
  }
  std::vector<at::Tensor> tensors{out};
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = s.backend->allreduce(tensors, o);
  } catch (const std::exception& e) {
    throw SpmdError(std::string(op_name) + " could not be issued on " + group.describe() + ": " +
                    detail::message_of(e));
  }
  std::lock_guard lock(pending_mu);
  pending().insert_or_assign(out.storage().unsafeGetStorageImpl(),
                             Pending{std::move(work), out, divisor, std::move(group)});
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

at::Tensor wait_tensor_kernel(const at::Tensor& input) {
  std::optional<Pending> found;
  {
    std::lock_guard lock(pending_mu);
    auto it = pending().find(input.storage().unsafeGetStorageImpl());
    if (it == pending().end()) return input;
    found.emplace(std::move(it->second));
    pending().erase(it);
  }
  Pending& p = *found;
  try {
    // See Note [Waiting for NCCL].
    if (p.group.backend() == "nccl") {
      p.work->wait();
      detail::keep_awaited({p.work, p.out.numel(), p.group});
    } else {
      p.work->wait(p.group.timeout());
    }
  } catch (const std::exception& e) {
    collective_failed(p.out.numel(), p.group, e);
  }
  if (p.divisor != 1) p.out.div_(p.divisor);
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
  m.def("wait_tensor(Tensor input) -> Tensor");
  m.def("tag_grad(Tensor grad) -> Tensor");
}
TORCH_LIBRARY_IMPL(crucible, CPU, m) {
  m.impl("all_reduce", &all_reduce_kernel);
  m.impl("all_reduce_bucket", &all_reduce_bucket_kernel);
  m.impl("wait_tensor", &wait_tensor_kernel);
  m.impl("tag_grad", &tag_grad_kernel);
}
TORCH_LIBRARY_IMPL(crucible, CUDA, m) {
  m.impl("all_reduce", &all_reduce_kernel);
  m.impl("all_reduce_bucket", &all_reduce_bucket_kernel);
  m.impl("wait_tensor", &wait_tensor_kernel);
  m.impl("tag_grad", &tag_grad_kernel);
}
TORCH_LIBRARY_IMPL(crucible, Meta, m) {
  m.impl("all_reduce", &all_reduce_meta);
  m.impl("all_reduce_bucket", &all_reduce_bucket_meta);
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

void keep_awaited(AwaitedCollectives::Entry entry) {
  if (innermost != nullptr) innermost->entries_.push_back(std::move(entry));
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
