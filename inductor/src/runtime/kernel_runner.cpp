// Running a plan's steps: see runtime/kernel_runner.h.
#include "runtime/kernel_runner.h"

#include "runtime/autotune.h"

#include <crucible/inductor/error.h>

#include <ATen/core/List.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/intrusive_ptr.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <utility>

namespace crucible::inductor::detail {

namespace {

// Note [Arena] in runtime/memory_plan.cpp: a call's arenas while they are
// held, and the dispatch keys of a tensor on the plan's device.
struct CallArenas {
  std::vector<c10::Storage> storages;
  c10::DispatchKeySet keys;
};

// A tensor of this layout `offset` bytes into arena `arena`: a TensorImpl
// on the arena's storage, made without a dispatcher call (the plan aligns
// the offset to every element size).
at::Tensor in_arena(const CallArenas& arenas, uint32_t arena, int64_t offset, c10::IntArrayRef sizes,
                    c10::IntArrayRef strides, c10::ScalarType dtype) {
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(arenas.storages[arena]), arenas.keys,
                                                          c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides,
                                                 offset / static_cast<int64_t>(c10::elementSize(dtype)));
  return t;
}

c10::IValue read(const Source& s, std::vector<c10::IValue>& slots) {
  switch (s.kind) {
    case Source::Slot:
      return slots[s.slot];
    case Source::Constant:
      return *s.constant;
    case Source::TensorList: {
      c10::List<at::Tensor> list;
      for (const Source& e : s.elements) list.push_back(read(e, slots).toTensor());
      return list;
    }
    case Source::OptionalTensorList: {
      c10::List<std::optional<at::Tensor>> list;
      for (const Source& e : s.elements) {
        c10::IValue v = read(e, slots);
        list.push_back(v.isNone() ? std::optional<at::Tensor>() : std::optional<at::Tensor>(v.toTensor()));
      }
      return list;
    }
  }
  return {};
}

// Note [Host arithmetic] in runtime/host_arith.cpp: false where an operand
// is not what the graph said (the step then runs through the dispatcher).
bool run_host_arith(const Step& st, std::vector<c10::IValue>& slots) {
  const HostArith& h = *st.host;
  std::array<double, 2> x = h.constant;
  for (size_t i = 0; i < 2; ++i) {
    if (h.arg[i] < 0) continue;
    const Source& s = st.args[static_cast<size_t>(h.arg[i])];
    const c10::IValue& v = s.kind == Source::Slot ? slots[s.slot] : *s.constant;
    const std::optional<double> d = v.isTensor() ? host_double(v.toTensor()) : std::nullopt;
    if (!d) return false;
    x[i] = *d;
  }
  slots[st.returns[0][0]] = host_tensor(evaluate(h, x[0], x[1]));
  return true;
}

void run_extern(const Step& st, std::vector<c10::IValue>& slots, const CallArenas& arenas) {
  if (st.host && run_host_arith(st, slots)) return;
  torch::jit::Stack stack;
  stack.reserve(st.args.size() + 1);
  for (const Source& s : st.args) stack.push_back(read(s, slots));
  if (st.out_op)
    stack.emplace_back(in_arena(arenas, st.out_arena, st.out_offset, st.out_sizes, st.out_strides, st.out_dtype));
  try {
    (st.out_op ? *st.out_op : *st.op).callBoxed(stack);
  } catch (const std::exception& e) {
    // A guard or an assert has no result to name.
    const std::string name =
        st.node->num_results() ? "%" + st.node->result(0)->name() + " (" + st.node->target() + ")" : st.node->target();
    throw InductorError("inductor: extern kernel " + name + " failed: " + e.what());
  }
  for (size_t r = 0; r < st.returns.size(); ++r) {
    if (st.list_return[r]) {
      c10::List<at::Tensor> list = std::move(stack[r]).toTensorList();
      for (size_t j = 0; j < st.returns[r].size(); ++j) slots[st.returns[r][j]] = list.get(j);
    } else {
      slots[st.returns[r][0]] = std::move(stack[r]);
    }
  }
}

bool same_layout(const at::Tensor& t, const KernelArg& a) {
  if (t.scalar_type() != a.dtype || t.sizes() != c10::IntArrayRef(a.sizes)) return false;
  for (size_t d = 0; d < a.sizes.size(); ++d)
    if (a.sizes[d] > 1 && t.stride(static_cast<int64_t>(d)) != a.strides[d]) return false;
  return true;
}

// Note [Version counters of inputs written in place]
// A loop kernel that writes a graph input in place (Note [In-place
// write-backs]: an input mutation kept in the inference graph, an optimizer
// update) writes the caller's memory without the dispatcher, so nothing
// bumps the tensor's version counter as eager's in-place op does. Without
// the bump a tensor autograd saved before the call is read by a later
// backward as silently changed, where eager raises "modified by an inplace
// operation"; and an inference tensor would be written outside
// InferenceMode, which eager refuses. So each input a kernel writes is
// bumped before the kernel runs: bump_version() refuses an inference tensor
// outside InferenceMode with eager's message, before anything is written.
void run_kernel(const Plan& plan, const Step& st, std::vector<c10::IValue>& slots, const CallArenas& arenas) {
  const at::TensorOptions device = at::TensorOptions().device(plan.device);
  std::vector<at::Tensor> keep;
  keep.reserve(st.kernel_args.size());
  std::vector<void*> ptrs(st.kernel_args.size());
  std::vector<uint64_t> scalars(plan.cuda ? st.kernel_args.size() : 0);  // host scalars' values (CUDA only)
  std::vector<std::pair<at::Tensor, at::Tensor>> write_back;             // (caller's tensor, the copy written)
  for (size_t i = 0; i < st.kernel_args.size(); ++i) {
    const KernelArg& a = st.kernel_args[i];
    if (a.written && a.slot != kNone) continue;
    at::Tensor t = read(a.source, slots).toTensor();
    if (a.host_scalar) {
      // A float64 step count or learning rate read as float or double
      // needs no dispatcher call (Note [Host arithmetic]).
      const std::optional<double> d = host_double(t);
      if (d && a.dtype == c10::kFloat) {
        const auto f = static_cast<float>(*d);
        std::memcpy(&scalars[i], &f, sizeof f);
      } else if (d && a.dtype == c10::kDouble) {
        std::memcpy(&scalars[i], &*d, sizeof *d);
      } else {
        const at::Tensor v = t.to(at::kCPU, a.dtype);
        std::memcpy(&scalars[i], v.const_data_ptr(), v.element_size());
      }
      ptrs[i] = nullptr;
      continue;
    }
    // See Note [Version counters of inputs written in place].
    if (a.written) t.unsafeGetTensorImpl()->bump_version();
    // Guard the layout the kernel was generated for: a caller may pass a
    // tensor whose strides or dtype differ from the graph's metadata.
    if (!same_layout(t, a)) {
      if (t.sizes() != c10::IntArrayRef(a.sizes))
        throw InductorError("inductor: " + st.kernel_name + " expects an input of sizes " +
                            c10::str(c10::IntArrayRef(a.sizes)) + ", got " + c10::str(t.sizes()) +
                            "; the inputs differ from the compiled graph's");
      at::Tensor c = at::empty_strided(a.sizes, a.strides, device.dtype(a.dtype));
      c.copy_(t);
      if (a.written) write_back.emplace_back(t, c);  // an input written in place: copied back after
      t = std::move(c);
    }
    ptrs[i] = t.data_ptr();
    keep.push_back(std::move(t));
  }
  for (size_t i = 0; i < st.kernel_args.size(); ++i) {
    const KernelArg& a = st.kernel_args[i];
    if (!a.written || a.slot == kNone) continue;
    at::Tensor t;
    if (a.arena != kNone) {
      t = in_arena(arenas, a.arena, a.arena_offset, a.sizes, a.strides, a.dtype);
    } else if (a.reuse != kNone) {  // Note [Buffer reuse]
      const at::Tensor dead = std::exchange(slots[a.reuse], c10::IValue()).toTensor();
      if (dead.use_count() == 1 && dead.storage().use_count() == 1)
        t = at::empty({0}, device.dtype(a.dtype)).set_(dead.storage(), 0, a.sizes, a.strides);
    }
    if (!t.defined()) t = at::empty_strided(a.sizes, a.strides, device.dtype(a.dtype));
    ptrs[i] = t.data_ptr();
    slots[a.slot] = std::move(t);
  }
  if (st.fn) {
    st.fn(ptrs.data(), plan.size_symbols.data());
  } else {
    // On the caller's current stream, after the extern kernels queued there.
    void* stream = c10::impl::getDeviceGuardImpl(c10::kCUDA)->getStream(plan.device).native_handle();
    std::vector<void*> args(ptrs.size());
    for (size_t i = 0; i < ptrs.size(); ++i)
      args[i] = st.kernel_args[i].host_scalar ? static_cast<void*>(&scalars[i]) : static_cast<void*>(&ptrs[i]);
    // A split column reduction's partials and zeroed arrival counts, made
    // on this stream (Note [Split column reductions] in codegen/cuda.cpp).
    std::array<void*, 2> workspace{};
    if (st.launch.arrivals > 0) {
      keep.push_back(at::empty({st.launch.partial_bytes}, device.dtype(at::kByte)));
      workspace[0] = keep.back().data_ptr();
      keep.push_back(at::zeros({st.launch.arrivals}, device.dtype(at::kInt)));
      workspace[1] = keep.back().data_ptr();
      args.push_back(&workspace[0]);
      args.push_back(&workspace[1]);
    }
    if (st.configs.empty()) {
      plan.cuda->launch(st.cuda_kernel, st.kernel_name, st.launch, stream, args.data());
    } else {
      const Step::Config& c = st.configs[static_cast<size_t>(choose_configuration(plan, st, stream, args.data()))];
      plan.cuda->launch(c.kernel, c.name, c.launch, stream, args.data());
    }
  }
  for (auto& [caller, written] : write_back) caller.copy_(written);
}

std::vector<at::Tensor> run_steps(Plan& plan, std::vector<at::Tensor>& inputs) {
  if (inputs.size() != plan.input_slots.size())
    throw InductorError("inductor: the compiled graph takes " + std::to_string(plan.input_slots.size()) +
                        " inputs, got " + std::to_string(inputs.size()));
  std::vector<c10::IValue> slots(plan.num_slots);
  for (size_t i = 0; i < inputs.size(); ++i) slots[plan.input_slots[i]] = std::move(inputs[i]);
  inputs.clear();
  std::optional<c10::DeviceGuard> guard;
  if (plan.cuda) guard.emplace(plan.device);
  const bool on_gpu = plan.device.is_cuda() && plan.profile;
  std::vector<c10::Event> events;  // a start and an end per step (profile on a GPU)
  CallArenas arenas;
  arenas.storages.resize(plan.arena_bytes.size());
  // To tell that no output lies in one; weak, so that an arena let go frees
  // its bytes but no other storage takes its address.
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> arena_storages;
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const Step& st = plan.steps[i];
    for (uint32_t a : st.arenas_made) {
      const at::Tensor t = at::empty({plan.arena_bytes[a]}, at::TensorOptions().device(plan.device).dtype(at::kByte));
      arenas.storages[a] = t.storage();
      arenas.keys = t.key_set();
      arena_storages.push_back(t.storage().getWeakStorageImpl());
    }
    const auto start = plan.profile ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    if (on_gpu) {
      events.emplace_back(c10::kCUDA, c10::EventFlag::BACKEND_DEFAULT);
      events.back().record(c10::impl::getDeviceGuardImpl(c10::kCUDA)->getStream(plan.device));
    }
    if (st.fn || st.cuda_kernel)
      run_kernel(plan, st, slots, arenas);
    else
      run_extern(st, slots, arenas);
    for (uint32_t d : st.dead) slots[d] = c10::IValue();
    for (uint32_t a : st.arenas_let_go) arenas.storages[a] = {};
    if (on_gpu) {
      events.emplace_back(c10::kCUDA, c10::EventFlag::BACKEND_DEFAULT);
      events.back().record(c10::impl::getDeviceGuardImpl(c10::kCUDA)->getStream(plan.device));
    } else if (plan.profile) {
      plan.times[i].ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    }
  }
  if (plan.profile) {
    for (size_t i = 0; i < plan.steps.size(); ++i) {
      if (on_gpu) {
        events[2 * i + 1].synchronize();
        plan.times[i].ms += events[2 * i].elapsedTime(events[2 * i + 1]);
      }
      if (plan.times[i].calls++ == 0) plan.first_ms[i] = plan.times[i].ms;
    }
  }
  std::vector<at::Tensor> out;
  out.reserve(plan.outputs.size());
  for (const Source& s : plan.outputs) {
    out.push_back(read(s, slots).toTensor());
    // Note [Arena]: the plan keeps every buffer an output views out of the
    // arena; one in it would be overwritten by the next call.
    if (out.back().defined() && out.back().has_storage() && std::ranges::any_of(arena_storages, [&](const auto& a) {
          return a._unsafe_get_target() == out.back().storage().unsafeGetStorageImpl();
        }))
      throw InductorError("inductor: output " + std::to_string(out.size() - 1) +
                          " lies in an arena of the call; compile with memory_planning off "
                          "(CRUCIBLE_INDUCTOR_MEMORY_PLANNING=0) and report the graph");
  }
  return out;
}

}  // namespace

std::vector<at::Tensor> run_plan(Plan& plan, std::vector<at::Tensor>& inputs) {
  if (!plan.threads) return run_steps(plan, inputs);
  TunedThreads threads(*plan.threads);  // Note [Threads on a shared machine]
  std::vector<at::Tensor> out = run_steps(plan, inputs);
  threads.done();
  return out;
}

}  // namespace crucible::inductor::detail
