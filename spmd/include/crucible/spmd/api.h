// spmd::compile: a whole training step compiled data-parallel, as
// torch.distributed._spmd's compile (torch/distributed/_spmd/api.py):
// trace the stateless step (pipeline's train step: parameters, buffers and
// optimizer state lifted into the graph's flat state), expand it for data
// parallelism (Note [Data-parallel expansion]), dedup collectives, apply
// each Override's transform and the gm_transformation, then run it on every
// call. The step itself is the same as pipeline::compile_train_step's.
#pragma once

#include <crucible/ir/graph.h>
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/train_step.h>
#include <crucible/spmd/data_parallel.h>
#include <crucible/spmd/process_group.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace crucible::spmd {

/// Replaces a submodule while the step is traced and splices the real
/// computation into the graph afterwards (the seed's Override): for
/// submodules a trace cannot or should not see through (e.g. an MoE layer
/// with its own collectives).
class Override {
 public:
  virtual ~Override() = default;
  /// Called before tracing for every submodule, depth first, with its fully
  /// qualified name ("blocks.0.attn"). Return `submodule` to keep it (its
  /// children are visited next) or a module to trace in its place (installed
  /// with torch::nn::Module::replace_module: it takes effect where the
  /// parent's forward reaches the child through its registry, and for the
  /// parameters the step sees).
  virtual std::shared_ptr<torch::nn::Module> replacement(const std::string& fqn,
                                                         const std::shared_ptr<torch::nn::Module>& submodule) = 0;
  /// Called once per compilation after the expansion and dedup, with the
  /// graph and its flat state (pipeline::TrainStep::graph_inputs' state
  /// tensors: parameters, buffers, optimizer state). May rewrite the graph
  /// in place (the verifier checks it afterwards).
  virtual void transform(ir::Graph& graph, const std::vector<at::Tensor>& flat_state) = 0;
};

/// How spmd::compile compiles.
struct SpmdOptions {
  /// Applied in order (Override).
  std::vector<std::shared_ptr<Override>> module_override;
  /// Applied to the expanded graph once per compilation, after the
  /// overrides (the seed applies it at the first iteration).
  std::function<void(ir::Graph&)> gm_transformation;
  /// The data-parallel mode: the group, replicated or fully-sharded
  /// parameters (DataParallelOptions::style), and the bucket size.
  DataParallelOptions parallel_mode;
  /// Before each step, copy rank 0's buffers (batch norm's running
  /// statistics, ...) to every rank, as DDP's broadcast_buffers (on by
  /// default there too) does before each forward: a rank then ends a step
  /// with rank 0's buffers updated by its own shard's forward. Only the
  /// buffers the step writes are copied (the others never differ between
  /// ranks unless the program changes them on one rank itself). Off: each
  /// rank's buffers evolve from its own shards alone (they start as rank
  /// 0's, broadcast by compile) and drift apart. See Note [Buffers across
  /// ranks] in src/api.cpp.
  bool broadcast_buffers = true;
  /// The stages after the expansion (post-grad passes, backend,
  /// instruments); the expansion runs as its first joint passes. Its
  /// default is Builder()'s: the best registered backend (the inductor
  /// where the program links crucible-inductor).
  pipeline::Builder builder;
};

/// What the expansion made of the latest compilation.
struct SpmdReport {
  DataParallelReport data_parallel;
  /// Collectives dedup_collectives removed.
  size_t deduplicated = 0;
  /// DataParallelStyle::FullyShard's parameters and gathers (zeros under
  /// Replicate).
  FullyShardReport fully_shard;
  /// The graph's hash, the same on every rank (checked at compile time).
  std::string graph_hash;
};

namespace detail {
struct SpmdState;
}

