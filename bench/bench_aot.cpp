// Host overhead of a compiled AOT call on a tiny graph: x * w on 1-element
// tensors, so the time is the cache lookup, the autograd Function glue and
// the interpreter's dispatch, not work. Forward only, and forward plus the
// compiled backward, each against the same eager code.
#include <crucible/autograd/aot_function.h>

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

namespace {

std::vector<at::Tensor> tiny(const std::vector<at::Tensor>& in) { return {in[0] * in[1]}; }

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

}  // namespace

BENCHMARK(BM_AotCallForward)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EagerCallForward)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AotCallForwardBackward)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EagerCallForwardBackward)->Unit(benchmark::kMicrosecond);
