// Tracing overhead per recorded node, real mode: a deep MLP (Linear + ReLU
// layers on small tensors, so the ops' own cost is small) traced with make_fx,
// and the same function run eagerly. The difference per node is what the
// tracer adds to each op: the dispatcher fallback, argument mapping, the
// graph node and its metadata.
#include <crucible/tracer/make_fx.h>

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

namespace {

using Tensors = std::vector<at::Tensor>;

// Inputs: x [8, 64], then per layer a weight [64, 64] and a bias [64].
Tensors mlp_inputs(int64_t layers) {
  at::manual_seed(0);
  Tensors in = {at::randn({8, 64})};
  for (int64_t l = 0; l < layers; ++l) {
    in.push_back(at::randn({64, 64}) * 0.1);
    in.push_back(at::zeros({64}));
  }
  return in;
}

// Per layer: t (weight transpose), addmm, relu: 3 recorded nodes.
Tensors deep_mlp(const Tensors& in) {
  at::Tensor h = in[0];
  for (size_t l = 1; l + 1 < in.size(); l += 2) h = at::linear(h, in[l], in[l + 1]).relu();
  return {h};
}

void set_per_node(benchmark::State& state, int64_t nodes) {
  state.counters["nodes"] = static_cast<double>(nodes);
  state.counters["per_node"] = benchmark::Counter(
      static_cast<double>(nodes), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void BM_TraceDeepMlp(benchmark::State& state) {
  const Tensors in = mlp_inputs(state.range(0));
  int64_t nodes = 0;
  for (auto _ : state) {
    auto r = crucible::tracer::make_fx(deep_mlp, in);
    nodes = 0;
    for (auto* n : r.graph.nodes()) nodes += n->is_call();
    benchmark::DoNotOptimize(r);
  }
  set_per_node(state, nodes);
}

void BM_EagerDeepMlp(benchmark::State& state) {
  const Tensors in = mlp_inputs(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(deep_mlp(in));
  set_per_node(state, 3 * state.range(0));
}

}  // namespace

BENCHMARK(BM_TraceDeepMlp)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EagerDeepMlp)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);
