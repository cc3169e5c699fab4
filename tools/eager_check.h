// `crucible train --check-eager` with a backend whose kernels round
// differently from eager's (inductor's fused loops): Note [Agreement with
// eager for a fused backend].
#pragma once

#include <crucible/models/zoo.h>
#include <crucible/pipeline/builder.h>
#include <crucible/runtime/same.h>

#include <memory>
#include <string>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace crucible::tools {

// Note [Agreement with eager for a fused backend]
// Fusion sums in another order than eager's kernels, and training turns
// last-bit differences into different trajectories: after an epoch of Adam
// the ConvNet's parameters end 0.2 apart, though neither run is wrong. So
// with a fused backend --check-eager checks what torch.compile's accuracy
// checks do (torch/_dynamo/utils.py's same(): allclose at 1e-4, else an
// RMSE against a float64 run no worse than a small multiple of eager's own):
//  * one step from identical state: the loss, the gradients (the backend's
//    AOT forward and backward of the same loss) and the updated parameters
//    (the compiled training step), each against eager's with a float64
//    copy of the model as the reference;
//  * over the run, the loss curves: the mean loss of each of (up to) ten
//    equal windows of steps within 2% of eager's;
//  * the test accuracy within 1 point of eager's.
// The last two bounds are what rounding alone gives: the ConvNet's epoch of
// Adam (`./x demo`) through inductor, seeds 0 to 4, ended with loss curves
// 0.73, 0.75, 1.00, 0.78 and 1.22% apart and test accuracies 0.62, 0.26,
// 0.54, 0.37 and 0.79 points apart, from two correct runs; a kernel that is
// wrong fails the first step's check, which is the precise one.
// The interpreter runs eager's kernels and keeps the bitwise check.

/// The one-step verdicts (runtime::same of eager's against the backend's,
/// a float64 run as the reference); a failed one's reason says which tensor.
struct OneStepAgreement {
  runtime::SameResult loss, gradients, parameters;
  bool ok() const { return loss.ok && gradients.ok && parameters.ok; }
};

/// A new zoo model `name` of `size` holding `from`'s parameters and buffers,
/// on `device` in `dtype`, in train mode: the eager copy, the float64
/// reference, the gradients' copy.
models::Model copy_of(const std::string& name, const std::string& size, const models::Model& from, at::Device device,
                      at::ScalarType dtype);

/// The gradients of `model`'s loss on `batch` from the backend's AOT
/// forward and backward: `builder.compile(module, loss)` on a copy of
/// `model` (same state, same device), one per parameter in parameters()
/// order (undefined where none flows). `model` itself is untouched.
std::vector<at::Tensor> compiled_gradients(const pipeline::Builder& builder, const std::string& model_name,
                                           const std::string& size, const models::Model& model,
                                           const data::Batch& batch);

/// The float64 reference of the first step: a copy of `model` (its state
/// before any step) in float64, and an optimizer of the same kind over it.
struct Float64Reference {
  models::Model model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

/// `batch` with floating inputs in float64 (token ids stay integers).
data::Batch in_float64(const data::Batch& batch);

/// Compares one step from identical state: the losses, the gradients
/// (`compiled_grads` against eager's and the reference's .grad after their
/// step) and the parameters after the step (`compiled` against `eager`,
/// `reference` stepped once in float64).
OneStepAgreement compare_one_step(const at::Tensor& compiled_loss, const at::Tensor& eager_loss,
                                  const at::Tensor& reference_loss, const std::vector<at::Tensor>& compiled_grads,
                                  const torch::nn::Module& compiled, const torch::nn::Module& eager,
                                  const torch::nn::Module& reference);

/// The loss curves: per-step losses of the two runs (same length), split
/// into min(10, steps) windows of equal length (the last takes the
/// remainder); the largest relative difference of the windows' means.
double loss_curve_difference(const std::vector<double>& compiled, const std::vector<double>& eager);

}  // namespace crucible::tools
