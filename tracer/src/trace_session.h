// Private: the state of one trace and the entry point make_fx and
// functional_call share.
#pragma once

#include <crucible/tracer/make_fx.h>

#include <ATen/core/stack.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/util/intrusive_ptr.h>

#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace crucible::tracer::detail {

/// One placeholder of a trace.
struct TraceInput {
  at::Tensor tensor;
  std::string name;
  ir::InputSpec spec;  // duplicate_of set: shares the tensor of that earlier input
};

/// One graph output.
struct TraceOutput {
  at::Tensor tensor;
  ir::OutputSpec spec;
};

/// What trace() runs. `traced` holds, per input, the tensor the function
/// runs on in its place (a copy, a meta tensor, a functional wrapper).
struct TraceHooks {
  /// Before tracing starts; nothing it dispatches is recorded.
  std::function<void(const std::vector<at::Tensor>& traced)> setup;
  /// The traced function; returns the graph outputs with their specs.
  std::function<std::vector<TraceOutput>(const std::vector<at::Tensor>& traced)> body;
  /// After tracing stops, also when it throws (undoes setup).
  std::function<void()> teardown;
};

/// Runs a trace. See make_fx for the behaviour and errors.
TraceResult trace(const std::vector<TraceInput>& inputs, const TraceHooks& hooks, const TraceOptions& options);

/// Maps the tensors of a running trace to graph Values and records ops.
/// See Note [Value tracking].
class TraceSession {
 public:
  TraceSession(ir::Graph& graph, const TraceOptions& options);

  /// Adds a placeholder for `t` (the tensor the function runs on).
  ir::Value* add_input(const at::Tensor& t, const std::string& name, ir::InputSpec spec);
  /// The Value a tensor the function holds stands for; tensors not derived
  /// from the inputs become constants. `user` names the op for errors.
  ir::Value* value_of(const at::Tensor& t, const std::string& user);
  /// The dispatcher fallback's work: run `op` on the stack and record it.
  void on_op(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack& stack);

 private:
  struct OpInfo {
    const char* data_dependent = nullptr;  // why, when the op is data-dependent
    const Decomposition* decomposition = nullptr;
    std::string name;
  };
  struct ViewKey {
    const void* storage;
    int64_t offset;
    c10::ScalarType dtype;
    std::vector<int64_t> sizes, strides;
    bool operator==(const ViewKey&) const = default;
  };
  struct ViewKeyHash {
    size_t operator()(const ViewKey& k) const;
  };
  struct ImplEntry {
    c10::weak_intrusive_ptr<c10::TensorImpl> keep;  // keeps the address unique
    ir::Value* value;
  };
  struct StorageEntry {
    c10::weak_intrusive_ptr<c10::StorageImpl> keep;
    ir::Value* value;
  };

  const OpInfo& info(const c10::OperatorHandle& op);
  ir::Value* lookup(const at::Tensor& t);
  void define(ir::Value* v, const at::Tensor& t, bool alias_base = true);
  ir::Argument argument(const c10::IValue& iv, const c10::Argument& formal, const std::string& user);
  bool is_shape_check(const torch::jit::Stack& stack, size_t base);
  void run(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack& stack, size_t base);
  void run_on_cpu(const c10::OperatorHandle& op, std::vector<c10::IValue> args, torch::jit::Stack& stack);

  ir::Graph& graph_;
  const TraceOptions& options_;
  std::unordered_map<const c10::FunctionSchema*, OpInfo> ops_;
  std::unordered_map<const c10::TensorImpl*, ImplEntry> by_impl_;
  std::unordered_map<ViewKey, ir::Value*, ViewKeyHash> by_view_;
  std::unordered_map<const c10::StorageImpl*, StorageEntry> by_storage_;
};

}  // namespace crucible::tracer::detail
