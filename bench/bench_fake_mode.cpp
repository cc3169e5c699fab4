// Compiling a training step with real vs fake tracing (AotConfig::trace_mode):
// wall time and peak resident memory of TrainStep::compile, the backend
// skipped, registered as BM_CompileTrainStep/<model>/<size>/<mode>/batch:B.
// The peak is the growth of the process's high-water mark (VmHWM, reset
// through /proc/self/clear_refs before each compile) in MiB.
#include <crucible/ir/graph.h>
#include <crucible/models/zoo.h>
#include <crucible/pipeline/builder.h>

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/nn/module.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <fstream>
#include <string>

namespace {

using namespace crucible;

// The process's resident high-water mark, in KiB (VmHWM of /proc/self/status).
long peak_rss_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  return 0;
}

// Resets VmHWM to the current resident size (Linux: "5" to clear_refs).
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

void compile_train_step(benchmark::State& state, const std::string& model, const std::string& size,
                        tracer::TraceMode mode) {
  torch::manual_seed(0);
  models::Model m = models::make_model(model, size);
  m.module->train();
  const data::Batch b = m.example_batch(state.range(0), 0);
  torch::optim::AdamW opt(m.module->parameters(), torch::optim::AdamWOptions(1e-4));
  tracer::TraceOptions options;
  options.mode = mode;
  pipeline::Builder builder;
  builder.trace_options(options).passes({}).backend(
      "none", [](const ir::Graph&, const std::vector<at::Tensor>&) { return ir::CompiledFn(); });
  double peak_mib = 0;
  for (auto _ : state) {
    const pipeline::TrainStep step = builder.compile_train_step(m.module, opt, models::loss_of(m));
    reset_peak_rss();
    const long before = peak_rss_kib();
    step.compile({b.inputs, b.targets});
    peak_mib = std::max(peak_mib, static_cast<double>(peak_rss_kib() - before) / 1024.0);
  }
  state.counters["peak_MiB"] = peak_mib;
}

[[maybe_unused]] const bool registered = [] {
  struct Case {
    const char* model;
    const char* size;
    int64_t batch;
  };
  // GPT-2 small at batch 1 is what a real trace of it fits in on a 24 GiB machine.
  for (const Case& c : {Case{"gpt", "small", 8}, Case{"resnet18", "small", 8}, Case{"gpt", "full", 1}})
    for (auto [mode, mode_name] :
         {std::pair{tracer::TraceMode::Real, "real"}, std::pair{tracer::TraceMode::Fake, "fake"}})
      benchmark::RegisterBenchmark(
          ("BM_CompileTrainStep/" + std::string(c.model) + "/" + c.size + "/" + mode_name).c_str(),
          [c, mode = mode](benchmark::State& state) { compile_train_step(state, c.model, c.size, mode); })
          ->Arg(c.batch)
          ->ArgName("batch")
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond);
  return true;
}();

}  // namespace
