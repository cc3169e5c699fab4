// A zoo model with a seeded batch and an SGD optimizer, and the graphs the
// benchmarks time: its forward and joint traces and an unoptimized train step.
#pragma once

#include <crucible/models/zoo.h>
#include <crucible/pipeline/train_step.h>
#include <crucible/tracer/make_fx.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace crucible::bench {

/// The batch size the benchmarks use for a zoo model: small enough for a
/// 2-core machine, large enough that the models do real work.
int64_t bench_batch(const std::string& model);

struct ZooSetup {
  /// The zoo model `name` (weights from torch::manual_seed(0)) in train mode,
  /// on example_batch(bench_batch(name), 0).
  explicit ZooSetup(const std::string& name);
  /// Any model, on its example_batch(batch_size, 0).
  ZooSetup(models::Model model, int64_t batch_size);
  ~ZooSetup();

  pipeline::LossFn loss() const;
  /// functional_call of the forward on the batch's inputs (real tensors).
  tracer::TraceResult trace_forward(bool functionalize) const;
  /// Forward, loss and loss.backward(), functionalized, gradients as outputs.
  tracer::TraceResult trace_joint() const;
  /// A train step (SGD with momentum) compiled for the batch with no pass.
  pipeline::TrainStep unoptimized_step() const;

  models::Model model;
  /// {inputs, targets}
  std::vector<at::Tensor> batch;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

}  // namespace crucible::bench
