// Throughput of the text form and the JSON form on a 10k-node graph: print,
// parse, to_json, from_json, in nodes per second. A graph is printed for every
// dump and cache entry, so these must stay far below compile time.
#include <crucible/ir/graph.h>
#include <crucible/ir/json.h>
#include <crucible/ir/parser.h>
#include <crucible/ir/printer.h>

#include <benchmark/benchmark.h>

#include <string>

namespace {

using crucible::ir::Graph;
using crucible::ir::TensorMeta;
using crucible::ir::Value;

// 2000 blocks of five calls — mm, add (Scalar alpha), gelu (a string),
// view and view back (int lists) — plus 3 placeholders: 10003 nodes and the output.
Graph mixed_graph(int64_t blocks) {
  Graph g;
  Value* v = g.add_placeholder("x", TensorMeta::contiguous({8, 16}));
  Value* w = g.add_placeholder("w", TensorMeta::contiguous({16, 16}));
  Value* bias = g.add_placeholder("bias", TensorMeta::contiguous({16}));
  auto call = [&](const char* op, std::vector<crucible::ir::Argument> args, std::vector<int64_t> sizes) {
    Value* r = g.add_call(op, std::move(args))->result();
    r->set_meta(TensorMeta::contiguous(std::move(sizes)));
    return r;
  };
  for (int64_t i = 0; i < blocks; ++i) {
    Value* a = call("aten::mm", {v, w}, {8, 16});
    Value* b = call("aten::add.Tensor", {a, bias, int64_t{1}}, {8, 16});
    Value* c = call("aten::gelu", {b, std::string("tanh")}, {8, 16});
    Value* d = call("aten::view", {c, std::vector<int64_t>{16, 8}}, {16, 8});
    v = call("aten::view", {d, std::vector<int64_t>{8, 16}}, {8, 16});
  }
  g.set_output({v});
  return g;
}

constexpr int64_t kBlocks = 2000;

void set_nodes_per_second(benchmark::State& state, const Graph& g) {
  state.counters["nodes/s"] =
      benchmark::Counter(static_cast<double>(g.num_nodes()), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_PrintText(benchmark::State& state) {
  const Graph g = mixed_graph(kBlocks);
  for (auto _ : state) benchmark::DoNotOptimize(crucible::ir::to_text(g));
  set_nodes_per_second(state, g);
}

void BM_ParseText(benchmark::State& state) {
  const Graph g = mixed_graph(kBlocks);
  const std::string text = crucible::ir::to_text(g);
  for (auto _ : state) benchmark::DoNotOptimize(crucible::ir::parse(text));
  set_nodes_per_second(state, g);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(text.size()));
}

void BM_ToJson(benchmark::State& state) {
  const Graph g = mixed_graph(kBlocks);
  for (auto _ : state) benchmark::DoNotOptimize(crucible::ir::to_json(g));
  set_nodes_per_second(state, g);
}

void BM_FromJson(benchmark::State& state) {
  const Graph g = mixed_graph(kBlocks);
  const std::string json = crucible::ir::to_json(g);
  for (auto _ : state) benchmark::DoNotOptimize(crucible::ir::from_json(json));
  set_nodes_per_second(state, g);
}

}  // namespace

BENCHMARK(BM_PrintText)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ParseText)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ToJson)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FromJson)->Unit(benchmark::kMillisecond);
