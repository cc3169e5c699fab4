// What the commands that train or compile a zoo model share: the optimizer
// and compile flags, a zoo step's flags, the loss of a zoo model as a training step's LossFn, and the
// per-stage compile times in stage order.
#pragma once

#include <crucible/models/zoo.h>
#include <crucible/pipeline/train_step.h>

#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace CLI {
class App;
class Validator;
}  // namespace CLI
namespace crucible::runtime {
class Counters;
class PhaseTimer;
}  // namespace crucible::runtime
namespace crucible::partitioner {
struct MinCutReport;
}  // namespace crucible::partitioner

namespace crucible::tools {

/// --optimizer, --lr, --momentum, --weight-decay.
struct OptimizerFlags {
  std::string kind = "adam";  ///< sgd, adam or adamw
  std::optional<double> lr;   ///< unset: default_lr()
  double momentum = 0.9;      ///< SGD only
  double weight_decay = 0;

  /// 0.002 for adam and adamw, 0.02 for sgd.
  double default_lr() const;
  double effective_lr() const { return lr.value_or(default_lr()); }
  /// Adds the seven flags to `cmd`.
  void add_to(CLI::App& cmd);
  /// A torch::optim optimizer of this kind over `params`.
  std::unique_ptr<torch::optim::Optimizer> make(const std::vector<at::Tensor>& params) const;
};

/// --passes, --pre-grad-passes, --joint-passes, --trace-mode,
/// --decompositions, --partitioner, --memory-budget, --remat-max-slowdown,
/// --no-remat: how the builder compiles (Note [Pass
/// phases], AotConfig::trace_mode, tracer::core_aten_decompositions, Note
/// [Min-cut partition]).
struct CompileFlags {
  std::vector<std::string> passes;           ///< post-grad; default: the builder's
  std::vector<std::string> pre_grad_passes;  ///< given: replaces the backend's ("none": no pass)
  bool pre_grad_given = false;
  std::vector<std::string> joint_passes;
  std::string trace_mode = "auto";  ///< auto, real or fake
  /// auto (core for the inductor backends, none for others), none or core
  /// (tracer::core_aten_decompositions)
  std::string decompositions = "auto";
  std::string partitioner = "default";  ///< default or min-cut (partitioner/min_cut_partition.h)
  double memory_budget = 1.0;           ///< min-cut's MinCutOptions::memory_budget
  /// min-cut inside a training step only where the backend's cost model
  /// says it is at most this share slower (MinCutOptions::max_slowdown);
  /// unset: the builder's default (Builder::remat), or with min-cut
  /// wherever it lowers the peak.
  std::optional<double> remat_max_slowdown;
  bool no_remat = false;  ///< no rematerialization inside a training step
  /// Adds the nine flags to `cmd`.
  void add_to(CLI::App& cmd);
  /// Sets the builder's pass lists, trace mode, decompositions ("auto"
  /// reads the builder's backend: set it first) and partitioner; with
  /// min-cut, `on_partition` (if set) receives what each AOT partition saved
  /// and recomputed, and why. Throws ir::IrError for an unknown pass.
  void apply(pipeline::Builder& builder, std::function<void(const partitioner::MinCutReport&)> on_partition = {}) const;
};

/// --model, --backend, --size, CompileFlags, OptimizerFlags and --batch:
/// a zoo model's training step on an example batch, as `crucible compile`
/// and `crucible export` build it.
struct ZooStepFlags {
  std::string model = "mlp";
  std::string backend;  ///< default: the best registered backend
  std::string size = "small";
  CompileFlags compile;
  OptimizerFlags optimizer;
  int64_t batch = 8;
  ZooStepFlags();
  /// Adds the flags to `cmd`; `batch_help` says what --batch sizes.
  void add_to(CLI::App& cmd, const std::string& batch_help);
};

/// --size small|full: the zoo's model sizes (models::model_sizes()).
void add_size_option(CLI::App& cmd, std::string& size);

/// --device cpu|cuda, described by `help`.
void add_device_option(CLI::App& cmd, std::string& device, const std::string& help);

/// Throws pipeline::PipelineError naming --device cuda and what to do
/// (`verb` with --device cpu) when `device` is a GPU and no CUDA device is
/// usable here.
void require_usable(const at::Device& device, const std::string& verb);

/// Checks that a count (--epochs, --batch) is at least 1, saying so in words.
CLI::Validator at_least_one();
/// Checks that a number (--lr) is greater than 0, saying so in words.
CLI::Validator greater_than_zero();
/// Checks that a share (--memory-budget) is from 0 to 1, saying so in words.
CLI::Validator between_zero_and_one();

/// Seconds per innermost stage, from the PhaseTimer a runtime::StageTimer
/// recorded into, in the order the stages first ran (collect_metadata,
/// trace_inference, the passes, backend, ...; Note [Compilation stages]);
/// stages that hold others ("compile", the compilers) are left out, so the
/// figures add up; a stage run twice is one entry with both runs' time.
std::vector<std::pair<std::string, double>> ordered_stages(const runtime::PhaseTimer& timer);

/// Seconds of the outermost stages ("compile"): the whole compile time.
double total_stage_s(const runtime::PhaseTimer& timer);

/// "trace_inference 85.1 ms, dce 1.2 ms, ...; total 89.8 ms", the total from
/// total_stage_s.
std::string describe_stages(const runtime::PhaseTimer& timer);

/// "stats.compilations: 1, graphs.inference: 1, ...": the counters of a
/// runtime::CounterRecorder, on one line; "none" when empty.
std::string describe_counters(const runtime::Counters& counters);

/// printf's %.<digits>f.
std::string fixed(double value, int digits);

}  // namespace crucible::tools
