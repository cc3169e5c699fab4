// The inductor backend against eager ATen, registered as:
//   BM_InductorChain8/eager             8 pointwise ATen ops over 16M floats, one after another
//   BM_InductorChain8/inductor          compile_fx_inner's fused loop for the same chain
//   BM_InductorCopy                     a plain copy of the same tensor (the bound)
//   BM_InductorChain8Cuda/{eager,inductor}, BM_InductorCopyCuda
//                                       the same over 64M floats on the GPU (only where
//                                       LibTorch sees one): the CUDA issue's bandwidth aim
//   BM_InductorSoftmax/eager            at::softmax over the rows of [8192, 1024] f32
//   BM_InductorSoftmax/inductor         the decomposed graph: amax, sub, exp, sum, div
//   BM_InductorSoftmax/inductor_256     the same, built without -mprefer-vector-width=512
//   BM_InductorSoftmaxBackward/eager    at::_softmax_backward_data over the same rows
//   BM_InductorSoftmaxBackward/inductor grad*y - y*sum(grad*y, -1, keepdim)
//   BM_InductorLayerNorm/eager          at::layer_norm over the rows of [8192, 1024] f32, weight and bias
//   BM_InductorLayerNorm/inductor       the decomposed graph: var_mean.dim, add eps, rsqrt, sub, mul, mul w, add b
//   BM_InductorColumnSum/eager          at::sum over dim 0 of [8192, 1024] f32
//   BM_InductorColumnSum/inductor       sum.dim_IntList over dim 0
//   BM_InductorSum/eager                at::sum of every element of [8192, 1024] f32 (a loss's sum)
//   BM_InductorSum/inductor             aten::sum: one reduction of outer size 1
//   BM_InductorRowSums/eager            at::sum over dim 1 of [4, 2M] f32 (the same 32 MiB, 4 rows)
//   BM_InductorRowSums/inductor         sum.dim_IntList over dim 1: fewer rows than most machines' threads
//   BM_InductorMergeHeads/eager         a GPT's q, k, v gradients [8, 12, 256, 64] f32 each merged by heads
//                                       (transpose(1, 2).reshape) and concatenated on the last dim: 3 copies, a cat
//   BM_InductorMergeHeads/inductor      the same graph: one loop, the cat's masked loads (Note [Masked loads])
//   BM_InductorMergeHeadsCuda/{eager,inductor}  the same at GPT-2 small's size, [8, 12, 1024, 64] each
//   BM_HostArith/{aten,host}           Adam's bias corrections of ResNet-18's 62 parameters on
//                                       0-dim float64 CPU tensors (7 ops each): boxed ATen calls,
//                                       as extern kernels of a GPU graph ran them, against the
//                                       run-time plan's own arithmetic (Note [Host arithmetic])
//   BM_InductorGenerateCode/gpt2-small  lowering, fusion and C++ rendering of GPT-2 small's
//                                       training step (AdamW, batch 8, T 1024: about 7000 nodes,
//                                       traced once in fake mode); no compiler runs
// bytes_per_second counts the minimum traffic of each computation (every
// input read once, every output written once), the same for its eager and
// inductor rows, so the figures compare directly.
#include "runtime/host_arith.h"

#include <crucible/inductor/compile_fx.h>
#include <crucible/ir/graph.h>
#include <crucible/ir/propagate_meta.h>
#include <crucible/models/zoo.h>
#include <crucible/pipeline/builder.h>
#include <crucible/tracer/decomposition.h>

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <benchmark/benchmark.h>
#include <torch/optim/adamw.h>

#include <chrono>
#include <filesystem>

