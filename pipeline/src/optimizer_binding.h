// The torch::optim optimizer's own state as a compiled training step's
// optimizer-state inputs: Note [The optimizer's own state].
#pragma once

#include <crucible/pipeline/optim.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace torch::optim {
class Optimizer;
class OptimizerParamState;
}  // namespace torch::optim

namespace crucible::pipeline::detail {

// Note [The optimizer's own state]
// A compiled step reads and writes the torch::optim optimizer's own state
// tensors (momentum_buffer, exp_avg, exp_avg_sq, max_exp_avg_sq): they are
// the graph's State inputs, aliases with no copy, which its trailing copy_
// nodes update in place (Note [Train step graph]). Whatever the user does
// with the optimizer between calls — torch::save, torch::load, reading or
// replacing optimizer.state(), an eager optimizer.step() — therefore sees
// what the compiled steps did, and they see what it did, as with eager
// steps. The rules that keep it so:
//  - Every call binds anew. Each parameter's state is looked up in the
//    optimizer's map (keyed by the parameter's TensorImpl, as torch::optim
//    keys it), so a state torch::load put there since (it replaces the map's
//    entries) is what the next call reads. Its tensors must have the
//    parameter's sizes and device, as eager's step needs (PipelineError
//    otherwise); another address only makes a CUDA graph capture again
//    (Note [CUDA graphs]).
//  - torch::optim makes a parameter's state at its first step with a
//    gradient. Until then the graph reads zeros made here
//    (init_optimizer_state, like the parameter at this call: made again
//    after a module->to()), and after the first call that updates the
//    parameter they go into the optimizer's map as torch::optim would have
//    made them (AdamParamState with step 1; SGDParamState with the momentum
//    buffer; SGD without momentum keeps none). A parameter no gradient
//    reaches gets no state, as in eager; one whose state was erased from
//    the map starts afresh.
//  - Step counts. torch::optim keeps Adam's count as a host int64 (SGD's
//    only as whether a momentum buffer exists); the graph reads it as a
//    float64 0-dim tensor (Note [Traceable optimizer state]), on the device
//    when capturable. The binding keeps that tensor and mirrors the two
//    without reading the device: after a call, the count of every parameter
//    the graph updated (it writes the parameter's step placeholder) is
//    incremented on the host; before a call, a count that differs from the
//    one last mirrored (a state loaded, an eager step taken) is written into
//    the tensor. A caller that writes the tensors themselves (spmd's
//    broadcast of rank 0's state) hands them back with adopt_step_counts().
class OptimizerBinding {
 public:
  /// One parameter of the optimizer, in its order: the tensor, its name in
  /// the module (for errors) and the options of its param group (capturable
  /// set as the step keeps it).
  struct Param {
    at::Tensor tensor;
    std::string name;
    OptimizerOptions options;
  };

  OptimizerBinding(torch::optim::Optimizer& optimizer, std::vector<Param> params);

  /// The optimizer state the next call reads, one ParamState per parameter:
  /// the optimizer's own tensors where it holds state for the parameter,
  /// zeros made here where it holds none; the step tensors are the
  /// binding's, set from the optimizer's counts. Throws PipelineError when
  /// the optimizer's state for a parameter lacks a tensor the options need
  /// (a state saved with other options, e.g. without amsgrad) or holds one
  /// of other sizes or on another device than the parameter.
  const OptimizerState& bind();
  /// After a call that ran the graph: `updated[i]` says whether the graph
  /// updated parameter i. Mirrors the step counts into the optimizer and
  /// puts the state of parameters it had none for into its map. Uses the
  /// state bind() found: call it right after the graph ran.
  void stepped(const std::vector<bool>& updated);
  /// Takes the values of the step tensors bind() returned, written by the
  /// caller, as the optimizer's counts (a parameter counted above zero gets
  /// state in the optimizer's map, one counted zero by SGD loses it). Reads
  /// the counts back to the host: a device sync when capturable.
  void adopt_step_counts();

 private:
  struct Slot {
    Param param;
    at::Tensor step;   // the graph's step count (float64 0-dim)
    ParamState fresh;  // zeros the graph reads while the optimizer holds no state; step unused
    // The optimizer's state for the parameter found by the latest bind(), or null.
    torch::optim::OptimizerParamState* bound = nullptr;
    // The optimizer's count as `step` holds it (SGD: 1 while it has a
    // momentum buffer); nullopt while the optimizer holds no state.
    std::optional<int64_t> mirrored;
  };
  bool keeps_state(const Slot& s) const;
  void make_fresh(Slot& s);
  void set_step(Slot& s, int64_t count);
  void install(Slot& s, int64_t count);

  torch::optim::Optimizer* optimizer_;
  std::vector<Slot> slots_;
  OptimizerState bound_;
};

}  // namespace crucible::pipeline::detail
