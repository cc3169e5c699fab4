// Private: the state of one trace and the entry point make_fx and
// functional_call share.
#pragma once

#include <crucible/tracer/make_fx.h>

#include <ATen/core/stack.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/util/intrusive_ptr.h>

#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace crucible::tracer::detail {

/// One placeholder of a trace.
struct TraceInput {
  at::Tensor tensor;
  std::string name;
  ir::InputSpec spec;  // duplicate_of set: shares the tensor of that earlier input
  /// The function reads `tensor` itself rather than an argument (module
  /// state, a lifted tensor); see Note [Swapping reached tensors].
  bool reached = false;
};

/// One graph output.
struct TraceOutput {
  at::Tensor tensor;
  ir::OutputSpec spec;
};

/// What trace() runs.
struct TraceHooks {
  /// The traced function, given per input the tensor it runs on in its
  /// place (a copy, a fake tensor, a functional wrapper, or for a reached
  /// input the input itself holding its copy); returns the graph outputs
  /// with their specs.
  std::function<std::vector<TraceOutput>(const std::vector<at::Tensor>& traced)> body;
  /// Append the gradient each reached Parameter input holds after the body
  /// as an output of kind Gradient (functional_call's gradients_as_outputs).
  /// Lifted tensors' gradients are appended always (Note [Lifted tensors]).
  bool parameter_gradients = false;
};

// Note [Ops with hidden writes]
// native_batch_norm and cudnn_batch_norm in training update running_mean and
// running_var in place, although their schemas do not mark those arguments
// as written, so functionalization cannot see the write: the graph would
// keep a node that changes its inputs as a side effect, and any pass that
// recomputes, duplicates or reorders it would corrupt the statistics. With
// functionalize, when both statistics are reached tensors (module buffers,
// lifted tensors), the tracer records the op's functional variant instead —
// _native_batch_norm_legit_functional, or crucible::cudnn_batch_norm_functional
// (cuDNN's kernel on copies of the statistics, for eager's exact numbers on
// CUDA) — which returns the new statistics, followed by copy_ writes into the
// buffers that Note [Functionalizing module state] turns into MutatedInput
// outputs. Statistics that are functional tensors (the function's inputs,
// tensors it made) run native_batch_norm as _native_batch_norm_legit, whose
// write Functionalize sees (make_fx.cpp); others keep the op as it is.

/// Whether `op_name` ("aten::native_batch_norm") is one Note [Ops with hidden
/// writes] replaces.
bool has_hidden_writes(const std::string& op_name);

/// Marks inputs[offset + i] for each i in options.lifted_inputs as a reached
/// input of kind Lifted, named from options.source_names. Throws TraceError
/// for an index past the inputs.
void mark_lifted_inputs(std::vector<TraceInput>& inputs, size_t offset, const TraceOptions& options);

/// Runs a trace. See make_fx for the behaviour and errors.
TraceResult trace(const std::vector<TraceInput>& inputs, const TraceHooks& hooks, const TraceOptions& options);

/// Maps the tensors of a running trace to graph Values and records ops.
/// See Note [Value tracking].
class TraceSession {
 public:
  TraceSession(ir::Graph& graph, const TraceOptions& options);
  /// Restores the reached tensors (restore()), also when tracing throws.
  ~TraceSession();
  TraceSession(const TraceSession&) = delete;
  TraceSession& operator=(const TraceSession&) = delete;

  /// Adds the placeholder of `in` (not a duplicate) and returns the tensor
  /// the function runs on in its place: a copy of it (a fake tensor in fake
  /// mode), or for a reached input `in.tensor` itself, now holding the copy.
  at::Tensor add_input(const TraceInput& in);
  /// The Value a tensor the function holds stands for; a tensor the trace
  /// has not seen is lifted, or made a constant (Note [Lifted tensors]).
  /// `user` names the op for errors.
  ir::Value* value_of(const at::Tensor& t, const std::string& user);
  /// The dispatcher fallback's work: run `op` on the stack and record it.
  void on_op(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack& stack);

  /// Whether placeholder i is a reached input (so never a functional wrapper).
  std::vector<bool> reached_placeholders() const;
  /// The gradients the reached tensors hold now, as Gradient outputs: every
  /// lifted tensor's, and with `parameters` every reached Parameter's.
  std::vector<TraceOutput> gradients(bool parameters) const;
  /// Puts each reached tensor's own data and gradient back. Idempotent.
  void restore();
  /// After restore() and once the function's results are released: turns
  /// each tensor lifted while tracing that nothing outside the trace holds
  /// any more into a constant (Note [Lifted tensors]), editing the graph
  /// and `input_mutations`, and returns the others.
  std::vector<LiftedTensor> settle_lifted(std::vector<InputMutation>& input_mutations);
  /// Fake mode: the ops that ran on CPU stand-ins so far (Note [Fake mode]).
  const std::vector<std::string>& stand_in_ops() const { return stand_ins_; }

