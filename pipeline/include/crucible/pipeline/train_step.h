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
#include <optional>
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
// compile_train_step compiles, with autograd::aot_module and the builder's
// stages, the function
//   step(module; flat_state..., lr, batch...):
//     loss = loss_fn(module, batch); loss.backward()
//     optimizer_step(options, params, grads, state, lr)      (optim.h)
//     return loss
// on AOTAutograd's inference path (each call runs under no_grad; the step
// differentiates itself), so it has AOTAutograd's metadata analysis, guards,
// lifted inputs, RNG handling and runtime wrappers, and one functional
// graph. Placeholders: the module's parameters (InputKind::Parameter) and
// buffers (Buffer) in tracer::module_state order; the optimizer's state in
// OptimizerState::flat() order (State, targets "<param>.step",
// "<param>.exp_avg", ...); the learning rate (State, "lr": a float64 0-dim
// tensor, filled from the optimizer's options at every call, so schedulers
// that set the rate on the torch::optim optimizer work; one per param group,
// "lr.0", "lr.1", ..., when the optimizer has several); the batch
// (UserInput); then the tensors the loss reads from outside the module
// (Lifted; Note [Lifted tensors] in tracer/make_fx.h), read at every call.
// The step count is part of the flat state, so nothing that changes from
// step to step is a constant of the graph (Note [Traceable optimizer state]).
// The graph is functional: every op computes new values, batch norm's
// running statistics included (Note [Ops with hidden writes]), and the new
// parameters, buffers and optimizer state are written back by trailing
// aten::copy_ nodes into their placeholders, the graph's only mutations
// (AotConfig::keep_inference_input_mutations), so the update lands where the
// state lives. Outputs: the loss (OutputKind::Loss), then the gradient the
// step computes for each lifted tensor that requires grad (Gradient), which
// the call accumulates into that tensor's .grad as eager's backward does
// (Note [Gradients a function accumulates]); the optimizer updates only the
// module's own parameters. Their gradients live inside the graph: the
// optimizer's parameters' .grad fields end as after zero_grad() (whatever
// they held before the step, which does not read them), and each step
// starts from no gradient, as the eager step `zero_grad(); loss.backward();
// step(); zero_grad()` would. Each param group is updated with its own options
// (optimizer_group_options: a rate per group, no weight decay for biases);
// options other than the learning rate are read once, when the step is
// created, and a call after they changed throws. A step compiles again for inputs
// of other sizes, dtypes, devices or aliasing, when any submodule's
// train()/eval() mode changed (or that of a module named with
// Builder::name_module), or when a lifted tensor was freed (its
// variable now holds another tensor).
//
// Note [Pre-grad passes in a training step]
// The step's graph holds the forward, the backward autograd recorded and the
// update, so the builder's pre-grad passes cannot run over it: a rewrite of
// the forward (fuse_attention) must come before differentiation, so that
// autograd records the new ops' backward. With pre-grad passes,
// AotConfig::pre_grad traces the loss alone, loss_fn(module, batch), over
// the module state and the batch (Builder::pre_grad_function: not
// functionalized, not decomposed), runs the passes over that forward graph,
// and gives AOTAutograd a step whose loss is that graph run by the
// interpreter on the module's tensors: the step's trace records the ops the
// interpreter dispatches, their backward and the update. A loss whose
// gradient is not its ops' derivative (a custom autograd Function, a hook on
// an intermediate tensor) is traced without the pre-grad passes, with a
// warning (Note [Pre-grad graphs that autograd cannot replay] in
// pipeline/src/builder.cpp).

/// The loss of one batch: runs the module on it and returns a loss of one
/// element (0-dim, or of sizes [1] as eager's backward() also takes).
/// `batch` is what the TrainStep is called with (e.g. {inputs, targets}).
/// C++ numbers and flags it captures are constants of the compiled graph
/// (Note [AOT cache guards]): pass a weight that changes between steps in
/// `batch`, as a 0-dim tensor.
using LossFn = std::function<at::Tensor(torch::nn::Module& module, const std::vector<at::Tensor>& batch)>;

namespace detail {
struct TrainStepState;
}

/// Rewrites the gradients inside the traced step, between the backward and
/// the optimizer update: called once per trace with the gradient of each of
/// the optimizer's parameters, in its order (undefined for a parameter the
/// loss does not reach), it returns the gradients the update reads (the same
/// count; undefined ones are skipped by the update). What it computes is
/// traced into the graph: spmd tags each gradient here (crucible::tag_grad)
/// so that the data-parallel expansion can find them, as the seed's
/// gradients_tagging does.
using GradientHook = std::function<std::vector<at::Tensor>(std::vector<at::Tensor> grads)>;

