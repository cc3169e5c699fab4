// Host overhead of a compiled AOT call on a tiny graph: x * w on 1-element
// tensors, so the time is the guard check, the runtime wrappers, the
// autograd Function glue and the interpreter's dispatch, not work. Each
// compiled form against the same eager code: aot_function on the inference
// path, forward only and forward plus backward on the autograd path, an
// input written in place (the runtime wrapper's epilogue), and a one-layer
// module through aot_module and aot_module_simplified.
#include <crucible/autograd/aot_function.h>
#include <crucible/autograd/aot_module.h>

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/torch.h>

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

}  // namespace

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
