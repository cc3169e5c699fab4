// Per-stage compile times and one training step, for every model of the zoo
// (default configs, seeded example batches), registered as
// BM_Pipeline<Stage>/<model>:
//   Trace          functional_call of the forward (real tensors)
//   Functionalize  the same trace, functionalized
//   Joint          forward + loss.backward(), functionalized, gradients as outputs
//   TrainStepTrace the whole training step (forward, backward, SGD update)
//   Partition      default_partition of the joint graph
//   Passes         DCE + CSE over the training-step graph
//   BackendCold    the interpreter backend on the training-step graph
//   BackendCached  TrainStep::compile of a batch already compiled: the
//                  in-memory cache lookup (there is no disk cache, and the
//                  interpreter keeps none of its own)
//   StepCompiled / StepEager  one SGD training step, compiled vs eager
//   StepInductor   the same step through the inductor backend, traced with
//                  the core decompositions (softmax, layer norm, gelu and
//                  the losses as the math they compute, for fusion)
//   CompileInductorCold  compiling that step into an empty inductor cache
//                  directory: trace, lowering, code generation, the C++
//                  compiler at -O3, loading
//   CompileInductorWarm  compiling it again, as a new TrainStep, with the
//                  directory filled: the graph cache and the kernel cache hit
#include "zoo_setup.h"

#include <crucible/ir/error.h>
#include <crucible/ir/interpreter.h>
#include <crucible/ir/pass_manager.h>
#include <crucible/models/zoo.h>
#include <crucible/partitioner/default_partition.h>
#include <crucible/pipeline/builder.h>

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/nn/module.h>
#include <torch/optim/sgd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

namespace {

using namespace crucible;

using Setup = bench::ZooSetup;

// Runs `trace` once; if it throws (functionalization refuses BatchNorm's
// in-place buffer updates in train mode, see Note [Functionalization]), the
// benchmark is reported as skipped with the reason, and false returned.
template <typename Trace>
bool traceable(benchmark::State& state, Trace&& trace) {
  try {
    trace();
    return true;
  } catch (const crucible::Error& e) {
    state.SkipWithError(e.what());
    return false;
  }
}

void trace(benchmark::State& state, const std::string& name) {
  Setup s(name);
  for (auto _ : state) benchmark::DoNotOptimize(s.trace_forward(false));
}

void functionalize(benchmark::State& state, const std::string& name) {
  Setup s(name);
  if (!traceable(state, [&] { s.trace_forward(true); })) return;
  for (auto _ : state) benchmark::DoNotOptimize(s.trace_forward(true));
}

void joint(benchmark::State& state, const std::string& name) {
  Setup s(name);
  if (!traceable(state, [&] { s.trace_joint(); })) return;
  for (auto _ : state) benchmark::DoNotOptimize(s.trace_joint());
}

void train_step_trace(benchmark::State& state, const std::string& name) {
  Setup s(name);
  pipeline::Builder b;
  b.passes({}).backend("none", [](const ir::Graph&, const std::vector<at::Tensor>&) { return ir::CompiledFn(); });
  for (auto _ : state) b.compile_train_step(s.model.module, *s.optimizer, s.loss()).compile(s.batch);
}

void partition(benchmark::State& state, const std::string& name) {
  Setup s(name);
  tracer::TraceResult joint;
  if (!traceable(state, [&] { joint = s.trace_joint(); })) return;
  for (auto _ : state) benchmark::DoNotOptimize(partitioner::default_partition(joint.graph, 1));
}

void passes(benchmark::State& state, const std::string& name) {
  Setup s(name);
  const pipeline::TrainStep step = s.unoptimized_step();
  const ir::PassManager manager(ir::PassRegistry::builtin().passes({"dce", "cse"}));
  for (auto _ : state) {
    state.PauseTiming();
    ir::Graph g = step.graph().clone();
    state.ResumeTiming();
    manager.run(g);
  }
}

void backend_cold(benchmark::State& state, const std::string& name) {
  Setup s(name);
  const pipeline::TrainStep step = s.unoptimized_step();
  const std::vector<at::Tensor> inputs = step.graph_inputs(s.batch);
  for (auto _ : state) benchmark::DoNotOptimize(ir::interpret(step.graph(), inputs));
}

void backend_cached(benchmark::State& state, const std::string& name) {
  Setup s(name);
  const pipeline::TrainStep step = s.unoptimized_step();
  for (auto _ : state) step.compile(s.batch);
}

pipeline::TrainStep inductor_step(Setup& s) {
  return pipeline::Builder().backend("inductor").compile_train_step(s.model.module, *s.optimizer, s.loss());
}

void step_compiled(benchmark::State& state, const std::string& name) {
  Setup s(name);
  const pipeline::TrainStep step =
      pipeline::Builder().backend("interpreter").compile_train_step(s.model.module, *s.optimizer, s.loss());
  step.compile(s.batch);
  for (auto _ : state) benchmark::DoNotOptimize(step(s.batch).item<double>());
}

void step_inductor(benchmark::State& state, const std::string& name) {
  Setup s(name);
  const pipeline::TrainStep step = inductor_step(s);
  step.compile(s.batch);
  for (auto _ : state) benchmark::DoNotOptimize(step(s.batch).item<double>());
}

// The inductor backend reads its cache directory from the environment
// (InductorOptions::from_environment); each benchmark sets its own and
// restores the caller's.
class CacheDir {
 public:
  CacheDir() : dir_(fresh()) {
    if (const char* old = std::getenv(kVar)) old_ = old;
    ::setenv(kVar, dir_.c_str(), 1);
  }
  ~CacheDir() {
    std::filesystem::remove_all(dir_);
    if (old_)
      ::setenv(kVar, old_->c_str(), 1);
    else
      ::unsetenv(kVar);
  }
  void empty() {
    std::filesystem::remove_all(dir_);
    dir_ = fresh();
    ::setenv(kVar, dir_.c_str(), 1);
  }

