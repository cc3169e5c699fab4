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
#include <string>
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
// The optimizer-state inputs are the torch::optim optimizer's own state
// tensors, bound anew at every call, and its step counts are kept equal to
// the graph's, so torch::save, torch::load and eager steps between compiled
// ones see what eager steps would leave (Note [The optimizer's own state] in
// pipeline/src/optimizer_binding.h).
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
// step(); zero_grad()` would; with TrainStepOptions::keep_gradients they end
// holding the gradients the update read, as after `zero_grad();
// loss.backward(); step()`. Clipping (TrainStepOptions::clip_grad_value,
// clip_grad_norm) is traced between the backward and the update. Each param group is updated with its own options
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
// interpreter dispatches, their backward and the update
// (TrainStepOptions::around_loss runs around that graph, as around the loss
// without pre-grad passes). A loss whose
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

/// Runs the loss inside the traced step, around it: the step calls
/// `around(module, batch, loss)`, where `loss` is the loss function, or,
/// with pre-grad passes, their graph of it (Note [Pre-grad passes in a
/// training step]), which `around` must call once and whose value it
/// returns. What it computes besides is traced into the graph: spmd's
/// fully-sharded step points the parameters at their gathered values
/// around it (Note [Fully-sharded step] in spmd/data_parallel.h).
using AroundLoss =
    std::function<at::Tensor(torch::nn::Module& module, const std::vector<at::Tensor>& batch, const LossFn& loss)>;

/// Clipping by the gradients' total norm, as torch::nn::utils::clip_grad_norm_
/// (torch/nn/utils/clip_grad.h) computes it, op for op: the norm of order
/// `norm_type` of the per-parameter norms (infinity: the largest absolute
/// value; 0: the count of gradients), then every gradient times
/// min(1, max_norm / (norm + 1e-6)).
struct ClipGradNorm {
  double max_norm = 1.0;
  double norm_type = 2.0;
};

/// What compile_train_step does besides the builder's stages.
struct TrainStepOptions {
  /// Applied to the gradients before the update (empty: none).
  GradientHook gradient_hook;
  /// Runs the loss (empty: the loss alone).
  AroundLoss around_loss;
  /// With pre-grad passes: called with true before they trace the loss
  /// alone (outside any trace, at each compilation), and with false after,
  /// also when that throws; the module's tensors must then hold what the
  /// loss reads inside around_loss (spmd's fully-sharded step gathers its
  /// parameters whole for that trace). The call with false must not throw:
  /// it runs as the trace unwinds.
  std::function<void(bool before)> around_pre_grad_trace;
  /// Clamps every gradient element to [-value, value] before the update, as
  /// torch::nn::utils::clip_grad_value_ (after gradient_hook).
  std::optional<double> clip_grad_value;
  /// Clips the gradients by their total norm before the update, as
  /// torch::nn::utils::clip_grad_norm_ between loss.backward() and
  /// optimizer.step() (after gradient_hook and clip_grad_value);
  /// TrainStep::grad_norm() returns the norm. torch's clip_grad_norm_ itself
  /// reads the norm back to the host, which a compiled step cannot do: called
  /// inside the step (in a gradient hook) it fails with an error that points
  /// here. Its error_if_nonfinite has no counterpart: check grad_norm().
  std::optional<ClipGradNorm> clip_grad_norm;
  /// Leave each parameter's .grad holding the gradient the update read (after
  /// the hook and clipping; undefined where no gradient reached it), as eager's
  /// `zero_grad(); loss.backward(); step()` leaves it, to log or inspect.
  /// Off: .grad ends undefined, as after zero_grad() (set_to_none, torch's
  /// default), and the gradients' memory is freed inside the step.
  bool keep_gradients = false;
  /// Keep the step counts and the learning rate on the parameters' device
  /// (OptimizerOptions::capturable), so that a backend that captures CUDA
  /// graphs can capture the whole step. Unset: on when the builder's backend
  /// captures CUDA graphs (runtime::BackendInfo::cuda_graphs, e.g.
  /// "inductor-cudagraphs").
  std::optional<bool> capturable;
};