namespace {

using namespace crucible;

constexpr int64_t kNumel = int64_t{1} << 24;
// The rows the softmax, layer norm and column-sum rows work on: a batch of
// 8192 rows of 1024 floats (32 MiB), a transformer's hidden size.
constexpr int64_t kRows = 8192;
constexpr int64_t kCols = 1024;
constexpr int64_t kFloatBytes = static_cast<int64_t>(sizeof(float));

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

// softmax(x, -1) as our graphs decompose it.
ir::Graph softmax_graph(const at::Tensor& x) {
  ir::Graph g;
  ir::Value* px = g.add_placeholder("x", ir::TensorMeta::of(x));
  ir::Value* m = g.add_call("aten::amax", {px, std::vector<int64_t>{-1}, true})->result();
  ir::Value* d = g.add_call("aten::sub.Tensor", {px, m, c10::Scalar(1)})->result();
  ir::Value* e = g.add_call("aten::exp", {d})->result();
  ir::Value* s = g.add_call("aten::sum.dim_IntList", {e, std::vector<int64_t>{-1}, true})->result();
  ir::Value* y = g.add_call("aten::div.Tensor", {e, s})->result();
  g.set_output({y});
  ir::propagate_meta(g);
  return g;
}

// The softmax backward as our graphs decompose it: grad*y - y*sum(grad*y, -1, keepdim).
ir::Graph softmax_backward_graph(const at::Tensor& grad, const at::Tensor& y) {
  ir::Graph g;
  ir::Value* pg = g.add_placeholder("grad", ir::TensorMeta::of(grad));
  ir::Value* py = g.add_placeholder("y", ir::TensorMeta::of(y));
  ir::Value* gy = g.add_call("aten::mul.Tensor", {pg, py})->result();
  ir::Value* s = g.add_call("aten::sum.dim_IntList", {gy, std::vector<int64_t>{-1}, true})->result();
  ir::Value* ys = g.add_call("aten::mul.Tensor", {py, s})->result();
  ir::Value* dx = g.add_call("aten::sub.Tensor", {gy, ys, c10::Scalar(1)})->result();
  g.set_output({dx});
  ir::propagate_meta(g);
  return g;
}

// layer_norm(x, [C], w, b, eps) as our graphs decompose native_layer_norm.
ir::Graph layer_norm_graph(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps) {
  ir::Graph g;
  ir::Value* px = g.add_placeholder("x", ir::TensorMeta::of(x));
  ir::Value* pw = g.add_placeholder("w", ir::TensorMeta::of(w));
  ir::Value* pb = g.add_placeholder("b", ir::TensorMeta::of(b));
  ir::Node* vm = g.add_call("aten::var_mean.dim", {px, std::vector<int64_t>{x.dim() - 1}, false, true});
  ir::Value* ve = g.add_call("aten::add.Scalar", {vm->result(0), c10::Scalar(eps), c10::Scalar(1)})->result();
  ir::Value* rstd = g.add_call("aten::rsqrt", {ve})->result();
  ir::Value* xc = g.add_call("aten::sub.Tensor", {px, vm->result(1), c10::Scalar(1)})->result();
  ir::Value* xhat = g.add_call("aten::mul.Tensor", {xc, rstd})->result();
  ir::Value* yw = g.add_call("aten::mul.Tensor", {xhat, pw})->result();
  ir::Value* y = g.add_call("aten::add.Tensor", {yw, pb, c10::Scalar(1)})->result();
  g.set_output({y});
  ir::propagate_meta(g);
  return g;
}

ir::Graph column_sum_graph(const at::Tensor& x) {
  ir::Graph g;
  ir::Value* px = g.add_placeholder("x", ir::TensorMeta::of(x));
  ir::Value* s = g.add_call("aten::sum.dim_IntList", {px, std::vector<int64_t>{0}, false})->result();
  g.set_output({s});
  ir::propagate_meta(g);
  return g;
}

ir::Graph sum_graph(const at::Tensor& x) {
  ir::Graph g;
  ir::Value* px = g.add_placeholder("x", ir::TensorMeta::of(x));
  g.set_output({g.add_call("aten::sum", {px, c10::IValue()})->result()});
  ir::propagate_meta(g);
  return g;
}

// The sum of each row of a 2-D tensor.
ir::Graph row_sums_graph(const at::Tensor& x) {
  ir::Graph g;
  ir::Value* px = g.add_placeholder("x", ir::TensorMeta::of(x));
  g.set_output({g.add_call("aten::sum.dim_IntList", {px, std::vector<int64_t>{1}, false})->result()});
  ir::propagate_meta(g);
  return g;
}

// q, k and v ([B, H, T, D] each) merged by heads into [B, T, H·D] and
// concatenated on the last dim: the gradient of a GPT's fused qkv
// projection output, as the backward of its split and head transposes.
at::Tensor merge_heads_eager(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  auto merge = [](const at::Tensor& t) { return t.transpose(1, 2).reshape({t.size(0), t.size(2), -1}); };
  return at::cat({merge(q), merge(k), merge(v)}, 2);
}

ir::Graph merge_heads_graph(const at::Tensor& q) {
  ir::Graph g;
  std::vector<ir::Value*> merged;
  for (const char* name : {"q", "k", "v"}) {
    ir::Value* x = g.add_placeholder(name, ir::TensorMeta::of(q));
    x = g.add_call("aten::transpose.int", {x, int64_t{1}, int64_t{2}})->result();
    merged.push_back(
        g.add_call("aten::reshape", {x, std::vector<int64_t>{q.size(0), q.size(2), q.size(1) * q.size(3)}})->result());
  }
  g.set_output({g.add_call("aten::cat", {merged, int64_t{2}})->result()});
  ir::propagate_meta(g);
  return g;
}

void set_bytes(benchmark::State& state, int64_t bytes_per_iteration) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * bytes_per_iteration);
}

