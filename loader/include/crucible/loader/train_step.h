// A training step exported by pipeline::export_train_step, loaded and run
// without the compiler: this library needs LibTorch and Crucible's run-time
// libraries (the graph, the inductor's run-time plan and kernel loader),
// no tracer, AOTAutograd, code generator, NVRTC or C++ compiler.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace crucible {

namespace detail {
struct LoadedStepState;
}

/// A loaded training step (Note [Exported training step] in
/// pipeline/export.h). Copies share one state.
class LoadedTrainStep {
 public:
  /// One step on `batch` (the tensors the exported step took, of the
  /// example batch's sizes, dtypes and device): updates the parameters,
  /// buffers and optimizer state in place, as the exported step did, and
  /// returns the loss. Throws runtime::PackageError, before anything runs,
  /// for a batch of another count, dtype, sizes or device (naming the
  /// tensor and what the package expects); the backend's errors otherwise.
  at::Tensor operator()(const std::vector<at::Tensor>& batch) const;
  /// The batch the step was exported with (example_batch.pt).
  const std::vector<at::Tensor>& example_batch() const;
  /// The parameters and buffers the step trains, by name: the module's
  /// own where one was bound, else the package's copies.
  std::vector<std::pair<std::string, at::Tensor>> named_module_state() const;
  /// The optimizer state and learning rates the step reads and updates,
  /// by name ("fc.weight.exp_avg", "lr"): the package's, then each step's.
  /// Writing a learning rate's 0-dim tensor changes the next step's rate.
  std::vector<std::pair<std::string, at::Tensor>> named_optimizer_state() const;
  /// The tensors the step reads from outside the module (lifted inputs:
  /// another module's weights, a tensor the loss captured), by the names
  /// load_train_step binds them by: those given to it, else the package's.
  std::vector<std::pair<std::string, at::Tensor>> named_lifted_inputs() const;

 private:
  friend LoadedTrainStep load_train_step(const std::string&, std::shared_ptr<torch::nn::Module>,
                                         const std::vector<std::pair<std::string, at::Tensor>>&);
  std::shared_ptr<detail::LoadedStepState> state_;
};

/// Loads the package in `dir`. With `module`, the step trains its
/// parameters and buffers, bound by name (named_parameters /
/// named_buffers), each of the package's dtype, sizes and device; without,
/// the package's copies of them as exported (module.pt). The optimizer
/// state starts where it was at export (state.pt), or, for a package
/// exported without it, from zeros as a fresh optimizer's does, with the
/// learning rates and step counts of the export. The tensors the step read
/// from outside the module are `lifted`'s, by name (as the manifest and
/// named_lifted_inputs name them: "d.fc.weight"), read at every step as
/// in the process; those not given, their values at export (lifted.pt).
/// Reads and checksums only the tensor files it binds. Throws
/// runtime::PackageError for a package that is missing, malformed, of
/// another format or LibTorch version, corrupt or altered (checksums),
/// written by a backend this loader cannot run, or without weights when no
/// module is given (or without a lifted tensor's value when `lifted` lacks
/// it); for a module that lacks a tensor the package names or holds one of
/// another dtype, sizes or device, and the same for `lifted` (a name the
/// package does not read included); and the backend's errors (the
/// inductor's InductorError: another code generator version, kernels built
/// for another CPU or another GPU architecture).
LoadedTrainStep load_train_step(const std::string& dir, std::shared_ptr<torch::nn::Module> module = nullptr,
                                const std::vector<std::pair<std::string, at::Tensor>>& lifted = {});

}  // namespace crucible
