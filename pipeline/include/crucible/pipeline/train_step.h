// A whole training step — forward, loss, backward and the optimizer update —
// compiled as one graph, as torch.distributed._spmd compiles a train step
// (torch/distributed/_spmd/api.py's _compile): the module's parameters and
// buffers, the optimizer's state, the learning rate and the batch are the
// graph's inputs, and the graph updates them in place.
#pragma once

#include <crucible/ir/graph.h>
#include <crucible/pipeline/optim.h>

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace crucible::pipeline {

class Builder;

// Note [Train step graph]
// compile_train_step traces, with tracer::functional_call and real tensors,
//   step(params..., buffers..., flat_state..., lr, batch...):
//     loss = loss_fn(module, batch); loss.backward()
//     optimizer_step(options, params, grads, state, lr)      (optim.h)
//     return loss
// Placeholders: the module's parameters (InputKind::Parameter) and buffers
// (Buffer) in named_parameters()/named_buffers() order; the optimizer's state
// in OptimizerState::flat() order (State, targets "<param>.step",
// "<param>.exp_avg", ...); the learning rate (State, "lr": a float64 0-dim
// tensor, filled from the optimizer's options at every call, so schedulers
// that set the rate on the torch::optim optimizer work); then the batch
// (UserInput). The step count is part of the flat state, so nothing that
// changes from step to step is a constant of the graph (see
// Note [Traceable optimizer state] in optim.h).
// Tensors the loss reads from outside the module (another module's
// parameters and buffers, captured tensors) are lifted to the last
// placeholders (InputKind::Lifted; Note [Lifted tensors] in
// tracer/make_fx.h) and read at every call; the graph writes them where the
// step writes them (another module's BatchNorm statistics), and the gradient
// the backward computes for each that requires grad is an extra output
// (Gradient) that the call accumulates into its .grad, as eager's backward
// does; the optimizer updates only the module's own parameters.
// The graph writes the new parameters, buffers (BatchNorm's running
// statistics) and state into those placeholders with in-place ops (addcmul_,
// copy_, add_, ...), as _spmd's graph holds copy_ write-backs. It is not
// functionalized: a functional graph would return every new value as an
// extra output (MutatedInput) for a runtime epilogue to copy back, one more
// pass over all the state per step; written in place, the update lands where
// the state lives. DCE and CSE keep and respect in-place ops. The output is the loss
// (OutputKind::Loss). Each call runs the compiled graph under no-grad on
// detached aliases of the module's own tensors, so the module's parameters
// and buffers are updated in place, as torch::optim updates them.
// The gradients live inside the graph: the module's .grad fields are not
// filled, and each step starts from no gradient (as after zero_grad()).
// Options of the optimizer other than the learning rate are read once, when
// the step is created. Compiling saves and restores the default generators
// (the CPU one and each GPU's), so random ops (dropout) draw at each call what
// eager would draw. A step compiles again for inputs of other sizes, dtypes,
// devices or aliasing, when any submodule's train()/eval() mode changed, or
// when a lifted tensor was freed (its variable now holds another tensor).

/// The loss of one batch: runs the module on it and returns a 0-dim loss.
/// `batch` is what the TrainStep is called with (e.g. {inputs, targets}).
using LossFn = std::function<at::Tensor(torch::nn::Module& module, const std::vector<at::Tensor>& batch)>;

struct Model;
/// A zoo model's loss as a LossFn over the batch {inputs, targets}:
/// model.loss(model.forward(inputs), targets).
LossFn loss_of(const Model& model);

namespace detail {
struct TrainStepState;
}

/// A compiled training step. Copies share one state (module, optimizer state,
/// compiled graphs).
class TrainStep {
 public:
  /// One step on `batch`: updates the module's parameters and buffers and the
  /// optimizer state in place and returns the loss (0-dim, detached).
  /// Compiles first when this batch's metadata (sizes, strides, dtype,
  /// device of every input, and the module's train/eval mode) has not been
  /// seen. Throws PipelineError when the optimizer's param groups have come to
  /// differ in learning rate; tracing and backend errors propagate.
  at::Tensor operator()(const std::vector<at::Tensor>& batch) const;
  /// Compiles for `batch`'s metadata without running a step (a no-op when it
  /// is compiled already). The trace runs the step once on copies: neither
  /// the module nor the optimizer state changes. Throws what compiling
  /// throws, none of it wrapped in AotError (no aot_module here):
  /// PipelineError when the loss function returns other than a 0-dim tensor;
  /// the loss function's own exceptions and the tracer's TraceError; the
  /// passes' ir::IrError; the backend's and the instruments' exceptions.
  /// Nothing is cached when it throws.
  void compile(const std::vector<at::Tensor>& batch) const;
  /// Compilations so far (one per distinct metadata).
  size_t num_compilations() const;
  /// The graph of the latest compilation, after the passes (what the
  /// backend compiled). The reference stays valid while any copy of this
  /// TrainStep lives (compilations are kept, never evicted), even after a
  /// later compilation makes another graph the latest. Throws PipelineError
  /// before the first compilation.
  const ir::Graph& graph() const;
  /// Every input of the graph for `batch`, in placeholder order (Note [Train
  /// step graph]): the module's tensors (detached aliases), the optimizer
  /// state, the learning rate, the batch, and the tensors the latest
  /// compilation lifted (detached aliases; Note [Lifted tensors]). What the
  /// compiled graph is called with (e.g. to compile graph() with another
  /// backend and run it). Throws PipelineError when a lifted tensor has been
  /// freed since.
  std::vector<at::Tensor> graph_inputs(const std::vector<at::Tensor>& batch) const;
  /// The optimizer's options as compile_train_step read them; their lr is
  /// the rate then (each call reads the optimizer's current rate).
  const OptimizerOptions& optimizer_options() const;
  /// The optimizer state the graph updates. The torch::optim optimizer's own
  /// state is not updated by compiled steps.
  const OptimizerState& optimizer_state() const;

 private:
  friend TrainStep compile_train_step(std::shared_ptr<torch::nn::Module>, torch::optim::Optimizer&, LossFn,
                                      const Builder&);
  std::shared_ptr<detail::TrainStepState> state_;
};

/// Compiles `loss_fn` over `module` followed by `optimizer`'s update as one
/// graph with `builder`'s stages (Note [Train step graph]); compilation
/// happens at the first call or TrainStep::compile. `optimizer` must be a
/// torch::optim::SGD, Adam or AdamW (optimizer_options_from) over parameters
/// of `module`, and must outlive the TrainStep (the learning rate is read from
/// it at every call). Its state, where it has some (it has stepped before), is
/// copied as the starting state (optimizer_state_from); otherwise the state
/// starts fresh (init_optimizer_state).
/// Compiles nothing itself; throws PipelineError when `module` is null,
/// `loss_fn` is empty, the optimizer is not SGD, Adam or AdamW, has no
/// param groups or groups with different options, updates a tensor that is
/// not one of the module's parameters, has no parameters, or holds state
/// whose sizes differ from its parameter's. Compile errors come at the first
/// call or TrainStep::compile.
TrainStep compile_train_step(std::shared_ptr<torch::nn::Module> module, torch::optim::Optimizer& optimizer,
                             LossFn loss_fn, const Builder& builder);
/// The same with a default Builder.
TrainStep compile_train_step(std::shared_ptr<torch::nn::Module> module, torch::optim::Optimizer& optimizer,
                             LossFn loss_fn);

}  // namespace crucible::pipeline