// Runs a compiled graph on `inputs` for every iteration.
void run_compiled(benchmark::State& state, const ir::CompiledFn& fn, const std::vector<at::Tensor>& inputs) {
  for (auto _ : state) {
    std::vector<at::Tensor> in = inputs;
    benchmark::DoNotOptimize(fn(in));
  }
}

// --- an 8-op pointwise chain ---------------------------------------------------------

constexpr int64_t kChainBytes = 2 * kNumel * kFloatBytes;  // read x, write y

void BM_InductorChain8_eager(benchmark::State& state) {
  at::Tensor x = at::randn({kNumel});
  for (auto _ : state) benchmark::DoNotOptimize(chain_eager(x));
  set_bytes(state, kChainBytes);
}

void BM_InductorChain8_inductor(benchmark::State& state) {
  at::Tensor x = at::randn({kNumel});
  run_compiled(state, inductor::compile_fx_inner(chain_graph(x), {x}), {x});
  set_bytes(state, kChainBytes);
}

void BM_InductorCopy(benchmark::State& state) {
  at::Tensor x = at::randn({kNumel});
  for (auto _ : state) benchmark::DoNotOptimize(x.clone());
  set_bytes(state, kChainBytes);
}

// --- the same chain on a GPU --------------------------------------------------------------
// 64M floats (256 MiB each way), as the CUDA issue states its aim: the fused
// kernel at >= 0.9 of a copy's bandwidth in the same run. Each iteration
// queues kGpuRepeats runs and synchronizes once, and reports the time of one
// run, so the wait for the device is spread over many runs.

constexpr int64_t kGpuNumel = int64_t{1} << 26;
constexpr int64_t kGpuChainBytes = 2 * kGpuNumel * kFloatBytes;
constexpr int kGpuRepeats = 10;

bool have_gpu() { return at::hasCUDA() && at::accelerator::deviceCount() > 0; }

template <typename Run>
void run_on_gpu(benchmark::State& state, Run run, int64_t bytes_per_run = kGpuChainBytes) {
  run();  // warm-up: the first launch loads the kernel and sizes the allocator's pool
  at::accelerator::synchronizeDevice(0);
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kGpuRepeats; ++i) run();
    at::accelerator::synchronizeDevice(0);
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
                           kGpuRepeats);
  }
  set_bytes(state, bytes_per_run);
}

at::Tensor gpu_input() { return at::randn({kGpuNumel}, at::TensorOptions().device(at::kCUDA, 0)); }

void BM_InductorChain8Cuda_eager(benchmark::State& state) {
  if (!have_gpu()) return state.SkipWithError("no CUDA device");
  at::Tensor x = gpu_input();
  run_on_gpu(state, [&] { benchmark::DoNotOptimize(chain_eager(x)); });
}

void BM_InductorChain8Cuda_inductor(benchmark::State& state) {
  if (!have_gpu()) return state.SkipWithError("no CUDA device");
  at::Tensor x = gpu_input();
  ir::CompiledFn fn = inductor::compile_fx_inner(chain_graph(x), {x});
  run_on_gpu(state, [&] {
    std::vector<at::Tensor> in = {x};
    benchmark::DoNotOptimize(fn(in));
  });
}

void BM_InductorCopyCuda(benchmark::State& state) {
  if (!have_gpu()) return state.SkipWithError("no CUDA device");
  at::Tensor x = gpu_input();
  run_on_gpu(state, [&] { benchmark::DoNotOptimize(x.clone()); });
}

// --- softmax rows ----------------------------------------------------------------------

constexpr int64_t kSoftmaxBytes = 2 * kRows * kCols * kFloatBytes;  // read x, write y