/// A compiled training step. Copies share one state (module, optimizer state,
/// compiled graphs).
class TrainStep {
 public:
  /// One step on `batch`: updates the module's parameters and buffers and the
  /// optimizer's own state in place (Note [The optimizer's own state]) and
  /// returns the loss (detached, of the loss function's sizes); adds the
  /// gradients of lifted tensors to their .grad. Reads the module's tensors,
  /// the optimizer's state and its learning rates anew at every call, so a
  /// torch::load into either, a scheduler or an eager step in between is
  /// seen. Compiles first when this batch's metadata (sizes, strides, dtype,
  /// device of every input, optimizer state included, and the module's
  /// train/eval mode) has not been seen. Throws PipelineError, before
  /// anything runs, when the optimizer's param groups, their parameters, or
  /// a group's options other than the learning rate have changed since
  /// compile_train_step; when the module's parameters were replaced, added
  /// or removed; when the optimizer's state for a parameter lacks a tensor
  /// its options read or holds one of other sizes or on another device than
  /// the parameter; or when a hook was registered on or removed from a
  /// parameter (Tensor::register_hook) since the first compilation, whose
  /// trace holds the hooks as ops. Tracing and backend errors propagate.
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
  /// The name of the backend that compiles the step (Builder::backend_name).
  const std::string& backend_name() const;
  /// The optimizer state the next call reads, one ParamState per parameter
  /// in the optimizer's order (its groups' parameters one after the other):
  /// the torch::optim optimizer's own state tensors, zeros where it holds no
  /// state for a parameter yet, and step counts as float64 0-dim tensors
  /// set from the optimizer's (Note [The optimizer's own state]). Valid until
  /// the next call. Throws what operator() throws for the optimizer's state.
  const OptimizerState& optimizer_state() const;
  /// Takes the step counts of the tensors optimizer_state() returned, after
  /// the caller wrote them (spmd copies rank 0's state to every rank), as the
  /// optimizer's own counts. Reads them back to the host: a device sync when
  /// the counts live on a GPU (capturable).
  void adopt_step_counts() const;
  /// The total norm of the gradients the latest call clipped, before
  /// clipping (what torch::nn::utils::clip_grad_norm_ returns), a 0-dim
  /// tensor on the gradients' device (reading it waits for the step).
  /// Throws PipelineError without TrainStepOptions::clip_grad_norm or before
  /// the first call.
  const at::Tensor& grad_norm() const;

 private:
  friend TrainStep compile_train_step(std::shared_ptr<torch::nn::Module>, torch::optim::Optimizer&, LossFn,
                                      const Builder&, TrainStepOptions);
  std::shared_ptr<detail::TrainStepState> state_;
};

/// Compiles `loss_fn` over `module` followed by `optimizer`'s update as one
/// graph with `builder`'s stages (Note [Train step graph]); compilation
/// happens at the first call or TrainStep::compile. `optimizer` must be a
/// torch::optim::SGD, Adam or AdamW (optimizer_group_options) over parameters
/// of `module`, and must outlive the TrainStep (its learning rates and state
/// are read at every call). Its state is the step's: where it holds some
/// (eager steps before, a checkpoint loaded) the step continues from it, and
/// each call updates it in place and makes it where torch::optim would, so
/// that the optimizer can be saved, loaded, inspected or stepped eagerly
/// between calls (Note [The optimizer's own state]).
/// Compiles nothing itself; throws PipelineError when `module` is null,
/// `loss_fn` is empty, the optimizer is not SGD, Adam or AdamW, has no
/// param groups, updates a tensor that is
/// not one of the module's parameters or lists one more than once (eager
/// would update it once per listing), or has no parameters, and when a
/// clipping option is NaN. Compile errors come at the first call or
/// TrainStep::compile.
/// `options.gradient_hook`, where set, rewrites the gradients in the traced
/// step; a hook that returns another count of gradients makes the first
/// compilation throw PipelineError.
TrainStep compile_train_step(std::shared_ptr<torch::nn::Module> module, torch::optim::Optimizer& optimizer,
                             LossFn loss_fn, const Builder& builder, TrainStepOptions options = {});
/// The same with Builder()'s defaults: the best registered backend with its
/// decompositions (the inductor where the program links crucible-inductor,
/// as torch.compile defaults to it; else the interpreter).
TrainStep compile_train_step(std::shared_ptr<torch::nn::Module> module, torch::optim::Optimizer& optimizer,
                             LossFn loss_fn);

}  // namespace crucible::pipeline