 private:
  struct OpInfo {
    const char* data_dependent = nullptr;  // why, when the op is data-dependent
    const Decomposition* decomposition = nullptr;
    // An in-place op whose out-of-place variant has a decomposition: that
    // variant and its decomposition (Note [Decomposing in-place ops]).
    std::optional<c10::OperatorHandle> out_of_place;
    const Decomposition* out_of_place_decomposition = nullptr;
    bool hidden_writes = false;  // Note [Ops with hidden writes]
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
    // The tensor's storage when it was mapped (null without one): another
    // one since means its data was replaced (Note [Value tracking]).
    const c10::StorageImpl* storage;
  };
  struct StorageEntry {
    c10::weak_intrusive_ptr<c10::StorageImpl> keep;
    ir::Value* value;
  };
  using WeakTensor = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
  // A tensor the function reads itself, swapped for the trace.
  struct Reached {
    at::Tensor tensor;  // the caller's tensor (held until settle_lifted)
    at::Tensor data;    // its own storage and metadata
    at::Tensor grad;    // its own gradient
    ir::Value* value;
    ir::InputKind kind;
    bool lifted_here = false;        // found while tracing, not given as an input
    std::optional<WeakTensor> weak;  // set by settle_lifted
    at::Tensor pristine;             // lifted_here: its value when first read, if small enough for a constant
  };

  const OpInfo& info(const c10::OperatorHandle& op);
  void find_out_of_place_decomposition(const c10::OperatorHandle& op, OpInfo& i);
  ir::Value* lookup(const at::Tensor& t);
  bool is_reached(const at::Tensor& t) const;
  bool trace_functional_variant(const c10::OperatorHandle& op, torch::jit::Stack& stack, size_t base);
  void define(ir::Value* v, const at::Tensor& t, bool alias_base = true);
  c10::Device fake_device(const std::vector<ir::Argument>& args) const;
  void reach(const at::Tensor& t, ir::Value* v, ir::InputKind kind, bool lifted_here);
  ir::Value* lift(const at::Tensor& t, const std::string& user);
  ir::Value* constant_of(const at::Tensor& t, const std::string& user);
  void to_constant(const Reached& r, size_t index, std::vector<InputMutation>& input_mutations);
  ir::Argument argument(const c10::IValue& iv, const c10::Argument& formal, const std::string& user);
  bool is_shape_check(const torch::jit::Stack& stack, size_t base);
  bool is_equal_of_one_tensor(const torch::jit::Stack& stack, size_t base);
  void trace_guarded_equal(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack& stack,
                           size_t base);
  void check_uninitialized_reads(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t base);
  // Runs `op` below the tracer's key; in fake mode on meta tensors, its
  // results made fakes (Note [Fake tensors]). `args` is the op's recording.
  void run(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack& stack, size_t base,
           const std::vector<ir::Argument>& args);
  // Runs `op` on meta tensors below the tracer's key (`after`), through a
  // meta function or CPU stand-ins where it has no Meta kernel (Note [Fake
  // mode]).
  void run_on_meta(const c10::OperatorHandle& op, c10::DispatchKeySet after, torch::jit::Stack& stack, size_t base);

  ir::Graph& graph_;
  const TraceOptions& options_;
  std::unordered_map<const c10::TensorImpl*, std::string> source_names_;
  std::unordered_map<const c10::FunctionSchema*, OpInfo> ops_;
  std::unordered_map<const c10::TensorImpl*, ImplEntry> by_impl_;
  std::unordered_map<ViewKey, ir::Value*, ViewKeyHash> by_view_;
  std::unordered_map<const c10::StorageImpl*, StorageEntry> by_storage_;
  std::vector<Reached> reached_;
  bool restored_ = false;
  bool grad_at_start_;  // Note [Nodes traced under no_grad]
  std::vector<std::string> stand_ins_;
  // Storages of aten::empty results no traced op has written yet, with their
  // node (Note [Memory written outside the dispatcher]).
  struct Uninitialized {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    ir::Node* node;
  };
  std::unordered_map<const c10::StorageImpl*, Uninitialized> uninitialized_;
};

}  // namespace crucible::tracer::detail