void BM_InductorSoftmax_eager(benchmark::State& state) {
  at::Tensor x = at::randn({kRows, kCols});
  for (auto _ : state) benchmark::DoNotOptimize(at::softmax(x, -1));
  set_bytes(state, kSoftmaxBytes);
}

void BM_InductorSoftmax_inductor(benchmark::State& state) {
  at::Tensor x = at::randn({kRows, kCols});
  run_compiled(state, inductor::compile_fx_inner(softmax_graph(x), {x}), {x});
  set_bytes(state, kSoftmaxBytes);
}

// The same kernel built without InductorOptions' -mprefer-vector-width=512:
// GCC's 256-bit vectors on an AVX-512 CPU (the same code elsewhere).
void BM_InductorSoftmax_inductor_256(benchmark::State& state) {
  at::Tensor x = at::randn({kRows, kCols});
  inductor::InductorOptions options;
  std::erase(options.flags, "-mprefer-vector-width=512");
  run_compiled(state, inductor::compile_fx_inner(softmax_graph(x), {x}, options), {x});
  set_bytes(state, kSoftmaxBytes);
}

// --- softmax backward rows --------------------------------------------------------------

constexpr int64_t kSoftmaxBackwardBytes = 3 * kRows * kCols * kFloatBytes;  // read grad and y, write dx

void BM_InductorSoftmaxBackward_eager(benchmark::State& state) {
  at::Tensor grad = at::randn({kRows, kCols});
  at::Tensor y = at::softmax(at::randn({kRows, kCols}), -1);
  for (auto _ : state) benchmark::DoNotOptimize(at::_softmax_backward_data(grad, y, -1, at::kFloat));
  set_bytes(state, kSoftmaxBackwardBytes);
}

void BM_InductorSoftmaxBackward_inductor(benchmark::State& state) {
  at::Tensor grad = at::randn({kRows, kCols});
  at::Tensor y = at::softmax(at::randn({kRows, kCols}), -1);
  run_compiled(state, inductor::compile_fx_inner(softmax_backward_graph(grad, y), {grad, y}), {grad, y});
  set_bytes(state, kSoftmaxBackwardBytes);
}

// --- host arithmetic ----------------------------------------------------------------------

constexpr int kAdamParameters = 62;  // ResNet-18's

void BM_HostArith_aten(benchmark::State& state) {
  const at::Tensor step = at::zeros({}, at::kDouble), lr = at::scalar_tensor(1e-3, at::kDouble);
  for (auto _ : state)
    for (int p = 0; p < kAdamParameters; ++p) {
      const at::Tensor s = at::add(step, 1);
      const at::Tensor bc1 = at::rsub(at::pow(0.9, s), 1);
      benchmark::DoNotOptimize(at::rsub(at::pow(0.999, s), 1));
      benchmark::DoNotOptimize(at::div(lr, bc1).neg());
    }
}

void BM_HostArith_host(benchmark::State& state) {
  using inductor::detail::evaluate;
  using inductor::detail::host_double;
  using inductor::detail::host_tensor;
  using H = inductor::detail::HostArith;
  const H add{H::Op::Add, {0, -1}, {0, 1}}, power{H::Op::Pow, {-1, 1}}, rsub{H::Op::Add, {-1, 0}, {1, 0}, -1},
      div{H::Op::Div, {0, 1}}, neg{H::Op::Neg, {0, -1}};
  const at::Tensor step = at::zeros({}, at::kDouble), lr = at::scalar_tensor(1e-3, at::kDouble);
  // What the plan does per op: read the operands, compute, make the result.
  auto op = [](const H& h, double a, double b) { return host_tensor(evaluate(h, a, b)); };
  for (auto _ : state)
    for (int p = 0; p < kAdamParameters; ++p) {
      const at::Tensor s = op(add, *host_double(step), 1);
      const at::Tensor bc1 = op(rsub, *host_double(op(power, 0.9, *host_double(s))), 1);
      benchmark::DoNotOptimize(op(rsub, *host_double(op(power, 0.999, *host_double(s))), 1));
      benchmark::DoNotOptimize(op(neg, *host_double(op(div, *host_double(lr), *host_double(bc1))), 0));
    }
}

// --- layer norm rows --------------------------------------------------------------------

constexpr double kEps = 1e-5;
constexpr int64_t kLayerNormBytes = (2 * kRows * kCols + 2 * kCols) * kFloatBytes;  // read x, w, b; write y

