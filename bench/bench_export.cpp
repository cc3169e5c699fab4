// Loading an exported training step (Note [Exported training step] in
// pipeline/export.h): the time crucible::load_train_step takes to bind a
// module to a package written without its tensors (the manifest, the
// graph, the schedule and the kernel library read, checked and loaded),
// and, as counters, the first two steps after loading (on a GPU the second
// captures the CUDA graph) and a warm step, each to its loss on the host.
// Registered as BM_LoadTrainStep/<model>/<size>/<device>/batch:B; the
// package is written once, outside the timing, by the inductor (with CUDA
// graphs on a GPU). The cuda cases report an error where no GPU is usable.
#include <crucible/loader/train_step.h>
#include <crucible/models/zoo.h>
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/export.h>

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/nn/module.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>

namespace {

using namespace crucible;

void load_train_step(benchmark::State& state, const std::string& model, const std::string& size,
                     const at::Device device) {
  if (device.is_cuda() && !at::hasCUDA()) {
    state.SkipWithError("no CUDA device is usable here");
    return;
  }
  torch::manual_seed(0);
  const models::Model m = models::make_model(model, size);
  m.module->to(device);
  m.module->train();
  const data::Batch example = m.example_batch(state.range(0), 0);
  const data::Batch b{example.inputs.to(device), example.targets.to(device)};
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("crucible_bench_export_" + std::to_string(::getpid()));
  {
    torch::optim::AdamW optimizer(m.module->parameters(), torch::optim::AdamWOptions(3e-4));
    const pipeline::TrainStep step = pipeline::Builder()
                                         .backend(device.is_cuda() ? "inductor-cudagraphs" : "inductor")
                                         .compile_train_step(m.module, optimizer, models::loss_of(m));
    pipeline::export_train_step(step, {b.inputs, b.targets}, dir.string(), {.state = false, .cuda_archs = {}});
  }
  LoadedTrainStep loaded;
  for (auto _ : state) loaded = crucible::load_train_step(dir.string(), m.module);
  using Clock = std::chrono::steady_clock;
  auto step_ms = [&] {
    const Clock::time_point start = Clock::now();
    loaded({b.inputs, b.targets}).item<double>();
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };
  state.counters["first_step_ms"] = step_ms();
  state.counters["second_step_ms"] = step_ms();
  step_ms();
  state.counters["warm_step_ms"] = step_ms();
  std::filesystem::remove_all(dir);
}

[[maybe_unused]] const bool registered = [] {
  struct Case {
    const char* model;
    const char* size;
    const char* device;
    int64_t batch;
  };
  for (const Case& c : {Case{"mlp", "small", "cpu", 8}, Case{"gpt", "small", "cpu", 8}, Case{"gpt", "full", "cpu", 1},
                        Case{"gpt", "full", "cuda", 8}, Case{"resnet18", "full", "cuda", 64}})
    benchmark::RegisterBenchmark(
        ("BM_LoadTrainStep/" + std::string(c.model) + "/" + c.size + "/" + c.device).c_str(),
        [c](benchmark::State& state) { load_train_step(state, c.model, c.size, at::Device(c.device)); })
        ->Arg(c.batch)
        ->ArgName("batch")
        ->Unit(benchmark::kMillisecond);
  return true;
}();

}  // namespace
