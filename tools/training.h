// What the commands that train or compile a zoo model share: the optimizer
// flags, the loss of a zoo model as a training step's LossFn, and the
// per-stage compile times in stage order.
#pragma once

#include <crucible/pipeline/train_step.h>
#include <crucible/models/zoo.h>

#include <optional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace CLI {
class App;
}
namespace crucible::runtime {
class PhaseTimer;
}

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
  /// Adds the four flags to `cmd`.
  void add_to(CLI::App& cmd);
  /// A torch::optim optimizer of this kind over `params`.
  std::unique_ptr<torch::optim::Optimizer> make(const std::vector<at::Tensor>& params) const;
};

/// --passes P,...: the pass list, by name (default: the builder's).
void add_passes_option(CLI::App& cmd, std::vector<std::string>& passes);

/// Seconds per stage, from the PhaseTimer a StageTimer recorded into, in the
/// order the stages first ran (trace, partition, the passes, backend); a pass
/// listed twice is one entry with both runs' time.
std::vector<std::pair<std::string, double>> ordered_stages(const runtime::PhaseTimer& timer);

/// "trace 85.1 ms, dce 1.2 ms, ...; total 89.8 ms"
std::string describe_stages(const std::vector<std::pair<std::string, double>>& stages);

/// printf's %.<digits>f.
std::string fixed(double value, int digits);

}  // namespace crucible::tools
