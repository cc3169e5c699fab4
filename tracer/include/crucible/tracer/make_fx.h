// make_fx for C++: run a function over tensors once and record every ATen op
// it dispatches as an ir::Graph (torch/fx/experimental/proxy_tensor.py's
// make_fx, without Python).
#pragma once

#include <crucible/ir/graph.h>
#include <crucible/tracer/decomposition.h>

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace crucible::tracer {

/// What the traced function runs on. See Note [Fake mode] in src/trace_session.cpp.
enum class TraceMode : uint8_t {
  /// The function runs on the example inputs themselves (make_fx's "real").
  Real,
  /// The inputs are replaced by fake tensors of the same sizes, strides,
  /// dtype and device, which hold no memory, so no data is computed
  /// (make_fx's "fake"; see is_fake). Code that branches on a tensor's
  /// device (is_cuda(), autocast, dropout's fused kernel, the attention
  /// kernel scaled_dot_product_attention picks) sees the real device. An op
  /// that has no Meta kernel in C++ (aten::relu in 2.11, for one) runs on
  /// zero-filled CPU tensors of the same metadata to learn its outputs'
  /// metadata (TraceResult::stand_in_ops names them).
  Fake,
  /// Fake where a fake-mode trace can follow the function, else real (the
  /// default; AOTAutograd always traces on FakeTensors): the trace runs in
  /// fake mode, and runs again in real mode when that one throws (a
  /// data-dependent op such as at::equal, an op neither a Meta kernel nor
  /// CPU stand-ins can run). The fake attempt's warnings are dropped when it
  /// is abandoned. TraceResult::mode says which ran. See Note [Auto trace
  /// mode] in src/make_fx.cpp.
  Auto,
};

/// A tensor with the name its placeholder gets when the traced function
/// reads it from outside its arguments ("discriminator.fc.weight").
struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

// Note [Lifted tensors]
// A traced function may read tensors it was not given: a tensor captured by
// a lambda, a global, the parameters and buffers of another module (a GAN's
// generator step reads the discriminator). As TorchDynamo lifts such free
// tensors to graph inputs, the tracer lifts every one it meets to a
// placeholder of kind InputKind::Lifted, appended after the other
// placeholders, and TraceResult::lifted names the tensor behind it, so a
// compiled function reads its current value at every call instead of a
// stale copy. While the trace runs, the lifted tensor holds a copy of its
// value (its TensorImpl is swapped, as module state is: Note [Swapping
// reached tensors]), so tracing never writes the caller's tensor; a write
// the function makes to it is recorded as a write to that input (with
// functionalize, a MutatedInput output), and a gradient the function
// accumulates into its .grad (a .backward() inside the trace) becomes an
// output of kind Gradient for that input.
// What becomes a constant node instead, holding a copy of the value it had
// when the function first read it:
//  * every tensor read from outside when TraceOptions::freeze is set
//    (freezing: for inference, when those tensors will not change);
//  * a tensor the function made itself outside the dispatcher (at::from_blob
//    over a local array): the tracer cannot see such a tensor being created,
//    so it is lifted first, and turned into a constant when the trace ends
//    and nothing outside the function holds it any more (the function's own
//    temporary).
// (torch::tensor from an initializer list fills its elements with traced
// ops; at::tensor, and torch::tensor from a std::vector, copy the values
// through data_ptr() into a traced aten::empty, which the trace refuses by
// name: Note [Memory written outside the dispatcher] in trace_session.cpp.)
// Constants larger than max_constant_bytes raise TraceError: a large tensor
// made outside the dispatcher, or a frozen weight over the limit.

struct TraceOptions {
  TraceMode mode = TraceMode::Auto;
  /// Remove mutation and aliasing through LibTorch's functionalization: the
  /// graph has no in-place ops; inputs the function mutates come back as
  /// extra outputs (OutputKind::MutatedInput / MutatedInputMetadata) and are
  /// described by TraceResult::input_mutations (module state and lifted
  /// tensors too: see Note [Functionalizing module state]). See Note
  /// [Functionalization].
  bool functionalize = false;
  /// The largest tensor (bytes) that becomes a constant node of the graph
  /// (Note [Lifted tensors] says which do); a larger one raises TraceError,
  /// since a graph that embeds it copies it into every compiled artifact.
  int64_t max_constant_bytes = int64_t{1} << 20;
  /// Freezing: tensors the function reads from outside its arguments become
  /// constants holding their value at trace time instead of lifted inputs
  /// (Note [Lifted tensors]). Only for graphs run when those tensors no
  /// longer change (inference with fixed weights, as inductor's freezing):
  /// a frozen tensor that later changes is NOT seen by the graph.
  bool freeze = false;
  /// Names for tensors the function may read from outside its arguments:
  /// a lifted tensor found here gets this name (placeholder name and
  /// InputSpec::target), others "lifted_tensor". named_state() in
  /// functional_call.h lists a module's tensors this way.
  std::vector<NamedTensor> source_names;
  /// Indices of example inputs that the function reads from outside rather
  /// than from its arguments (tensors an earlier trace lifted): their
  /// placeholders are InputKind::Lifted, and the function receives the
  /// tensor itself at those positions, holding the traced copy while the
  /// trace runs (Note [Swapping reached tensors]).
  std::vector<size_t> lifted_inputs;
  /// Ops rewritten while tracing (see decomposition.h).
  DecompositionTable decompositions;
};

/// How the traced function changed one of its inputs (functionalize only;
/// all false otherwise), as AOTAutograd's InputAliasInfo records it.
struct InputMutation {
  bool data = false;      ///< its elements were written (add_, copy_, ...)
  bool metadata = false;  ///< its sizes/strides/offset changed (transpose_, resize_, ...)
};

/// A tensor the trace lifted (Note [Lifted tensors]).
struct LiftedTensor {
  /// Its placeholder.
  size_t input_index = 0;
  /// The caller's tensor itself: a compiled graph reads it at every call.
  at::Tensor tensor;
};

struct TraceResult {
  /// Placeholders: the example inputs, in order (module tracing puts the
  /// parameters and buffers first), then the lifted tensors. Outputs: the
  /// function's results, then the extra outputs the signature describes.
  /// Backward ops carry the tag "backward".
  ir::Graph graph;
  /// One per placeholder.
  std::vector<InputMutation> input_mutations;
  /// The tensors lifted while tracing, in placeholder order (not those named
  /// by TraceOptions::lifted_inputs, which the caller knows).
  std::vector<LiftedTensor> lifted;
  /// Fake mode: the ops that have no Meta kernel in C++ and ran on
  /// zero-filled CPU stand-ins (Note [Fake mode]), each named once, in the
  /// order first met.
  std::vector<std::string> stand_in_ops;
  /// The mode the trace ran in (Real or Fake; TraceMode::Auto resolved).
  TraceMode mode = TraceMode::Real;
  /// TraceMode::Auto that ran in real mode: why the fake-mode trace was
  /// abandoned (its error's first line, or the random op it met on a GPU).
  std::string fake_mode_abandoned;
};

/// Whether `t` is a fake tensor: a value of a fake-mode trace, with sizes,
/// strides, a dtype and the device it stands for, but no memory (Note [Fake
/// tensors] in src/trace_session.cpp; PyTorch's
/// torch._subclasses.fake_tensor.is_fake). A functionalized trace's wrapper
/// of a fake tensor is fake too. Reading a fake tensor's data (data_ptr(),
/// item()) throws. A traced function can ask it to skip work that needs
/// values, such as logging.
bool is_fake(const at::Tensor& t);

/// A function over tensors, as make_fx traces it.
using TensorFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;

/// Runs `fn(example_inputs)` once, recording every ATen op it dispatches below
/// autograd (forward ops, and the backward ops of any torch::autograd::grad
/// or .backward() call inside `fn`, tagged "backward"). Placeholders are the
/// example inputs (meta and requires_grad taken from them); tensor results
/// carry the metadata of the tensors the ops produced (requires_grad is false
/// on them: the tracer runs below autograd; an undefined result, such as a
/// gradient a backward op was told not to compute, has no metadata). An op is
/// tagged "backward" when the autograd engine runs it, i.e. while a graph task
/// is current (torch::autograd::get_current_graph_task_id() != -1). The graph replays the
/// function: interpreting it on the same inputs (and the lifted tensors,
/// Note [Lifted tensors]) gives the same outputs (RNG ops draw from the
/// generator they drew from while tracing).
///
/// Throws TraceError for data-dependent ops (.item(), nonzero, ...) and for
/// a constant over TraceOptions::max_constant_bytes. at::equal of two
/// tensors of the same sizes is the exception in real mode: the trace takes
/// the answer it gives and records crucible::assert_equal, which throws at a
/// later call whose tensors answer otherwise (Note [Guarded equal] in
/// src/trace_session.cpp); in fake mode it throws TraceError, and
/// TraceMode::Auto (the default) traces such a function in real mode. Any
/// exception `fn` throws propagates (in Auto, the real-mode run's; `fn` may
/// then have run twice); the tensors it reads from outside are restored to
/// their own data and gradients also then.
/// One trace runs at a time in a process (others wait).
TraceResult make_fx(const TensorFn& fn, const std::vector<at::Tensor>& example_inputs,
                    const TraceOptions& options = {});

/// Convenience forms for one and two tensors in, one tensor out.
TraceResult make_fx(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& x,
                    const TraceOptions& options = {});
TraceResult make_fx(const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& fn, const at::Tensor& x,
                    const at::Tensor& y, const TraceOptions& options = {});

}  // namespace crucible::tracer
