#include <crucible/ir/meta_call.h>

#include "meta_functions.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/core/enum_tag.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace crucible::ir {

// Note [CPU stand-ins]
// Meta kernels compute output metadata only, and C++ has fewer of them than
// Python (which registers many in torch/_meta_registrations.py): aten::relu,
// for one, has none in LibTorch 2.11. For such an op the call runs once on
// zero-filled CPU tensors of the same sizes, strides, offsets and dtypes (each
// over a storage as large as the meta tensor's), and its outputs turn back
// into meta tensors: an output that is a stand-in (an in-place op) is the meta
// input, its metadata changed as the op changed the stand-in's (resize_,
// transpose_); an output on a stand-in's storage (a view) is the same view of
// the meta input; others become fresh meta tensors. This costs the op's CPU
// time and memory for that op, and is exact for every op whose output
// metadata does not depend on values (the ops a graph can hold); an op that
// rejects zeros (a multinomial over zero weights) fails here. A random op run
// this way draws from the default CPU generator, whose state is put back
// afterwards, so deriving metadata never shifts the random stream of the
// program.

MetaPath call_on_meta(const c10::OperatorHandle& op, torch::jit::Stack& stack) {
  const size_t nargs = op.schema().arguments().size();
  const size_t base = stack.size() - nargs;
  // The kernel may leave the stack in any state when it throws.
  std::vector<c10::IValue> args(stack.begin() + static_cast<std::ptrdiff_t>(base), stack.end());
  try {
    op.callBoxed(stack);
    return MetaPath::Kernel;
  } catch (const c10::NotImplementedError&) {
    stack.resize(base);
    for (c10::IValue& a : args) stack.push_back(std::move(a));
    return call_without_meta_kernel(op, stack);
  }
}

namespace {

// An op that returns nothing and writes none of its arguments (an assertion
// such as _assert_async, a print) has no metadata to compute; running it on
// zero-filled stand-ins would check the zeros instead of the real values.
bool has_no_metadata(const c10::FunctionSchema& schema) {
  if (!schema.returns().empty()) return false;
  for (const c10::Argument& a : schema.arguments())
    if (a.alias_info() && a.alias_info()->isWrite()) return false;
  return true;
}

}  // namespace

MetaPath call_without_meta_kernel(const c10::OperatorHandle& op, torch::jit::Stack& stack) {
  if (has_no_metadata(op.schema())) {
    torch::jit::drop(stack, op.schema().arguments().size());
    return MetaPath::Nothing;
  }
  if (detail::call_meta_function(op, stack)) return MetaPath::Function;
  call_on_cpu_stand_ins(op, stack);
  return MetaPath::StandIns;
}

namespace {

// Puts the default CPU generator's state back when it goes out of scope.
class KeepCpuGeneratorState {
 public:
  KeepCpuGeneratorState() : gen_(at::detail::getDefaultCPUGenerator()) {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    state_ = gen_.get_state();
  }
  ~KeepCpuGeneratorState() {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    gen_.set_state(state_);
  }
  KeepCpuGeneratorState(const KeepCpuGeneratorState&) = delete;
  KeepCpuGeneratorState& operator=(const KeepCpuGeneratorState&) = delete;

 private:
  at::Generator gen_;
  at::Tensor state_;
};

}  // namespace

void map_tensors(torch::jit::Stack& stack, size_t from, const std::function<at::Tensor(const at::Tensor&)>& f) {
  for (size_t i = from; i < stack.size(); ++i) {
    c10::IValue& a = stack[i];
    if (a.isTensor()) {
      a = f(a.toTensor());
    } else if (a.isTensorList()) {
      std::vector<at::Tensor> ts;
      for (const at::Tensor& t : a.toTensorVector()) ts.push_back(f(t));
      a = ts;
    } else if (a.isList() && std::any_of(a.toListRef().begin(), a.toListRef().end(),
                                         [](const c10::IValue& e) { return e.isTensor(); })) {  // Tensor?[]
      c10::List<std::optional<at::Tensor>> ts;
      for (const c10::IValue& e : a.toListRef())
        ts.push_back(e.isTensor() ? std::optional<at::Tensor>(f(e.toTensor())) : std::nullopt);
      a = ts;
    }
  }
}

void call_on_cpu_stand_ins(const c10::OperatorHandle& op, torch::jit::Stack& stack) {
  // See Note [CPU stand-ins].
  const size_t nargs = op.schema().arguments().size();
  const size_t base = stack.size() - nargs;
  std::vector<std::pair<at::Tensor, at::Tensor>> stand_ins;  // meta, cpu
  auto to_cpu = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || !t.is_meta()) return t;
    const int64_t storage_numel = static_cast<int64_t>(t.storage().nbytes()) / static_cast<int64_t>(t.element_size());
    at::Tensor cpu = at::zeros({storage_numel}, t.options().device(at::kCPU).requires_grad(false))
                         .as_strided(t.sizes(), t.strides(), t.storage_offset());
    stand_ins.emplace_back(t, cpu);
    return cpu;
  };
  map_tensors(stack, base, to_cpu);
  {
    std::optional<KeepCpuGeneratorState> keep;
    if (op.hasTag(at::Tag::nondeterministic_seeded)) keep.emplace();
    op.callBoxed(stack);
  }
  auto to_meta = [&](const at::Tensor& r) -> at::Tensor {
    if (!r.defined() || !r.device().is_cpu()) return r;
    for (auto& [meta, cpu] : stand_ins) {
      if (r.unsafeGetTensorImpl() == cpu.unsafeGetTensorImpl()) {
        if (meta.sizes() != r.sizes() || meta.strides() != r.strides() || meta.storage_offset() != r.storage_offset())
          meta.as_strided_(r.sizes(), r.strides(), r.storage_offset());
        return meta;
      }
      if (r.storage().is_alias_of(cpu.storage())) return meta.as_strided(r.sizes(), r.strides(), r.storage_offset());
    }
    return at::empty_strided(r.sizes(), r.strides(), r.options().device(at::kMeta));
  };
  map_tensors(stack, base, to_meta);
}

}  // namespace crucible::ir
