#include "training.h"

#include <crucible/partitioner/min_cut_partition.h>
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/error.h>
#include <crucible/runtime/backend_registry.h>
#include <crucible/runtime/instruments.h>
#include <crucible/runtime/timing.h>
#include <crucible/tracer/decomposition.h>

#include <ATen/Context.h>
#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <set>

namespace crucible::tools {

// The defaults train the zoo's small models well in one epoch: the ConvNet
// reaches 86-87% test accuracy on Fashion-MNIST with Adam at batch 32
// (85.9-86.7% over seeds 0-3), above the 85% one epoch usually gives.
double OptimizerFlags::default_lr() const { return kind == "sgd" ? 0.02 : 2e-3; }

void OptimizerFlags::add_to(CLI::App& cmd) {
  cmd.add_option("--optimizer", kind, "torch::optim optimizer")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}))
      ->capture_default_str();
  cmd.add_option("--lr", lr, "learning rate (default 0.002 for adam and adamw, 0.02 for sgd)")
      ->check(greater_than_zero());
  cmd.add_option("--momentum", momentum, "SGD's momentum")->capture_default_str();
  cmd.add_option("--weight-decay", weight_decay, "weight decay")->capture_default_str();
}

std::unique_ptr<torch::optim::Optimizer> OptimizerFlags::make(const std::vector<at::Tensor>& params) const {
  const double rate = effective_lr();
  if (kind == "sgd")
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(rate).momentum(momentum).weight_decay(weight_decay));
  if (kind == "adamw")
    return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(rate).weight_decay(weight_decay));
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(rate).weight_decay(weight_decay));
}

void CompileFlags::add_to(CLI::App& cmd) {
  passes = pipeline::Builder::default_passes();
  std::string names;
  for (const std::string& p : passes) names += (names.empty() ? "" : ",") + p;
  cmd.add_option("--passes", passes, "post-grad passes, in order, on each graph the backend compiles")
      ->delimiter(',')
      ->default_str(names);
  cmd.add_option("--pre-grad-passes", pre_grad_passes,
                 "passes on the forward graph before differentiation (default: the backend's, "
                 "fuse_flash_attention for the inductor's; none: no pass)")
      ->delimiter(',')
      ->each([this](const std::string&) { pre_grad_given = true; });
  cmd.add_option("--joint-passes", joint_passes, "passes on the joint (forward + backward) graph")->delimiter(',');
  cmd.add_option(
         "--trace-mode", trace_mode,
         "trace on fake tensors (metadata, no data), on copies of the tensors (real), or fake where a fake trace can "
         "follow the step and real where not (auto)")
      ->check(CLI::IsMember({"auto", "real", "fake"}))
      ->capture_default_str();
  cmd.add_option("--decompositions", decompositions,
                 "core: trace softmax, gelu, layer norm and nll_loss as the math they compute (for a fusing "
                 "backend; not bitwise eager); auto: core for the inductor backends, none for others")
      ->check(CLI::IsMember({"auto", "none", "core"}))
      ->capture_default_str();
  cmd.add_option("--partitioner", partitioner,
                 "how a joint graph is split: default (save what the backward reads) or min-cut (recompute "
                 "cheap ops instead of saving them; in a training step's graph, recompute them in the backward "
                 "instead of keeping them alive)")
      ->check(CLI::IsMember({"default", "min-cut"}))
      ->capture_default_str();
  cmd.add_option("--memory-budget", memory_budget,
                 "with --partitioner min-cut: 1 saves what the heuristics choose, 0 the least any partition can "
                 "(recomputing matmuls too), in between a share of the difference")
      ->check(between_zero_and_one())
      ->capture_default_str();
  cmd.add_option("--remat-max-slowdown", remat_max_slowdown,
                 "recompute inside a training step where it lowers the step's peak and the backend's cost model "
                 "(the inductor's roofline estimate) says the step takes at most this share longer (0.02: 2%); "
                 "default: 0.02 for a backend with a cost model; with --partitioner min-cut, wherever it lowers "
                 "the peak")
      ->check(CLI::NonNegativeNumber);
  cmd.add_flag("--no-remat", no_remat, "recompute nothing inside a training step")->excludes("--remat-max-slowdown");
}

