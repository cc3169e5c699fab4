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
#include "bench_pipeline.h"

#include <crucible/ir/error.h>
#include <crucible/ir/interpreter.h>
#include <crucible/ir/pass_manager.h>
#include <crucible/partitioner/default_partition.h>
#include <crucible/pipeline/builder.h>
#include <crucible/models/zoo.h>
#include <crucible/tracer/functional_call.h>

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/nn/module.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <functional>
#include <string>

namespace {

using namespace crucible;

// Small enough for a 2-core machine, large enough that the models do real work.
int64_t bench_batch(const std::string& model) { return model == "mlp" || model == "convnet" ? 32 : 8; }

struct Setup {
  explicit Setup(const std::string& name) : model((torch::manual_seed(0), models::make_model(name))) {
    model.module->train();
    const data::Batch b = model.example_batch(bench_batch(name), /*seed=*/0);
    batch = {b.inputs, b.targets};
    optimizer = std::make_unique<torch::optim::SGD>(model.module->parameters(),
                                                    torch::optim::SGDOptions(0.01).momentum(0.9));
  }
  pipeline::LossFn loss() const { return models::loss_of(model); }
  tracer::TraceResult trace_forward(bool functionalize) const {
    tracer::ModuleTraceOptions options;
    options.trace.functionalize = functionalize;
    return tracer::functional_call(
        *model.module,
        [this](torch::nn::Module&, const std::vector<at::Tensor>& in) {
          return std::vector<at::Tensor>{model.forward(in[0])};
        },
        {batch[0]}, options);
  }
  tracer::TraceResult trace_joint() const {
    tracer::ModuleTraceOptions options;
    options.trace.functionalize = true;
    options.gradients_as_outputs = true;
    return tracer::functional_call(
        *model.module,
        [this](torch::nn::Module&, const std::vector<at::Tensor>& in) {
          at::Tensor loss = model.loss(model.forward(in[0]), in[1]);
          loss.backward();
          return std::vector<at::Tensor>{loss.detach()};
        },
        batch, options);
  }
  // A compiled training step whose graph has been through no pass.
  pipeline::TrainStep unoptimized_step() const {
    pipeline::Builder b;
    b.passes({});
    pipeline::TrainStep step = b.compile_train_step(model.module, *optimizer, loss());
    step.compile(batch);
    return step;
  }

  models::Model model;
  std::vector<at::Tensor> batch;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

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

void step_compiled(benchmark::State& state, const std::string& name) {
  Setup s(name);
  const pipeline::TrainStep step = pipeline::compile_train_step(s.model.module, *s.optimizer, s.loss());
  step.compile(s.batch);
  for (auto _ : state) benchmark::DoNotOptimize(step(s.batch).item<double>());
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

}  // namespace

namespace crucible::bench {

const std::vector<std::pair<std::string, PipelineBenchFn>>& pipeline_stages() {
  static const std::vector<std::pair<std::string, PipelineBenchFn>> stages = {
      {"Trace", trace},
      {"Functionalize", functionalize},
      {"Joint", joint},
      {"TrainStepTrace", train_step_trace},
      {"Partition", partition},
      {"Passes", passes},
      {"BackendCold", backend_cold},
      {"BackendCached", backend_cached},
      {"StepCompiled", step_compiled},
      {"StepEager", step_eager},
  };
  return stages;
}

}  // namespace crucible::bench

namespace {

[[maybe_unused]] const bool registered = [] {
  // Model by model, so that a model's compiled and eager steps run back to
  // back, under the same machine load.
  for (const std::string& model : crucible::models::model_names())
    for (const auto& [stage, fn] : crucible::bench::pipeline_stages())
      benchmark::RegisterBenchmark(("BM_Pipeline" + stage + "/" + model).c_str(), fn, model)
          ->Unit(benchmark::kMillisecond);
  return true;
}();

}  // namespace
