// Tracing a torch::nn::Module with its state lifted to graph inputs, like
// aot_module's functional call (torch.func.functional_call) and the stateless
// tracing in torch/distributed/_spmd/api.py.
#pragma once

#include <crucible/tracer/make_fx.h>

#include <cstddef>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace crucible::tracer {

/// What to trace over a module: typically `module.forward(inputs)`, or a whole
/// training step (forward, loss, .backward()).
using ModuleFn =
    std::function<std::vector<at::Tensor>(torch::nn::Module& module, const std::vector<at::Tensor>& inputs)>;

struct ModuleTraceOptions {
  TraceOptions trace;
  /// Append the gradient every parameter holds after `fn` (set by a
  /// .backward() inside it) as an output of kind Gradient whose input_index
  /// is the parameter's placeholder. Parameters without one are skipped.
  /// (Lifted tensors' gradients are appended always.)
  bool gradients_as_outputs = false;
};

/// Traces `fn(module, example_inputs)` with every parameter and buffer of
/// `module` as a placeholder: parameters in named_parameters() order, then
/// buffers in named_buffers() order, then the example inputs. Their specs are
/// InputKind::Parameter / Buffer with the fully qualified name as target; a
/// tensor registered under several names gets a placeholder per name, the
/// later ones with `duplicate_of` set to the first (they have no uses).
///
/// Tensors `fn` reads from outside the module and its arguments are lifted
/// after the example inputs (Note [Lifted tensors] in make_fx.h).
///
/// While `fn` runs, each parameter and buffer holds a copy of its value (a
/// fake tensor in fake mode) and no gradient, and so does each lifted
/// tensor; afterwards the tensors and gradients are exactly what they were,
/// also when tracing throws (Note [Swapping reached tensors]).
/// Errors as make_fx.
TraceResult functional_call(torch::nn::Module& module, const ModuleFn& fn,
                            const std::vector<at::Tensor>& example_inputs, const ModuleTraceOptions& options = {});

/// A module's state in the order every graph over the module takes it, and
/// functional_call lifts it.
struct ModuleState {
  /// Each defined parameter (named_parameters() order; a tensor registered
  /// under several names appears under each), then each defined buffer
  /// (named_buffers() order), named by its fully qualified name.
  std::vector<NamedTensor> tensors;
  /// How many of `tensors` are parameters.
  size_t num_parameters = 0;
};

/// `module`'s state. A non-empty `prefix` names each tensor
/// "<prefix>.<fully qualified name>": TraceOptions::source_names for a
/// function that reads `module` from outside, so its lifted placeholders
/// are named after their parameters ("discriminator.fc.weight").
ModuleState module_state(const torch::nn::Module& module, const std::string& prefix = "");

}  // namespace crucible::tracer
