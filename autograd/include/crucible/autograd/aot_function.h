// aot_function: compile a function over tensors ahead of time, forward and
// backward (torch/_functorch/aot_autograd.py's aot_function).
#pragma once

#include <crucible/autograd/aot_config.h>
#include <crucible/tracer/make_fx.h>

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace crucible::autograd {

namespace detail {
struct AotState;
}

// Note [AOT dispatch]
// Each call picks a path, as the seed's create_aot_dispatcher_function does:
//  - inference, when grad mode is off or no input requires grad: the function
//    is traced (functionalized) and compiled whole by inference_compiler;
//  - autograd otherwise: the joint graph
//      joint(primals, tangents) = (fn(primals), grad(fn(primals), primals, tangents))
//    is traced through torch::autograd::grad, partitioned by partition_fn,
//    the forward compiled by fw_compiler at once and the backward by
//    bw_compiler at the first backward. The compiled forward runs inside a
//    custom autograd Function whose backward node runs the compiled backward,
//    so loss.backward() and torch::autograd::grad reach it as they reach any
//    eager op; retain_graph and freed saved values behave as in eager.
// Tangents are made contiguous before the backward runs (the backward graph
// was traced with contiguous tangents); an undefined incoming gradient (an
// output the loss does not use) is passed as zeros.

// Note [Duplicated inputs]
// The function is always traced on distinct copies of its inputs, so f(x, x)
// compiles as a function of two leaves; at runtime the autograd Function gets
// x twice and the engine accumulates both gradients into x, as eager's two
// uses of one leaf do. This is what the seed's AOTDedupeWrapper achieves by
// removing duplicates; it is sound here because a mutated input that shares
// storage with another input is refused (a mutation through one would be seen
// through the other), on every call, not only the compiling one.

// Note [RNG during compilation]
// Compiling runs the function several times (metadata trace, joint trace),
// and each run draws from the CPU generator. The generator's state is saved
// before compiling and restored after, so the compiled call draws exactly
// what the eager call would have drawn from the same state. Random ops stay
// in the forward graph and draw at run time; what the backward needs from
// them (dropout's mask) is a saved value, so forward and backward agree as
// they do in eager. This is the CPU counterpart of the seed's functionalized
// RNG (Philox seed/offset threaded through the graphs), which CUDA needs for
// recomputation and CUDA graphs; the default partition recomputes nothing,
// so saving suffices here.

// Note [AOT cache guards]
// A compilation is valid for the input metadata it was traced with: each
// input's sizes, strides, dtype, device and requires_grad, and grad mode. A
// call whose metadata matches no compiled entry compiles a new one (or throws
// AotError once recompile_limit compilations exist): a compiled graph never
// runs on inputs it was not specialized to.

/// The callable aot_function returns. Copies share one cache.
class AotFunction {
 public:
  /// Runs the compiled function (compiling first on a cache miss, see
  /// Note [AOT dispatch] and Note [AOT cache guards]). Returns fn's outputs;
  /// on the autograd path they carry the compiled backward.
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& inputs) const;
  /// Compilations so far (one per distinct input metadata seen).
  size_t num_compilations() const;

 private:
  friend AotFunction aot_function(tracer::TensorFn fn, AotConfig config);
  std::shared_ptr<detail::AotState> state_;
};

/// Compiles `fn` on first use with `config`. Each compilation records its
/// phases (aot_autograd > trace_joint, partition, fw_compiler; bw_compiler;
/// aot_inference) in runtime::default_phase_timer() and one
/// CompilationMetrics per compiled graph ("forward", "backward",
/// "inference") in runtime::default_metrics_log(). `fn` must be a function of its
/// tensor inputs (anything else it reads is baked into the graph) and must
/// not mutate its inputs on the autograd path, nor their metadata on any path,
/// nor mutate an input that shares storage with another (AotError says so when
/// it does); data mutations on the inference path are copied into the
/// caller's tensors after the call.
AotFunction aot_function(tracer::TensorFn fn, AotConfig config = {});

}  // namespace crucible::autograd