/// What compile_train_step does besides the builder's stages.
struct TrainStepOptions {
  /// Applied to the gradients before the update (empty: none).
  GradientHook gradient_hook;
  /// Keep the step counts and the learning rate on the parameters' device
  /// (OptimizerOptions::capturable), so that a backend that captures CUDA
  /// graphs can capture the whole step. Unset: on when the builder's backend
  /// captures CUDA graphs (BackendInfo::cuda_graphs, e.g.
  /// "inductor-cudagraphs").
  std::optional<bool> capturable;
};

/// A compiled training step. Copies share one state (module, optimizer state,
/// compiled graphs).
class TrainStep {
 public:
  /// One step on `batch`: updates the module's parameters and buffers and the
  /// optimizer state in place and returns the loss (detached, of the loss
  /// function's sizes); adds
  /// the gradients of lifted tensors to their .grad.
  /// Compiles first when this batch's metadata (sizes, strides, dtype,
  /// device of every input, and the module's train/eval mode) has not been
  /// seen. Throws PipelineError when the optimizer's count of param groups,
  /// or a group's options other than the learning rate, have changed since
  /// compile_train_step, or when a hook was registered on or removed from
  /// a parameter (Tensor::register_hook) since the first compilation, whose
  /// trace holds the hooks as ops; tracing and backend errors propagate.
  at::Tensor operator()(const std::vector<at::Tensor>& batch) const;
  /// Compiles for `batch`'s metadata without running a step (a no-op when it
  /// is compiled already). The traces run the step on copies: neither the
  /// module nor the optimizer state changes. Throws what aot_module throws
  /// when it compiles: PipelineError when the loss function returns other
  /// than a tensor of one element; autograd::AotError wrapping a c10::Error of the
  /// loss function; the tracer's TraceError; the passes' ir::IrError; the
  /// backend's and the instruments' exceptions. Nothing is cached when it
  /// throws.
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
  /// compilation lifted (aliases of those it was given; Note [Lifted
  /// tensors]). What the compiled graph is called with (e.g. to compile
  /// graph() with another backend and run it); running it updates the
  /// module and the optimizer state through them. Throws nothing.
  std::vector<at::Tensor> graph_inputs(const std::vector<at::Tensor>& batch) const;
  /// The options of the optimizer's first param group as compile_train_step
  /// read them; their lr is the rate then (each call reads the optimizer's
  /// current rates).
  const OptimizerOptions& optimizer_options() const;
  /// The optimizer state the graph updates, one ParamState per parameter in
  /// the optimizer's order (its groups' parameters one after the other). The
  /// torch::optim optimizer's own state is not updated by compiled steps.
  const OptimizerState& optimizer_state() const;

 private:
  friend TrainStep compile_train_step(std::shared_ptr<torch::nn::Module>, torch::optim::Optimizer&, LossFn,
                                      const Builder&, TrainStepOptions);
  std::shared_ptr<detail::TrainStepState> state_;
};

/// Compiles `loss_fn` over `module` followed by `optimizer`'s update as one
/// graph with `builder`'s stages (Note [Train step graph]); compilation
/// happens at the first call or TrainStep::compile. `optimizer` must be a
/// torch::optim::SGD, Adam or AdamW (optimizer_group_options) over parameters
/// of `module`, and must outlive the TrainStep (the learning rate is read from
/// it at every call). Its state, where it has some (it has stepped before), is
/// copied as the starting state (optimizer_state_from); otherwise the state
/// starts fresh (init_optimizer_state), made, as torch::optim makes it, like
/// the parameter at the first step (after a module->to() that follows
/// compile_train_step).
/// Compiles nothing itself; throws PipelineError when `module` is null,
/// `loss_fn` is empty, the optimizer is not SGD, Adam or AdamW, has no
/// param groups, updates a tensor that is
/// not one of the module's parameters or lists one more than once (eager
/// would update it once per listing), has no parameters, or holds state
/// whose sizes differ from its parameter's. Compile errors come at the first
/// call or TrainStep::compile.
/// `options.gradient_hook`, where set, rewrites the gradients in the traced
/// step; a hook that returns another count of gradients makes the first
/// compilation throw PipelineError.
TrainStep compile_train_step(std::shared_ptr<torch::nn::Module> module, torch::optim::Optimizer& optimizer,
                             LossFn loss_fn, const Builder& builder, TrainStepOptions options = {});
/// The same with a default Builder.
TrainStep compile_train_step(std::shared_ptr<torch::nn::Module> module, torch::optim::Optimizer& optimizer,
                             LossFn loss_fn);

}  // namespace crucible::pipeline
