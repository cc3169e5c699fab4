// aot_export_module and aot_export_joint_simple: the functional graph of a
// module or function, for a runtime other than AOTAutograd's own
// (torch/_functorch/aot_autograd.py's aot_export_module and
// aot_export_joint_simple).
#pragma once

#include <crucible/ir/instrument.h>
#include <crucible/runtime/instruments.h>
#include <crucible/tracer/decomposition.h>
#include <crucible/tracer/functional_call.h>

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <optional>
#include <vector>

namespace torch::nn {
class Module;
}

namespace crucible::autograd {

/// What aot_export_module exports (aot_export_module's arguments
/// trace_joint and output_loss_index in torch/_functorch/aot_autograd.py).
struct AotExportOptions {
  /// Export the joint forward+backward graph of a training step: the
  /// gradients of the loss output with respect to every parameter (and user
  /// input) that requires grad. Off: the inference graph, traced under no_grad.
  bool trace_joint = false;
  /// With trace_joint: which output of fn is the loss (a scalar that
  /// requires grad). Required then.
  std::optional<size_t> output_loss_index;
  /// Applied while tracing, as make_fx's decomposition_table.
  tracer::DecompositionTable decompositions{};
  /// Told of the export: a "compile" holding an "export" stage whose after
  /// event carries the graph (Note [Compilation stages]); the process-wide
  /// instruments by default.
  ir::Instruments instruments = runtime::default_instruments();
};

/// The functional graph of fn(module, args). Placeholders: the parameters
/// (InputKind::Parameter), then the buffers (Buffer), named by their fully
/// qualified names, then `args` (UserInput). Outputs, as the seed's
/// (*updated_inputs, *user_outputs, *param_gradients): the new value of every
/// input fn writes (MutatedInput, input_index = its placeholder; BatchNorm's
/// buffers in train mode), fn's outputs (UserOutput; the loss is
/// OutputKind::Loss), and with trace_joint the gradients (Gradient,
/// input_index = the parameter's or input's placeholder; none for inputs that
/// get none). The joint graph takes no tangents: the backward starts from
/// the scalar loss with gradient 1. The graph is functional (no in-place ops),
/// outputs that alias inputs are returned as the graph computes them, and
/// nothing of the module or `args` is changed.
///
/// Throws AotError, as the seed raises (the message says which input or
/// output and what to do): an input whose metadata fn writes (transpose_,
/// resize_); an input fn writes that shares storage with another input; a
/// tensor fn reads from outside its arguments; with trace_joint, an input that requires grad and whose data fn
/// writes, no output_loss_index or one out of range, a loss that is not a
/// scalar or does not require grad, another output that requires grad (call
/// .detach() on it).
ir::Graph aot_export_module(torch::nn::Module& module, const tracer::ModuleFn& fn, const std::vector<at::Tensor>& args,
                            const AotExportOptions& options);

/// The graph of fn(args) with no change of calling convention: with
/// trace_joint, the joint graph of Note [Joint graph contract]
/// (partitioner/partition.h): primals, then one tangent per output that
/// requires grad; fn's outputs, then the gradient of every input that gets
/// one; without, the inference graph (traced under no_grad). Throws AotError
/// when the graph would need the runtime wrappers: fn writes an input (data
/// or metadata), or an output aliases an input or another output.
/// `decompositions` is applied while tracing, as make_fx's
/// decomposition_table (empty: every op is kept as dispatched).
ir::Graph aot_export_joint_simple(const tracer::TensorFn& fn, const std::vector<at::Tensor>& args, bool trace_joint,
                                  const tracer::DecompositionTable& decompositions = {});

}  // namespace crucible::autograd
