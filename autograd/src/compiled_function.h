// Private: the custom autograd Function the autograd path runs its compiled
// forward in (aot_dispatch_autograd's CompiledFunction in the seed).
#pragma once

#include <crucible/autograd/aot_cache.h>
#include <crucible/ir/backend.h>
#include <crucible/ir/graph.h>
#include <crucible/ir/instrument.h>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace crucible::autograd::detail {

/// What one compilation of the autograd path produced. See Note [AOT dispatch].
struct CompiledGraphs : torch::CustomClassHolder {
  ir::CompiledFn forward;
  ir::Graph backward_graph;
  ir::Backend bw_compiler;
  std::shared_ptr<AotCache> cache;  // with compiler_key: see Note [AOT graph cache]
  std::string compiler_key;
  std::once_flag backward_compiled;
  ir::CompiledFn backward;
  size_t num_fwd_outputs = 0;                // outputs the Function returns (before the saved values)
  std::vector<size_t> tangent_outputs;       // forward outputs that have a tangent, in order
  std::vector<bool> differentiable_outputs;  // per forward output: whether tangent_outputs holds it
  std::vector<ir::TensorMeta> tangent_meta;
  std::vector<size_t> gradient_inputs;  // per backward output: the primal it is the gradient of
  size_t num_primals = 0;
  std::string compile_id;
  ir::Instruments instruments;

  /// Compiles the backward graph at the first call (thread-safe).
  const ir::CompiledFn& compiled_backward(const std::vector<at::Tensor>& example_inputs);
};

/// forward(graphs, primals) runs the compiled forward, saves the saved values
/// and returns the forward outputs; outputs without a tangent are marked
/// non-differentiable. backward runs the compiled backward on the saved
/// values and the incoming gradients (contiguous; zeros for an output the
/// loss does not use) and returns one gradient per primal.
struct CompiledFunction : torch::autograd::Function<CompiledFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const c10::intrusive_ptr<CompiledGraphs>& graphs,
                                                at::TensorList primals);
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs);
};

// Note [Double backward]
// A backward run with create_graph (grad mode on, inputs that require grad)
// is expected to return gradients that can be differentiated again. The
// compiled backward records no autograd graph, so, as the seed's
// CompiledFunctionBackward does, its gradients are returned through this
// Function: the first derivative is exact, and differentiating it again
// raises AotError instead of silently giving no gradient. The Function takes
// the backward's inputs (saved values, incoming gradients) as its own, so its
// outputs depend on what they depend on, as eager's gradients would.
struct NoDoubleBackward : public torch::autograd::Function<NoDoubleBackward> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const std::string& compile_id,
                                                at::TensorList backward_inputs, at::TensorList grads);
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs);
};

}  // namespace crucible::autograd::detail