void BM_InductorLayerNorm_eager(benchmark::State& state) {
  at::Tensor x = at::randn({kRows, kCols}), w = at::randn({kCols}), b = at::randn({kCols});
  for (auto _ : state) benchmark::DoNotOptimize(at::layer_norm(x, {kCols}, w, b, kEps));
  set_bytes(state, kLayerNormBytes);
}

void BM_InductorLayerNorm_inductor(benchmark::State& state) {
  at::Tensor x = at::randn({kRows, kCols}), w = at::randn({kCols}), b = at::randn({kCols});
  run_compiled(state, inductor::compile_fx_inner(layer_norm_graph(x, w, b, kEps), {x, w, b}), {x, w, b});
  set_bytes(state, kLayerNormBytes);
}

// --- a column reduction ------------------------------------------------------------------

constexpr int64_t kColumnSumBytes = (kRows * kCols + kCols) * kFloatBytes;  // read x, write the [C] sums

void BM_InductorColumnSum_eager(benchmark::State& state) {
  at::Tensor x = at::randn({kRows, kCols});
  for (auto _ : state) benchmark::DoNotOptimize(at::sum(x, {0}));
  set_bytes(state, kColumnSumBytes);
}

void BM_InductorColumnSum_inductor(benchmark::State& state) {
  at::Tensor x = at::randn({kRows, kCols});
  run_compiled(state, inductor::compile_fx_inner(column_sum_graph(x), {x}), {x});
  set_bytes(state, kColumnSumBytes);
}

// --- a reduction of every element --------------------------------------------------------

constexpr int64_t kSumBytes = kRows * kCols * kFloatBytes;

void BM_InductorSum_eager(benchmark::State& state) {
  at::Tensor x = at::randn({kRows, kCols});
  for (auto _ : state) benchmark::DoNotOptimize(at::sum(x));
  set_bytes(state, kSumBytes);
}

void BM_InductorSum_inductor(benchmark::State& state) {
  at::Tensor x = at::randn({kRows, kCols});
  run_compiled(state, inductor::compile_fx_inner(sum_graph(x), {x}), {x});
  set_bytes(state, kSumBytes);
}

constexpr int64_t kFewRows = 4;

void BM_InductorRowSums_eager(benchmark::State& state) {
  at::Tensor x = at::randn({kFewRows, kRows * kCols / kFewRows});
  for (auto _ : state) benchmark::DoNotOptimize(at::sum(x, 1));
  set_bytes(state, kSumBytes);
}

void BM_InductorRowSums_inductor(benchmark::State& state) {
  at::Tensor x = at::randn({kFewRows, kRows * kCols / kFewRows});
  run_compiled(state, inductor::compile_fx_inner(row_sums_graph(x), {x}), {x});
  set_bytes(state, kSumBytes);
}

// --- merging heads and concatenating: a cat fused with its inputs' copies ------------------

const std::vector<int64_t> kHeads = {8, 12, 256, 64};
const std::vector<int64_t> kHeadsCuda = {8, 12, 1024, 64};

int64_t merge_heads_bytes(const std::vector<int64_t>& sizes) {  // read q, k, v; write the cat
  return 2 * 3 * sizes[0] * sizes[1] * sizes[2] * sizes[3] * kFloatBytes;
}

void BM_InductorMergeHeads_eager(benchmark::State& state) {
  at::Tensor q = at::randn(kHeads), k = at::randn(kHeads), v = at::randn(kHeads);
  for (auto _ : state) benchmark::DoNotOptimize(merge_heads_eager(q, k, v));
  set_bytes(state, merge_heads_bytes(kHeads));
}

void BM_InductorMergeHeads_inductor(benchmark::State& state) {
  at::Tensor q = at::randn(kHeads), k = at::randn(kHeads), v = at::randn(kHeads);
  run_compiled(state, inductor::compile_fx_inner(merge_heads_graph(q), {q, k, v}), {q, k, v});
  set_bytes(state, merge_heads_bytes(kHeads));
}

void BM_InductorMergeHeadsCuda_eager(benchmark::State& state) {
  if (!have_gpu()) return state.SkipWithError("no CUDA device");
  const at::TensorOptions o = at::TensorOptions().device(at::kCUDA, 0);
  at::Tensor q = at::randn(kHeadsCuda, o), k = at::randn(kHeadsCuda, o), v = at::randn(kHeadsCuda, o);
  run_on_gpu(
      state, [&] { benchmark::DoNotOptimize(merge_heads_eager(q, k, v)); }, merge_heads_bytes(kHeadsCuda));
}

