// Traceable optimizer updates: SGD (momentum, dampening, Nesterov, weight
// decay), Adam (optionally AMSGrad) and AdamW, written as ATen ops on tensors
// only, so that a trace of a whole training step captures them as graph ops.
//
// Note [Traceable optimizer state]
// torch::optim keeps each parameter's step count as a C++ integer and computes
// Adam's bias corrections 1 - beta^step, and SGD's "first step" branch, on the
// host. A trace records host values as constants, so a traced torch::optim
// step would replay step 1 forever. Here everything that changes from step to
// step is a tensor: the step count (float64, 0-dim, exact for counts below
// 2^53), and the learning rate (float64, 0-dim, a per-call input so schedules
// work). Both live on the CPU whatever the parameters' device, as torch.optim
// keeps its step when not capturable: the bias corrections stay host
// arithmetic, and on a GPU the 0-dim CPU operands take the same CPU-scalar
// kernel paths (e.g. division as multiplication by the reciprocal) that
// torch::optim's host doubles take, which keeps the two bitwise equal there too. Bias corrections are computed from the
// step tensor with ATen ops, and SGD's first step is selected with where() on
// step == 0 — or, without dampening, needs no branch at all: the momentum
// buffer starts at zero, and momentum * 0 + d_p is d_p exactly, so the later
// steps' in-place update also gives the first step's value, at the cost of
// torch's own update (the where() would read and write every buffer twice more). Nothing reads a tensor back to the
// host. Hyperparameters that stay fixed for a run (betas, eps, momentum, dampening, weight decay) are plain doubles and
// become graph constants.
//
// With OptimizerOptions::capturable (torch.optim's `capturable`), the step
// counts and the learning rate live on the parameters' device instead: the
// whole update is device work, which a CUDA graph can capture and replay
// (a host value read at capture would be baked into the graph). The bias
// corrections are then computed on the device, which rounds as torch.optim's
// capturable Adam does, not bitwise as torch::optim's host doubles.
//
// Numerics: each update runs the same ATen ops, with the same operands in the
// same order, as torch::optim's C++ implementation (torch/csrc/api/src/optim/
// sgd.cpp, adam.cpp, adamw.cpp in LibTorch 2.11); a host double that depended
// on the step or the learning rate is a float64 0-dim tensor here, which ATen
// rounds to the parameter's dtype exactly as it rounds a Scalar. The tests
// check agreement with torch::optim over 100+ steps of real gradients.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <optional>
#include <string>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace crucible::pipeline {

enum class OptimizerKind { SGD, Adam, AdamW };

/// Hyperparameters, named and defaulted as torch::optim::SGDOptions /
/// AdamOptions / AdamWOptions (but note: torch's AdamW defaults weight_decay
/// to 1e-2, this struct to 0 for every kind; set it explicitly).
struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::SGD;
  double lr = 1e-2;  ///< the initial learning rate, for lr_tensor(); each step takes the rate as a tensor
  double weight_decay = 0;
  // SGD
  double momentum = 0;
  double dampening = 0;
  bool nesterov = false;
  // Adam / AdamW
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  bool amsgrad = false;
  /// The device type the parameters live on, which decides how the Adam
  /// update rounds (torch::optim's kernels round differently per device,
  /// see adam_step). Unset: each parameter's own device's.
  std::optional<c10::DeviceType> device_type{};
  /// Keep the step counts (init_optimizer_state) and the learning rate
  /// (lr_tensor's device) on the parameters' device, as torch.optim's
  /// `capturable` does, so that a CUDA graph can capture the update (Note
  /// [Traceable optimizer state]). Off: both on the CPU, bitwise as
  /// torch::optim.
  bool capturable = false;

  bool operator==(const OptimizerOptions&) const = default;
};

/// One parameter's optimizer state; a tensor is defined only where the
/// options need it. All are updated in place by the step functions.
struct ParamState {
  at::Tensor step;             ///< float64 0-dim: updates applied so far (every kind)
  at::Tensor momentum_buffer;  ///< SGD with momentum != 0; shape of the parameter
  at::Tensor exp_avg;          ///< Adam/AdamW first moment; shape of the parameter
  at::Tensor exp_avg_sq;       ///< Adam/AdamW second moment
  at::Tensor max_exp_avg_sq;   ///< Adam/AdamW with amsgrad
};