 private:
  static constexpr const char* kVar = "CRUCIBLE_INDUCTOR_CACHE_DIR";
  static std::string fresh() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "crucible-bench-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("cannot make a directory under " + tmpl);
    return tmpl;
  }
  std::string dir_;
  std::optional<std::string> old_;
};

void compile_inductor_cold(benchmark::State& state, const std::string& name) {
  Setup s(name);
  CacheDir dir;
  for (auto _ : state) {
    state.PauseTiming();
    dir.empty();
    state.ResumeTiming();
    inductor_step(s).compile(s.batch);
  }
}

void compile_inductor_warm(benchmark::State& state, const std::string& name) {
  Setup s(name);
  CacheDir dir;
  inductor_step(s).compile(s.batch);
  for (auto _ : state) inductor_step(s).compile(s.batch);
}

void step_eager(benchmark::State& state, const std::string& name) {
  Setup s(name);
  for (auto _ : state) {
    s.optimizer->zero_grad();
    at::Tensor loss = s.model.loss(s.model.forward(s.batch[0]), s.batch[1]);
    loss.backward();
    s.optimizer->step();
    benchmark::DoNotOptimize(loss.item<double>());
  }
}

// Stage name -> benchmark body for one zoo model, in pipeline order.
using PipelineBenchFn = void (*)(benchmark::State& state, const std::string& model);
const std::vector<std::pair<std::string, PipelineBenchFn>> kStages = {
    {"Trace", trace},
    {"Functionalize", functionalize},
    {"Joint", joint},
    {"TrainStepTrace", train_step_trace},
    {"Partition", partition},
    {"Passes", passes},
    {"BackendCold", backend_cold},
    {"BackendCached", backend_cached},
    {"StepCompiled", step_compiled},
    {"StepInductor", step_inductor},
    {"CompileInductorCold", compile_inductor_cold},
    {"CompileInductorWarm", compile_inductor_warm},
    {"StepEager", step_eager},
};

[[maybe_unused]] const bool registered = [] {
  // Model by model, so that a model's compiled and eager steps run back to
  // back, under the same machine load.
  for (const std::string& model : crucible::models::model_names())
    for (const auto& [stage, fn] : kStages) {
      auto* b = benchmark::RegisterBenchmark(("BM_Pipeline" + stage + "/" + model).c_str(), fn, model)
                    ->Unit(benchmark::kMillisecond);
      if (stage.starts_with("Compile")) b->UseRealTime();  // the C++ compiler runs in child processes
    }
  return true;
}();

}  // namespace