void CompileFlags::apply(pipeline::Builder& builder,
                         std::function<void(const partitioner::MinCutReport&)> on_partition) const {
  builder.passes(passes).joint_passes(joint_passes);
  if (pre_grad_given)
    builder.pre_grad_passes(pre_grad_passes == std::vector<std::string>{"none"} ? std::vector<std::string>{}
                                                                                : pre_grad_passes);
  tracer::TraceOptions options = builder.trace_options();  // auto: the backend's decompositions
  options.mode = trace_mode == "fake"   ? tracer::TraceMode::Fake
                 : trace_mode == "real" ? tracer::TraceMode::Real
                                        : tracer::TraceMode::Auto;
  partitioner::MinCutOptions min_cut;
  if (partitioner == "min-cut") {
    min_cut.memory_budget = memory_budget;
    builder.partitioner([min_cut, on_partition](const ir::Graph& joint, size_t num_fwd_outputs) {
      partitioner::MinCutReport report;
      partitioner::PartitionResult r =
          partitioner::min_cut_rematerialization_partition(joint, num_fwd_outputs, min_cut, &report);
      if (on_partition) on_partition(report);
      return r;
    });
  }
  // A training step is one graph: the same cut, inside it (Note
  // [Rematerialization in one graph]); the builder's default weighs it by
  // the backend's cost model.
  if (no_remat) {
    builder.remat(std::nullopt);
  } else if (remat_max_slowdown) {
    min_cut.estimated_ms = runtime::BackendRegistry::builtin().get(builder.backend_name()).estimated_ms;
    if (!min_cut.estimated_ms)
      throw pipeline::PipelineError("--remat-max-slowdown: backend " + builder.backend_name() +
                                    " has no cost model; use an inductor backend");
    min_cut.max_slowdown = *remat_max_slowdown;
    builder.remat(min_cut);
  } else if (partitioner == "min-cut") {
    builder.remat(min_cut);
  }
  builder.trace_options(options);
  if (decompositions == "none") builder.decompositions({});
  if (decompositions == "core") builder.decompositions(tracer::core_aten_decompositions());
}

ZooStepFlags::ZooStepFlags() : backend(runtime::BackendRegistry::builtin().best().name) {}

void ZooStepFlags::add_to(CLI::App& cmd, const std::string& batch_help) {
  cmd.add_option("--model", model, "model of the zoo")
      ->check(CLI::IsMember(models::model_names()))
      ->capture_default_str();
  cmd.add_option("--backend", backend, "compiler backend")
      ->check(CLI::IsMember(runtime::BackendRegistry::builtin().names()))
      ->capture_default_str();
  add_size_option(cmd, size);
  compile.add_to(cmd);
  optimizer.add_to(cmd);
  cmd.add_option("--batch", batch, batch_help)->check(at_least_one())->capture_default_str();
}

void add_size_option(CLI::App& cmd, std::string& size) {
  cmd.add_option("--size", size, "model size: small (quick on a CPU) or full (as PyTorch's compiler is measured)")
      ->check(CLI::IsMember(models::model_sizes()))
      ->capture_default_str();
}

void add_device_option(CLI::App& cmd, std::string& device, const std::string& help) {
  cmd.add_option("--device", device, help)->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
}

void require_usable(const at::Device& device, const std::string& verb) {
  if (device.is_cuda() && !at::hasCUDA())
    throw pipeline::PipelineError(
        "--device cuda: no CUDA device is usable here (no GPU, or a LibTorch without CUDA); " + verb +
        " with --device cpu");
}

CLI::Validator at_least_one() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        try {
          if (std::stoll(value) >= 1) return "";
        } catch (const std::exception&) {
          return "must be a whole number of at least 1 (got '" + value + "')";
        }
        return "must be at least 1 (got " + value + ")";
      },
      "INT >= 1");
}

CLI::Validator between_zero_and_one() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        try {
          const double v = std::stod(value);
          if (v >= 0 && v <= 1) return "";
        } catch (const std::exception&) {
          return "must be a number from 0 to 1 (got '" + value + "')";
        }
        return "must be from 0 to 1 (got " + value + ")";
      },
      "NUMBER in [0, 1]");
}

CLI::Validator greater_than_zero() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        try {
          if (std::stod(value) > 0) return "";
        } catch (const std::exception&) {
          return "must be a number greater than 0 (got '" + value + "')";
        }
        return "must be greater than 0 (got " + value + ")";
      },
      "NUMBER > 0");
}

std::vector<std::pair<std::string, double>> ordered_stages(const runtime::PhaseTimer& timer) {
  const std::vector<runtime::PhaseStats> phases = timer.phases();
  std::set<std::string> parents;
  for (const runtime::PhaseStats& phase : phases) parents.insert(phase.parent);
  std::vector<std::pair<std::string, double>> out;
  for (const runtime::PhaseStats& phase : phases)
    if (phase.calls() > 0 && !parents.contains(phase.name)) out.emplace_back(phase.name, phase.total_ms() / 1e3);
  return out;
}

double total_stage_s(const runtime::PhaseTimer& timer) {
  double ms = 0;
  for (const runtime::PhaseStats& phase : timer.phases())
    if (phase.parent.empty()) ms += phase.total_ms();
  return ms / 1e3;
}

std::string describe_stages(const runtime::PhaseTimer& timer) {
  std::string out;
  for (const auto& [stage, s] : ordered_stages(timer))
    out += (out.empty() ? "" : ", ") + stage + " " + fixed(1e3 * s, 1) + " ms";
  return out + "; total " + fixed(1e3 * total_stage_s(timer), 1) + " ms";
}

std::string describe_counters(const runtime::Counters& counters) {
  std::string out;
  for (const auto& [group, keys] : counters.snapshot())
    for (const auto& [key, count] : keys)
      out += (out.empty() ? "" : ", ") + group + "." + key + ": " + std::to_string(count);
  return out.empty() ? "none" : out;
}

std::string fixed(double value, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, value);
  return buf;
}

}  // namespace crucible::tools
