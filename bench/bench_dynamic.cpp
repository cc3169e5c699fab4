// Training over changing sequence lengths (Note [Dynamic sizes] in
// inductor/src/dynamic_sizes.cpp), on a GPT of the zoo (2 layers, width
// 64, vocabulary 256, block 96), batch 8, AdamW:
//   BM_DynamicLoop/<mode>  a 30-step loop over lengths drawn from [17, 96]
//                  (10 distinct ones, then a last batch of 5), from a new
//                  model and an empty inductor cache: every compile is in
//                  the time. <mode>: eager; inductor (automatic dynamic
//                  sizes, the default); inductor_static (off: every shape
//                  builds its own kernels). Counter kernel_libraries: the
//                  C++ builds the loop ran. Cold only once per process: the
//                  inductor remembers the graph structures it has seen and
//                  which sizes varied (as torch._dynamo does), so a later
//                  repetition starts with its sizes dynamic; run it in
//                  separate processes (bench/results/dynamic.md).
//   BM_DynamicNewLength/<mode>  compiling the step for one more length
//                  (41, 42, ...) after lengths 31 and 77: <mode> dynamic
//                  (the symbolic library is loaded) or static (a build).
//   BM_DynamicStep/<mode>  one step at length 72 with the kernels a
//                  dynamic compile made (after lengths 48 and 56) or those
//                  of a static one: what the symbols cost a warm step.
#include <crucible/data/synthetic_tokens.h>
#include <crucible/inductor/compile_fx.h>
#include <crucible/models/zoo.h>
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/train_step.h>
#include <crucible/tracer/decomposition.h>

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace crucible;

const models::GptConfig kConfig{.vocab_size = 256, .block_size = 96, .n_layer = 2, .n_head = 2, .n_embd = 64};

// The loop's (batch, length) per step: lengths as a text loader pads
// them, to each batch's longest.
std::vector<std::pair<int64_t, int64_t>> loop_shapes() {
  const std::vector<int64_t> lengths = {31, 40, 17, 96, 52, 64, 23, 77, 45, 88};
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (int64_t i = 0; i < 29; ++i) shapes.push_back({8, lengths[(i * 7) % lengths.size()]});
  shapes.push_back({5, 40});
  return shapes;
}

// A batch of `len` tokens a row, contiguous as a loader's padded batch is
// (a slice of a longer batch is not, and a program's reshape of it traces
// a copy where a contiguous one traces a view: another graph).
data::Batch batch_of(int64_t b, int64_t len, int64_t step) {
  const data::Batch full = data::synthetic_token_batch({kConfig.vocab_size, kConfig.block_size, b, 0}, step);
  return {full.inputs.slice(1, 0, len).contiguous(), full.targets.slice(1, 0, len).contiguous()};
}

std::string fresh_dir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "crucible-bench-dynamic-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("cannot make a directory under " + tmpl);
  return tmpl;
}

// The inductor over its own cache directory, automatic dynamic sizes on or off.
pipeline::Builder inductor_builder(const std::string& cache_dir, bool dynamic) {
  inductor::InductorOptions o = inductor::InductorOptions::from_environment();
  o.cache_dir = cache_dir;
  o.automatic_dynamic_shapes = dynamic;
  return std::move(pipeline::Builder()
                       .decompositions(tracer::core_aten_decompositions())
                       .backend("inductor", [o](const ir::Graph& g, const std::vector<at::Tensor>& examples) {
                         return inductor::compile_fx_inner(g, examples, o);
                       }));
}

void dynamic_loop(benchmark::State& state, const std::string& mode) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = loop_shapes();
  for (auto _ : state) {
    state.PauseTiming();
    at::manual_seed(0);
    models::Model m = models::make_gpt(kConfig);
    torch::optim::AdamW opt(m.module->parameters(), torch::optim::AdamWOptions(1e-3));
    const std::string dir = fresh_dir();
    state.ResumeTiming();
    if (mode == "eager") {
      for (size_t i = 0; i < shapes.size(); ++i)
        benchmark::DoNotOptimize(
            models::eager_train_step(m, opt, batch_of(shapes[i].first, shapes[i].second, static_cast<int64_t>(i)))
                .item<double>());
    } else {
      const pipeline::TrainStep step =
          inductor_builder(dir, mode == "inductor").compile_train_step(m.module, opt, models::loss_of(m));
      for (size_t i = 0; i < shapes.size(); ++i) {
        const data::Batch b = batch_of(shapes[i].first, shapes[i].second, static_cast<int64_t>(i));
        benchmark::DoNotOptimize(step({b.inputs, b.targets}).item<double>());
      }
    }
    state.PauseTiming();
    int64_t libraries = 0;  // C++ builds: each leaves one library in the cache
    for (const auto& e : std::filesystem::directory_iterator(dir)) libraries += e.path().extension() == ".so";
    state.counters["kernel_libraries"] = static_cast<double>(libraries);
    std::filesystem::remove_all(dir);
    state.ResumeTiming();
  }
}

// A seeded GPT, its AdamW and its step through the inductor over a cache
// directory of its own (removed with it), compiled for batch 8 at
// `lengths` first.
struct CompiledGpt {
  CompiledGpt(bool dynamic, std::initializer_list<int64_t> lengths)
      : model((at::manual_seed(0), models::make_gpt(kConfig))),
        opt(model.module->parameters(), torch::optim::AdamWOptions(1e-3)),
        dir(fresh_dir()),
        step(inductor_builder(dir, dynamic).compile_train_step(model.module, opt, models::loss_of(model))) {
    for (int64_t len : lengths) {
      const data::Batch b = batch_of(8, len, 0);
      step.compile({b.inputs, b.targets});
    }
  }
  ~CompiledGpt() { std::filesystem::remove_all(dir); }
  CompiledGpt(const CompiledGpt&) = delete;
  CompiledGpt& operator=(const CompiledGpt&) = delete;

  models::Model model;
  torch::optim::AdamW opt;
  std::string dir;
  pipeline::TrainStep step;
};

void dynamic_step(benchmark::State& state, bool dynamic) {
  const CompiledGpt gpt(dynamic, {48, 56, 72});
  const data::Batch b = batch_of(8, 72, 0);
  for (auto _ : state) benchmark::DoNotOptimize(gpt.step({b.inputs, b.targets}).item<double>());
}

void dynamic_new_length(benchmark::State& state, bool dynamic) {
  const CompiledGpt gpt(dynamic, {31, 77});
  int64_t len = 41;
  for (auto _ : state) {
    const data::Batch b = batch_of(8, len++, 0);
    gpt.step.compile({b.inputs, b.targets});
  }
}

[[maybe_unused]] const bool registered = [] {
  for (const char* mode : {"eager", "inductor", "inductor_static"})
    benchmark::RegisterBenchmark((std::string("BM_DynamicLoop/") + mode).c_str(), dynamic_loop, std::string(mode))
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()  // the C++ compiler runs in child processes
        ->Iterations(1);
  for (const bool dynamic : {false, true})
    benchmark::RegisterBenchmark((std::string("BM_DynamicNewLength/") + (dynamic ? "dynamic" : "static")).c_str(),
                                 dynamic_new_length, dynamic)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->Iterations(5);  // lengths 41 to 45: below the width (64), the block (96) and their products
  for (const bool dynamic : {false, true})
    benchmark::RegisterBenchmark((std::string("BM_DynamicStep/") + (dynamic ? "dynamic" : "static")).c_str(),
                                 dynamic_step, dynamic)
        ->Unit(benchmark::kMillisecond);
  return true;
}();

}  // namespace
