// The parameters of a fully-sharded step and what it traces around the
// user's loss: Note [Fully-sharded step] in data_parallel.h. Private to spmd.
#pragma once

#include <crucible/pipeline/optim.h>
#include <crucible/pipeline/train_step.h>
#include <crucible/spmd/process_group.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace crucible::spmd::detail {

class FullyShard : public std::enable_shared_from_this<FullyShard> {
 public:
  /// `params`: the optimizer's parameters in its order (the order
  /// pipeline's gradient hook gives their gradients in), whole.
  /// `param_dtype`: DataParallelOptions::param_dtype.
  FullyShard(ProcessGroup group, std::string group_name, std::vector<at::Tensor> params,
             std::optional<c10::ScalarType> param_dtype);

  /// Cuts every parameter and the tensors of `state` (the optimizer's own,
  /// TrainStep::optimizer_state(), one ParamState per parameter) of the
  /// parameter's sizes into this rank's chunk, in place (set_data). Every
  /// rank must hold the same values (after the broadcast of rank 0's). A
  /// no-op while sharded.
  void shard(const pipeline::OptimizerState& state);
  /// The inverse: every parameter and its state gathered whole, in place (a
  /// blocking all_gather of each: every rank calls it alike). A no-op while
  /// whole.
  void unshard(const pipeline::OptimizerState& state);
  bool sharded() const { return sharded_; }
  /// `param` whole, gathered from the ranks' shards (a blocking all_gather:
  /// every rank calls it alike) where it is a sharded parameter while
  /// sharded; `param` itself otherwise.
  at::Tensor whole(const at::Tensor& param) const;

  /// The step's TrainStepOptions::around_loss: whole parameters in place of
  /// the shards while the loss and its backward run (traced: all_gather,
  /// and a reduce_scatter hook).
  pipeline::AroundLoss around_loss();
  /// The step's TrainStepOptions::around_pre_grad_trace: with true, points
  /// each parameter at its whole value (a blocking all_gather: every rank
  /// compiles alike), which the pre-grad passes' trace of the loss reads;
  /// with false, back at its shard (never throws).
  std::function<void(bool)> around_pre_grad_trace();
  /// The gradient hook that hands the update the reduced shards of the
  /// gradients and points the parameters back at their shards.
  pipeline::GradientHook gradient_hook();

  size_t num_sharded() const { return params_.size(); }

 private:
  struct Param {
    at::Tensor tensor;           // the module's and the optimizer's, holding this rank's shard
    std::vector<int64_t> sizes;  // the whole parameter's
    int64_t rows = 0;            // dim 0 (1 for a 0-dim parameter)
    int64_t chunk = 0;           // rows of a shard: ceil(rows / world)
    c10::ScalarType dtype{};     // the shard's (the master copy's)
    // While the pre-grad passes trace the loss: the shard, put back after.
    at::Tensor untraced_shard;
    // While a step traces: the shard it was given, the hook on the
    // parameter, and the gradient's reduced shard.
    at::Tensor traced_shard;
    std::optional<unsigned> hook;
    at::Tensor grad_shard;
  };
  at::Tensor cut(const at::Tensor& whole, const Param& p) const;
  at::Tensor whole_of(const at::Tensor& gathered, const Param& p) const;
  at::Tensor gather(const at::Tensor& shard, const Param& p) const;
  // The shard as it is gathered: cast to param_dtype_.
  at::Tensor to_gather(const at::Tensor& shard) const;
  // Removes the hooks and, with `point_back`, points every parameter back
  // at the shard its trace was given.
  void restore(bool point_back);

  ProcessGroup group_;
  std::string group_name_;
  std::vector<Param> params_;
  std::optional<c10::ScalarType> param_dtype_;
  bool sharded_ = false;
};

}  // namespace crucible::spmd::detail