struct OptimizerState {
  std::vector<ParamState> params;  ///< one per parameter, in the parameters' order

  /// Every defined state tensor, parameter by parameter, each in ParamState's
  /// field order: the "flat_state" a compiled training step lifts as inputs.
  std::vector<at::Tensor> flat() const;
  /// The inverse of flat() for `num_params` parameters under `options`
  /// (e.g. to run a step on a trace's placeholders). Throws PipelineError when
  /// the count of tensors does not match.
  static OptimizerState from_flat(const OptimizerOptions& options, size_t num_params,
                                  const std::vector<at::Tensor>& flat);
  /// The ParamState fields `options` keeps, in flat() order, as torch::optim
  /// names them ("step", "momentum_buffer", "exp_avg", ...).
  static std::vector<std::string> field_names(const OptimizerOptions& options);
};

/// Fresh state for `params` (step 0 on the CPU, or on the parameter's device
/// when options.capturable; zero buffers with each parameter's sizes, dtype
/// and device), as torch::optim creates lazily on its first step.
OptimizerState init_optimizer_state(const OptimizerOptions& options, at::TensorList params);

/// A learning rate as the float64 0-dim tensor the step functions take, on
/// `device`: the CPU keeps GPU updates bitwise equal to torch::optim's, the
/// parameters' device makes the update capturable (Note [Traceable optimizer
/// state]).
at::Tensor lr_tensor(double lr, c10::Device device = c10::kCPU);

/// SGD, mirroring torch::optim::SGD::step (sgd.cpp), for each parameter p with
/// gradient g (parameters whose gradient is undefined are skipped, as there):
///   d = g + weight_decay * p                          (if weight_decay != 0)
///   if momentum != 0:
///     buf = d                                         (first step: step == 0;
///                                                      buf starts at 0, see the Note)
///     buf = momentum * buf + (1 - dampening) * d      (later steps)
///     d   = nesterov ? d + momentum * buf : buf
///   p  -= lr * d;  step += 1
/// `lr` is a 0-dim float64 tensor (lr_tensor). Updates params and state in
/// place under a no-grad guard. Throws PipelineError when params, grads and
/// state disagree in length or the options are not SGD's.
void sgd_step(const OptimizerOptions& options, at::TensorList params, at::TensorList grads, OptimizerState& state,
              const at::Tensor& lr);

/// Adam (kind Adam) and AdamW (kind AdamW), mirroring torch::optim::Adam::step
/// (adam.cpp) and torch::optim::AdamW::step (adamw.cpp):
///   AdamW: p *= 1 - lr * weight_decay                 (if weight_decay != 0)
///   step += 1;  bc1 = 1 - beta1^step;  bc2 = 1 - beta2^step   (float64 tensors)
///   Adam:  g = g + weight_decay * p                   (if weight_decay != 0)
///   m = beta1 * m + (1 - beta1) * g
///   v = beta2 * v + (1 - beta2) * g * g
///   vmax = max(vmax, v) and use vmax for v            (amsgrad)
///   denom = sqrt(v) / sqrt(bc2) + eps
///   p += (-(lr / bc1) * m) / denom                   (CPU; on CUDA fma(-(lr / bc1), m / denom, p),
///                                                      each as torch::optim's addcdiv_ rounds there)
/// Same arguments, guard and errors as sgd_step.
void adam_step(const OptimizerOptions& options, at::TensorList params, at::TensorList grads, OptimizerState& state,
               const at::Tensor& lr);

/// sgd_step or adam_step, by options.kind.
void optimizer_step(const OptimizerOptions& options, at::TensorList params, at::TensorList grads, OptimizerState& state,
                    const at::Tensor& lr);

/// The options of a torch::optim::SGD, Adam or AdamW (its param groups must
/// share one set of options). Throws PipelineError for other optimizers or for
/// groups with different options.
OptimizerOptions optimizer_options_from(const torch::optim::Optimizer& optimizer);

/// The options of each param group of a torch::optim::SGD, Adam or AdamW, in
/// the optimizer's order; groups may differ in any option (a learning rate
/// per group, no weight decay for biases and norms). Throws PipelineError for
/// other optimizers or an optimizer with no param groups.
std::vector<OptimizerOptions> optimizer_group_options(const torch::optim::Optimizer& optimizer);

}  // namespace crucible::pipeline
