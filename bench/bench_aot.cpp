// Host overhead of a compiled AOT call on a tiny graph: x * w on 1-element
// tensors, so the time is the guard check, the runtime wrappers, the
// autograd Function glue and the interpreter's dispatch, not work. Each
// compiled form against the same eager code: aot_function on the inference
// path, forward only and forward plus backward on the autograd path, an
// input written in place (the runtime wrapper's epilogue), and a one-layer
// module through aot_module and aot_module_simplified.
// Compile time of a new callable for a chain of layers, forward and
// backward, with the backend run (no graph cache, or a cache that misses)
// or skipped (a warm graph cache, Note [AOT graph cache]); and graph_hash
// alone on the chain's forward graph.
#include <crucible/autograd/aot_function.h>
#include <crucible/autograd/aot_module.h>
#include <crucible/ir/cse.h>
#include <crucible/ir/dce.h>
#include <crucible/ir/hash.h>
#include <crucible/ir/interpreter.h>
#include <crucible/runtime/instruments.h>
#include <crucible/runtime/timing.h>
#include <crucible/tracer/make_fx.h>

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/nn/modules/linear.h>

namespace {

std::vector<at::Tensor> tiny(const std::vector<at::Tensor>& in) { return {in[0] * in[1]}; }

std::vector<at::Tensor> tiny_writing(const std::vector<at::Tensor>& in) {
  in[0].add_(1);
  return {in[0] * in[1]};
}

void BM_AotCallInference(benchmark::State& state) {
  auto compiled = crucible::autograd::aot_function(tiny);
  const std::vector<at::Tensor> in{at::ones({1}), at::ones({1})};
  for (auto _ : state) benchmark::DoNotOptimize(compiled(in));
}

void BM_EagerCallInference(benchmark::State& state) {
  const std::vector<at::Tensor> in{at::ones({1}), at::ones({1})};
  for (auto _ : state) benchmark::DoNotOptimize(tiny(in));
}

void BM_AotCallForward(benchmark::State& state) {
  auto compiled = crucible::autograd::aot_function(tiny);
  const std::vector<at::Tensor> in{at::ones({1}), at::ones({1}).requires_grad_()};
  for (auto _ : state) benchmark::DoNotOptimize(compiled(in));
}

void BM_EagerCallForward(benchmark::State& state) {
  const std::vector<at::Tensor> in{at::ones({1}), at::ones({1}).requires_grad_()};
  for (auto _ : state) benchmark::DoNotOptimize(tiny(in));
}

void BM_AotCallForwardBackward(benchmark::State& state) {
  auto compiled = crucible::autograd::aot_function(tiny);
  const std::vector<at::Tensor> in{at::ones({1}), at::ones({1}).requires_grad_()};
  for (auto _ : state) compiled(in)[0].sum().backward();
}

void BM_EagerCallForwardBackward(benchmark::State& state) {
  const std::vector<at::Tensor> in{at::ones({1}), at::ones({1}).requires_grad_()};
  for (auto _ : state) tiny(in)[0].sum().backward();
}

void BM_AotCallInputMutation(benchmark::State& state) {
  auto compiled = crucible::autograd::aot_function(tiny_writing);
  const std::vector<at::Tensor> in{at::ones({1}), at::ones({1})};
  for (auto _ : state) benchmark::DoNotOptimize(compiled(in));
}

void BM_EagerCallInputMutation(benchmark::State& state) {
  const std::vector<at::Tensor> in{at::ones({1}), at::ones({1})};
  for (auto _ : state) benchmark::DoNotOptimize(tiny_writing(in));
}

std::shared_ptr<torch::nn::LinearImpl> tiny_linear() { return std::make_shared<torch::nn::LinearImpl>(1, 1); }

std::vector<at::Tensor> linear_forward(torch::nn::Module& m, const std::vector<at::Tensor>& in) {
  return {static_cast<torch::nn::LinearImpl&>(m).forward(in[0])};
}

void BM_AotModuleForward(benchmark::State& state) {
  auto compiled = crucible::autograd::aot_module(tiny_linear(), linear_forward);
  const std::vector<at::Tensor> in{at::ones({1, 1})};
  for (auto _ : state) benchmark::DoNotOptimize(compiled(in));
}

void BM_AotModuleSimplifiedForward(benchmark::State& state) {
  const std::vector<at::Tensor> in{at::ones({1, 1})};
  auto compiled = crucible::autograd::aot_module_simplified(tiny_linear(), linear_forward, in);
  for (auto _ : state) benchmark::DoNotOptimize(compiled(in));
}

void BM_EagerModuleForward(benchmark::State& state) {
  auto m = tiny_linear();
  const at::Tensor x = at::ones({1, 1});
  for (auto _ : state) benchmark::DoNotOptimize(m->forward(x));
}

// tanh(x @ w_i^T + b_i) for `layers` layers of 16 features, then a sum.
std::vector<at::Tensor> chain(const std::vector<at::Tensor>& in) {
  at::Tensor x = in[0];
  for (size_t i = 1; i + 1 < in.size(); i += 2) x = at::tanh(at::addmm(in[i + 1], x, in[i].t()));
  return {x.sum()};
}

std::vector<at::Tensor> chain_inputs(int64_t layers) {
  std::vector<at::Tensor> in{at::randn({8, 16})};
  for (int64_t i = 0; i < layers; ++i) {
    in.push_back(at::randn({16, 16}).requires_grad_());
    in.push_back(at::randn({16}).requires_grad_());
  }
  return in;
}

// The pipeline builder's default compiler: dce and cse, then the interpreter.
crucible::ir::CompiledFn dce_cse_interpret(const crucible::ir::Graph& graph, const std::vector<at::Tensor>& examples) {
  crucible::ir::Graph g = graph.clone();
  crucible::ir::eliminate_dead_code(g);
  crucible::ir::eliminate_common_subexpressions(g);
  return crucible::ir::interpret(g, examples);
}

enum class CacheUse { none, miss, hit };

// One iteration: a new callable's first call and backward, which compile
// the forward and the backward graph. Counters, per iteration: trace_ms (the
// metadata analysis, the joint trace and the partition) and backend_ms (the
// fw_compiler and bw_compiler stages: the backend calls, or on a hit the
// cache lookups), from a stage timer of its own.
void compile_chain(benchmark::State& state, CacheUse use) {
  const std::vector<at::Tensor> in = chain_inputs(state.range(0));
  crucible::autograd::AotConfig config;
  config.fw_compiler = config.bw_compiler = config.inference_compiler = dce_cse_interpret;
  config.compiler_key = "dce,cse;interpreter";
  config.cache = use == CacheUse::none ? nullptr : std::make_shared<crucible::autograd::AotCache>();
  if (use == CacheUse::hit) crucible::autograd::aot_function(chain, config)(in)[0].backward();
  crucible::runtime::PhaseTimer timer;
  config.instruments = {std::make_shared<crucible::runtime::StageTimer>(timer)};
  for (auto _ : state) {
    // Timed with the rest: freeing the last iteration's entries is
    // microseconds against the milliseconds of compiling.
    if (use == CacheUse::miss) config.cache->clear();
    crucible::autograd::aot_function(chain, config)(in)[0].backward();
  }
  const auto per_iteration = [&](std::initializer_list<const char*> phases) {
    double ms = 0;
    for (const char* p : phases) ms += timer.total_ms(p);
    return ms / static_cast<double>(state.iterations());
  };
  state.counters["trace_ms"] = per_iteration({"collect_metadata", "trace_joint", "partition"});
  state.counters["backend_ms"] = per_iteration({"fw_compiler", "bw_compiler"});
}

void BM_AotCompileUncached(benchmark::State& state) { compile_chain(state, CacheUse::none); }
void BM_AotCompileCacheMiss(benchmark::State& state) { compile_chain(state, CacheUse::miss); }
void BM_AotCompileCacheHit(benchmark::State& state) { compile_chain(state, CacheUse::hit); }

void BM_GraphHash(benchmark::State& state) {
  const crucible::ir::Graph g = crucible::tracer::make_fx(chain, chain_inputs(state.range(0))).graph;
  for (auto _ : state) benchmark::DoNotOptimize(crucible::ir::graph_hash(g));
  state.counters["nodes"] = static_cast<double>(g.num_nodes());
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(g.num_nodes()));
}

}  // namespace

BENCHMARK(BM_AotCompileUncached)->Arg(4)->Arg(32)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AotCompileCacheMiss)->Arg(4)->Arg(32)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AotCompileCacheHit)->Arg(4)->Arg(32)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GraphHash)->Arg(4)->Arg(32)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AotCallInference)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EagerCallInference)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AotCallForward)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EagerCallForward)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AotCallForwardBackward)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EagerCallForwardBackward)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AotCallInputMutation)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EagerCallInputMutation)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AotModuleForward)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AotModuleSimplifiedForward)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EagerModuleForward)->Unit(benchmark::kMicrosecond);
