// The inductor backend on a chain of 8 pointwise ops over 16M floats,
// registered as:
//   BM_InductorChain8/eager     the 8 ATen ops one after another
//   BM_InductorChain8/inductor  compile_fx_inner's fused loop
//   BM_InductorCopy             a plain copy of the same tensor (the bound)
// bytes_per_second counts the minimum traffic (read x once, write y once)
// for all three, so the figures compare directly.
#include <crucible/inductor/compile_fx.h>
#include <crucible/ir/graph.h>
#include <crucible/ir/propagate_meta.h>

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <filesystem>

namespace {

using namespace crucible;

constexpr int64_t kNumel = int64_t{1} << 24;

at::Tensor chain_eager(const at::Tensor& x) {
  at::Tensor y = x * 1.5;
  y = y + 0.25;
  y = at::relu(y);
  y = y * x;
  y = y - 0.5;
  y = at::neg(y);
  y = at::abs(y);
  return y / 3.0;
}

ir::Graph chain_graph(const at::Tensor& x) {
  ir::Graph g;
  ir::Value* v = g.add_placeholder("x", ir::TensorMeta::of(x));
  ir::Value* px = v;
  v = g.add_call("aten::mul.Scalar", {v, c10::Scalar(1.5)})->result();
  v = g.add_call("aten::add.Scalar", {v, c10::Scalar(0.25), c10::Scalar(1)})->result();
  v = g.add_call("aten::relu", {v})->result();
  v = g.add_call("aten::mul.Tensor", {v, px})->result();
  v = g.add_call("aten::sub.Scalar", {v, c10::Scalar(0.5), c10::Scalar(1)})->result();
  v = g.add_call("aten::neg", {v})->result();
  v = g.add_call("aten::abs", {v})->result();
  v = g.add_call("aten::div.Scalar", {v, c10::Scalar(3.0)})->result();
  g.set_output({v});
  ir::propagate_meta(g);
  return g;
}

void set_bytes(benchmark::State& state) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * kNumel * static_cast<int64_t>(sizeof(float)));
}

void BM_InductorChain8_eager(benchmark::State& state) {
  at::Tensor x = at::randn({kNumel});
  for (auto _ : state) benchmark::DoNotOptimize(chain_eager(x));
  set_bytes(state);
}

void BM_InductorChain8_inductor(benchmark::State& state) {
  at::Tensor x = at::randn({kNumel});
  ir::CompiledFn fn = inductor::compile_fx_inner(chain_graph(x), {x});
  for (auto _ : state) {
    std::vector<at::Tensor> in{x};
    benchmark::DoNotOptimize(fn(in));
  }
  set_bytes(state);
}

void BM_InductorCopy(benchmark::State& state) {
  at::Tensor x = at::randn({kNumel});
  for (auto _ : state) benchmark::DoNotOptimize(x.clone());
  set_bytes(state);
}

}  // namespace

BENCHMARK(BM_InductorChain8_eager)->Name("BM_InductorChain8/eager")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_InductorChain8_inductor)->Name("BM_InductorChain8/inductor")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_InductorCopy)->Unit(benchmark::kMillisecond)->UseRealTime();
