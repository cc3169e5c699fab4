// Tracing a torch::nn::Module with its state lifted to graph inputs, like
// aot_module's functional call (torch.func.functional_call) and the stateless
// tracing in torch/distributed/_spmd/api.py.
#pragma once

#include <crucible/tracer/make_fx.h>

namespace torch::nn {
class Module;
}

namespace crucible::tracer {

/// What to trace over a module: typically `module.forward(inputs)`, or a whole
/// training step (forward, loss, .backward()).
using ModuleFn = std::function<std::vector<at::Tensor>(torch::nn::Module& module, const std::vector<at::Tensor>& inputs)>;

struct ModuleTraceOptions {
  TraceOptions trace;
  /// Append the gradient every parameter holds after `fn` (set by a
  /// .backward() inside it) as an output of kind Gradient whose input_index
  /// is the parameter's placeholder. Parameters without one are skipped.
  bool gradients_as_outputs = false;
};

/// Traces `fn(module, example_inputs)` with every parameter and buffer of
/// `module` as a placeholder: parameters in named_parameters() order, then
/// buffers in named_buffers() order, then the example inputs. Their specs are
/// InputKind::Parameter / Buffer with the fully qualified name as target; a
/// tensor registered under several names gets a placeholder per name, the
/// later ones with `duplicate_of` set to the first (they have no uses).
///
/// While `fn` runs, each parameter and buffer holds a copy of its value (a
/// meta tensor in fake mode) and no gradient; afterwards the module's tensors
/// and gradients are exactly what they were, also when tracing throws.
/// Errors as make_fx.
TraceResult functional_call(torch::nn::Module& module, const ModuleFn& fn,
                            const std::vector<at::Tensor>& example_inputs, const ModuleTraceOptions& options = {});

}  // namespace crucible::tracer