void BM_InductorMergeHeadsCuda_inductor(benchmark::State& state) {
  if (!have_gpu()) return state.SkipWithError("no CUDA device");
  const at::TensorOptions o = at::TensorOptions().device(at::kCUDA, 0);
  at::Tensor q = at::randn(kHeadsCuda, o), k = at::randn(kHeadsCuda, o), v = at::randn(kHeadsCuda, o);
  ir::CompiledFn fn = inductor::compile_fx_inner(merge_heads_graph(q), {q, k, v});
  run_on_gpu(
      state,
      [&] {
        std::vector<at::Tensor> in = {q, k, v};
        benchmark::DoNotOptimize(fn(in));
      },
      merge_heads_bytes(kHeadsCuda));
}

// --- code generation for a large graph -----------------------------------------------------
// What a cold compile spends before any compiler runs, on the largest graph
// of the zoo: its lowering once had a check quadratic in the step's size.

void BM_InductorGenerateCode_gpt2_small(benchmark::State& state) {
  models::Model m = models::make_model("gpt", "full");
  torch::optim::AdamW optimizer(m.module->parameters(), torch::optim::AdamWOptions(3e-4));
  tracer::TraceOptions trace;
  trace.mode = tracer::TraceMode::Fake;  // a real trace at T 1024 holds gigabytes of activations
  trace.decompositions = tracer::core_aten_decompositions();
  pipeline::Builder builder;
  builder.backend("interpreter").trace_options(trace).passes(pipeline::Builder::default_passes());
  pipeline::TrainStep step = builder.compile_train_step(m.module, optimizer, models::loss_of(m));
  const data::Batch b = m.example_batch(8, 0);
  step.compile({b.inputs, b.targets});
  const ir::Graph& g = step.graph();
  for (auto _ : state) benchmark::DoNotOptimize(inductor::generate_code(g));
}

}  // namespace

BENCHMARK(BM_InductorGenerateCode_gpt2_small)
    ->Name("BM_InductorGenerateCode/gpt2-small")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_InductorChain8_eager)->Name("BM_InductorChain8/eager")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_InductorChain8_inductor)->Name("BM_InductorChain8/inductor")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_InductorCopy)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_InductorChain8Cuda_eager)
    ->Name("BM_InductorChain8Cuda/eager")
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();
BENCHMARK(BM_InductorChain8Cuda_inductor)
    ->Name("BM_InductorChain8Cuda/inductor")
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();
BENCHMARK(BM_InductorCopyCuda)->Unit(benchmark::kMillisecond)->UseManualTime();
BENCHMARK(BM_InductorSoftmax_eager)->Name("BM_InductorSoftmax/eager")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_InductorSoftmax_inductor)
    ->Name("BM_InductorSoftmax/inductor")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_InductorSoftmax_inductor_256)
    ->Name("BM_InductorSoftmax/inductor_256")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_InductorSoftmaxBackward_eager)
    ->Name("BM_InductorSoftmaxBackward/eager")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_InductorSoftmaxBackward_inductor)
    ->Name("BM_InductorSoftmaxBackward/inductor")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_InductorLayerNorm_eager)->Name("BM_InductorLayerNorm/eager")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_InductorLayerNorm_inductor)
    ->Name("BM_InductorLayerNorm/inductor")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_HostArith_aten)->Name("BM_HostArith/aten")->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_HostArith_host)->Name("BM_HostArith/host")->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_InductorColumnSum_eager)->Name("BM_InductorColumnSum/eager")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_InductorColumnSum_inductor)
    ->Name("BM_InductorColumnSum/inductor")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_InductorSum_eager)->Name("BM_InductorSum/eager")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_InductorSum_inductor)->Name("BM_InductorSum/inductor")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_InductorMergeHeads_eager)
    ->Name("BM_InductorMergeHeads/eager")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_InductorMergeHeads_inductor)
    ->Name("BM_InductorMergeHeads/inductor")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_InductorMergeHeadsCuda_eager)
    ->Name("BM_InductorMergeHeadsCuda/eager")
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();
BENCHMARK(BM_InductorMergeHeadsCuda_inductor)
    ->Name("BM_InductorMergeHeadsCuda/inductor")
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();
BENCHMARK(BM_InductorRowSums_eager)->Name("BM_InductorRowSums/eager")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_InductorRowSums_inductor)
    ->Name("BM_InductorRowSums/inductor")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
