// Interpreter overhead per node: a chain of N aten::add.Tensor calls on
// 1-element tensors, run by the interpreter and called directly through
// at::add. The difference per node is what the interpreter adds to the
// dispatcher call (boxing, planning lookups, value slots).
#include <crucible/ir/interpreter.h>

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

namespace {

using crucible::ir::Graph;
using crucible::ir::TensorMeta;
using crucible::ir::Value;

// x + y + y + ... (N adds), each reading the previous result.
Graph add_chain(int64_t n) {
  Graph g;
  Value* v = g.add_placeholder("x", TensorMeta::contiguous({1}));
  Value* y = g.add_placeholder("y", TensorMeta::contiguous({1}));
  for (int64_t i = 0; i < n; ++i) {
    v = g.add_call("aten::add.Tensor", {v, y})->result();
    v->set_meta(TensorMeta::contiguous({1}));
  }
  g.set_output({v});
  return g;
}

void set_per_node(benchmark::State& state) {
  state.counters["per_node"] = benchmark::Counter(
      static_cast<double>(state.range(0)), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void BM_InterpreterAddChain(benchmark::State& state) {
  const Graph g = add_chain(state.range(0));
  const crucible::ir::Interpreter interp(g);
  const at::Tensor x = at::ones({1}), y = at::ones({1});
  for (auto _ : state) {
    std::vector<at::Tensor> inputs{x, y};
    benchmark::DoNotOptimize(interp.run(inputs));
  }
  set_per_node(state);
}

void BM_DirectAddChain(benchmark::State& state) {
  const int64_t n = state.range(0);
  const at::Tensor x = at::ones({1}), y = at::ones({1});
  for (auto _ : state) {
    at::Tensor v = x;
    for (int64_t i = 0; i < n; ++i) v = at::add(v, y);
    benchmark::DoNotOptimize(v);
  }
  set_per_node(state);
}

}  // namespace

BENCHMARK(BM_InterpreterAddChain)->Arg(100)->Arg(1000)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DirectAddChain)->Arg(100)->Arg(1000)->Unit(benchmark::kMicrosecond);