/// A data-parallel training step. Copies share one state.
class SpmdStep {
 public:
  /// One step on this rank's shard of the global batch: the gradients are
  /// averaged over the group before the optimizer reads them, so every rank
  /// updates its parameters alike (a parameter without a gradient, frozen
  /// or unused by the loss, is not updated, as under DDP); with
  /// SpmdOptions::broadcast_buffers, rank 0's buffers are copied to every
  /// rank first (coalesced by dtype; on NCCL the stream waits for it, and
  /// the call blocks on it with the step's collectives). Returns this
  /// rank's loss (0-dim, detached; the global batch's loss is the mean over
  /// ranks for a mean loss).
  /// Compiles first, as pipeline::TrainStep does. Batch tensors that are
  /// views at a storage offset (a slice of the global batch) are copied
  /// first, so that every rank compiles the same graph. On NCCL it returns
  /// once the step is launched and its collectives have completed, each
  /// within the group's timeout (the update may still be running on the
  /// GPU; Note [Waiting for NCCL] in src/collectives.cpp). Throws SpmdError
  /// when a collective fails or times out (naming the rank), or when the
  /// ranks' graphs differ at compile time (naming the ranks); what
  /// TrainStep throws otherwise.
  at::Tensor operator()(const std::vector<at::Tensor>& batch) const;
  /// Compiles for `batch` without running a step (TrainStep::compile):
  /// every rank must call it, as it compares the ranks' graphs.
  void compile(const std::vector<at::Tensor>& batch) const;
  /// The graph of the latest compilation, expanded (TrainStep::graph).
  const ir::Graph& graph() const;
  /// The compiled step underneath.
  const pipeline::TrainStep& train_step() const;
  const ProcessGroup& group() const;
  /// Under DataParallelStyle::FullyShard: gathers every sharded parameter,
  /// and the optimizer's state for it, whole into the module's and the
  /// optimizer's own tensors (an all_gather of each: every rank calls it
  /// at the same point, and then holds the whole model), as FSDP2's
  /// unshard() does: to evaluate the module eagerly, or save it and the
  /// optimizer as one process would. The next call of the step cuts them
  /// into shards again. (Each rank's shards, between steps, are its module's
  /// parameters and its optimizer's state: torch::save and torch::load them
  /// per rank, for a job of the same world size.) A no-op under Replicate
  /// and while whole. Throws SpmdError when a gather fails.
  void unshard() const;
  /// The module's state whole, on the CPU, on rank 0 alone: its parameters
  /// then its buffers, named and ordered as named_parameters() and
  /// named_buffers() give them (every other rank gets an empty list), as
  /// FSDP2's get_model_state_dict(model, StateDictOptions(
  /// full_state_dict=True, cpu_offload=True)): one checkpoint a single
  /// process can load. Under FullyShard each sharded parameter is gathered
  /// in turn (an all_gather: every rank calls this at the same point), so a
  /// rank holds one whole parameter at a time on its device, and the module
  /// keeps its shards. Under Replicate, rank 0's own tensors, copied. Throws
  /// SpmdError when a gather fails.
  std::vector<std::pair<std::string, at::Tensor>> full_state_dict() const;
  /// Throws SpmdError before the first compilation.
  const SpmdReport& report() const;

 private:
  friend SpmdStep compile(std::shared_ptr<torch::nn::Module>, torch::optim::Optimizer&, pipeline::LossFn, SpmdOptions);
  std::shared_ptr<detail::SpmdState> state_;
};

/// Compiles `loss_fn` over `module` and `optimizer` (as
/// pipeline::compile_train_step) data-parallel over the group
/// `options.parallel_mode.group` (init_process_group first). Applies the
/// overrides' replacements, then makes every rank start alike, as DDP does:
/// rank 0's parameters, buffers and optimizer state are broadcast to the
/// others (blocking: every rank must call compile). Under
/// DataParallelStyle::FullyShard it then cuts, in place, each parameter the
/// optimizer updates and the optimizer's state for it into this rank's
/// shard (Note [Fully-sharded step] in data_parallel.h): from then on the
/// module holds shards, which `module->forward` cannot run on; train
/// through the step, and SpmdStep::unshard() for the whole model.
/// Throws SpmdError when the group does not exist or the broadcast fails;
/// what pipeline::compile_train_step throws.
SpmdStep compile(std::shared_ptr<torch::nn::Module> module, torch::optim::Optimizer& optimizer,
                 pipeline::LossFn loss_fn, SpmdOptions options = {});

}  // namespace crucible::spmd
