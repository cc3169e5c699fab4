// The tracer on CUDA tensors: the same captures as on the CPU, replayed by
// the interpreter on the GPU and compared with eager on the GPU. Skipped
// where no CUDA device is usable.
#include "catch.h"
#include "module_testing.h"
#include "testing.h"
#include "tracer_testing.h"

#include <crucible/models/zoo.h>
#include <crucible/tracer/decomposition.h>
#include <crucible/tracer/functional_call.h>
#include <crucible/tracer/make_fx.h>

#include <crucible/ir/printer.h>
#include <crucible/runtime/autocast.h>

#include <ATen/Context.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/utils.h>

#include <functional>
#include <string>
#include <vector>

using crucible::testing::count_calls;
using crucible::testing::module_graph_inputs;
using crucible::testing::run_traced;
using Tensors = std::vector<at::Tensor>;
namespace ir = crucible::ir;

TEST_CASE("CUDA: a joint trace of the ConvNet's loss.backward() replays eager's loss and gradients", "[tracer][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  torch::manual_seed(0);
  auto model = crucible::models::make_model("convnet");
  model.module->to(torch::kCUDA);
  auto batch = model.example_batch(8, 1);
  const at::Tensor x = batch.inputs.cuda(), y = batch.targets.cuda();
  auto step = [&](torch::nn::Module&, const Tensors& in) {
    auto loss = model.loss(model.forward(in[0]), in[1]);
    loss.backward();
    return Tensors{loss.detach()};
  };
  crucible::tracer::ModuleTraceOptions options;
  options.gradients_as_outputs = true;
  auto r = crucible::tracer::functional_call(*model.module, step, {x, y}, options);
  for (const ir::Value* p : r.graph.placeholders()) REQUIRE(p->meta().device.is_cuda());

  auto actual = run_traced(r, module_graph_inputs(*model.module, {x, y}));
  auto loss = model.loss(model.forward(x), y);
  loss.backward();
  // cuDNN may pick a different (equally valid) convolution algorithm per call,
  // and its weight-gradient algorithms accumulate with atomics in any order:
  // results agree to float32 rounding over the reductions, not bitwise.
  REQUIRE_CLOSE(actual[0], loss.detach(), 1e-5, 1e-6);
  const auto params = model.module->parameters();
  for (size_t g : r.graph.signature().outputs_of(ir::OutputKind::Gradient)) {
    const size_t input = *r.graph.signature().outputs[g].input_index;
    REQUIRE_CLOSE(actual[g], params[input].grad(), 1e-4, 1e-6);
  }
}

// Note [Fake tensors]: a fake CUDA tensor is_cuda(), so at::dropout takes
// the fused kernel eager runs (native_dropout); as on the CPU, the graph
// holds the RNG op, which draws from the default CUDA generator (Philox)
// when it runs, so re-seeding it replays eager's mask.
TEST_CASE("CUDA: by default (TraceMode::Auto) dropout on a GPU is traced on fake tensors, with eager's draws",
          "[tracer][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  auto fn = [](const Tensors& in) { return Tensors{at::dropout(in[0] * 3.0, 0.5, /*train=*/true)}; };
  const Tensors inputs = {at::randn({64, 64}, at::kCUDA)};
  crucible::testing::CollectWarnings warnings;
  at::manual_seed(7);
  const auto r = crucible::tracer::make_fx(fn, inputs);
  CHECK(r.mode == crucible::tracer::TraceMode::Fake);
  CHECK(r.fake_mode_abandoned.empty());
  CHECK(warnings.messages.empty());
  CHECK(count_calls(r.graph, "aten::native_dropout") == 1);
  at::manual_seed(7);
  const auto expected = fn(inputs);
  at::manual_seed(7);
  REQUIRE_EQUAL_TENSORS(run_traced(r, inputs)[0], expected[0]);
}

// Note [Devices in fake mode]: a factory given no device makes a CPU tensor,
// as in eager; one given a fake CUDA tensor's options a CUDA one.
TEST_CASE("CUDA: factories in a fake-mode trace are where eager puts them", "[tracer][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  auto fn = [](const Tensors& in) {
    const at::Tensor on_cpu = at::arange(4, at::kFloat);  // moved to the GPU by .to: a copy in the graph
    const at::Tensor on_gpu = at::ones({4}, in[0].options());
    return Tensors{in[0] + on_cpu.to(in[0].device()) + on_gpu};
  };
  const Tensors inputs = {at::randn({3, 4}, at::kCUDA)};
  crucible::tracer::TraceOptions fake_mode, real_mode;
  fake_mode.mode = crucible::tracer::TraceMode::Fake;
  real_mode.mode = crucible::tracer::TraceMode::Real;
  const auto fake = crucible::tracer::make_fx(fn, inputs, fake_mode);
  const auto real = crucible::tracer::make_fx(fn, inputs, real_mode);
  CHECK(count_calls(fake.graph, "aten::_to_copy") == 1);
  REQUIRE(crucible::ir::to_text(fake.graph) == crucible::ir::to_text(real.graph));
  REQUIRE_EQUAL_TENSORS(run_traced(fake, inputs)[0], fn(inputs)[0]);
}

namespace {

// A batch norm in training and its backward, `fn` of (x, grad, weight,
// bias, running_mean, running_var): x and grad [4, 6, 5, 7] of `dtype` in
// `format`, the rest [6] float. Traced with the core table, the graph calls
// none of `gone` and each of `kept` once, and gives fn's eager values within
// rtol / atol (compared in float), its output in x's layout.
void check_batch_norm(const std::function<Tensors(const Tensors&)>& fn, at::ScalarType dtype, at::MemoryFormat format,
                      const std::vector<std::string>& gone, const std::vector<std::string>& kept, double rtol,
                      double atol) {
  const auto f32 = at::TensorOptions().device(at::kCUDA);
  const Tensors inputs = {(at::randn({4, 6, 5, 7}, f32) * 3 + 1).to(dtype).contiguous(format),
                          at::randn({4, 6, 5, 7}, f32).to(dtype).contiguous(format),
                          at::rand({6}, f32) + 0.5,
                          at::randn({6}, f32),
                          at::randn({6}, f32),
                          at::rand({6}, f32) + 0.5};
  crucible::tracer::TraceOptions options;
  options.decompositions = crucible::tracer::core_aten_decompositions();
  const auto r = crucible::tracer::make_fx(fn, crucible::testing::clones(inputs), options);
  for (const std::string& op : gone) CHECK(count_calls(r.graph, op) == 0);
  for (const std::string& op : kept) CHECK(count_calls(r.graph, op) == 1);
  const Tensors expected = fn(crucible::testing::clones(inputs));
  const Tensors actual = run_traced(r, crucible::testing::clones(inputs));
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    INFO("output " << i);
    REQUIRE(actual[i].scalar_type() == expected[i].scalar_type());
    REQUIRE(actual[i].sizes() == expected[i].sizes());
    REQUIRE_CLOSE(actual[i].to(at::kFloat), expected[i].to(at::kFloat), rtol, atol);
  }
  CHECK(actual[0].is_contiguous(format));
}

}  // namespace

// Note [Batch norm on cuDNN]: with the core table, cuDNN's batch norm and
// its backward (float and half: cuDNN takes half with float weights, not
// bfloat16), and ATen's native CUDA ones (float and bfloat16, what bf16
// autocast runs), are traced as the math they compute with ATen's CUDA
// kernels for the statistics and the backward's sums, contiguous and
// channels-last, and the graph gives the fused kernels' values: statistics
// summed in another order (rtol 1e-4 in float). In half the outputs are
// rounded once from float, and cuDNN's sums over half inputs differ from
// ATen's float ones by up to 2e-4 relative (seen on an H100): 2^-9 relative
// allowed; in bfloat16 two ulps of the rounded outputs (2^-7). The running
// statistics (inputs 4 and 5) are written in place.
TEST_CASE("CUDA: cuDNN's and the native batch norm and their backwards decompose, with the kernels' values",
          "[tracer][cuda][decomp]") {
  CRUCIBLE_REQUIRE_CUDA();
  at::manual_seed(3);
  struct Case {
    std::string what;
    std::function<Tensors(const Tensors&)> fn;
    at::ScalarType reduced;  // the other dtype than float
    std::vector<std::string> gone;
    double reduced_rtol, reduced_atol;
  };
  const std::vector<Case> cases = {
      {"cuDNN",
       [](const Tensors& t) {
         auto [y, save_mean, save_invstd, reserve] =
             at::cudnn_batch_norm(t[0], t[2], t[3], t[4], t[5], true, 0.1, 1e-5);
         auto [dx, dw, db] =
             at::cudnn_batch_norm_backward(t[0], t[1], t[2], t[4], t[5], save_mean, save_invstd, 1e-5, reserve);
         return Tensors{y, save_mean, save_invstd, dx, dw, db, t[4].clone(), t[5].clone()};
       },
       at::kHalf,
       {"aten::cudnn_batch_norm", "aten::cudnn_batch_norm_backward"},
       1.0 / 512,
       1.0 / 256},
      {"native",
       [](const Tensors& t) {
         auto [y, save_mean, save_invstd] = at::native_batch_norm(t[0], t[2], t[3], t[4], t[5], true, 0.1, 1e-5);
         auto [dx, dw, db] = at::native_batch_norm_backward(t[1], t[0], t[2], t[4], t[5], save_mean, save_invstd, true,
                                                            1e-5, {true, true, true});
         return Tensors{y, save_mean, save_invstd, dx, dw, db, t[4].clone(), t[5].clone()};
       },
       at::kBFloat16,
       {"aten::native_batch_norm", "aten::native_batch_norm_backward"},
       1.0 / 128,
       1.0 / 32},
  };
  for (const Case& c : cases)
    for (const at::ScalarType dtype : {at::kFloat, c.reduced})
      for (const auto format : {at::MemoryFormat::Contiguous, at::MemoryFormat::ChannelsLast}) {
        INFO(c.what << " " << c10::toString(dtype) << " " << format);
        const bool reduced = dtype == c.reduced;
        check_batch_norm(c.fn, dtype, format, c.gone, {"aten::batch_norm_stats", "aten::batch_norm_backward_reduce"},
                         reduced ? c.reduced_rtol : 1e-4, reduced ? c.reduced_atol : 1e-5);
      }
}

// A BatchNorm2d in training, functionalized with its backward (Note [Ops
// with hidden writes]: cuDNN's functional variant, decomposed): the output,
// the new running statistics and the gradients are cuDNN's (tolerances as
// above).
TEST_CASE("CUDA: a functionalized BatchNorm2d's joint trace with the core table gives cuDNN's values",
          "[tracer][cuda][decomp]") {
  CRUCIBLE_REQUIRE_CUDA();
  torch::manual_seed(4);
  auto bn = std::make_shared<torch::nn::BatchNorm2dImpl>(6);
  bn->to(torch::kCUDA);
  bn->train();
  const at::Tensor x = at::randn({4, 6, 5, 7}, at::kCUDA) * 3 + 1;
  // A weighted sum: each gradient a sum of terms of one sign's size, not a
  // cancellation (the bias gradient of a squared norm is zero up to noise).
  const at::Tensor weights = at::randn({4, 6, 5, 7}, at::kCUDA);
  auto step = [&](torch::nn::Module&, const Tensors& in) {
    auto loss = (bn->forward(in[0]) * in[1]).sum();
    loss.backward();
    return Tensors{loss.detach()};
  };
  crucible::tracer::ModuleTraceOptions options;
  options.gradients_as_outputs = true;
  options.trace.functionalize = true;
  options.trace.decompositions = crucible::tracer::core_aten_decompositions();
  const auto r = crucible::tracer::functional_call(*bn, step, {x, weights}, options);
  for (const char* op :
       {"aten::cudnn_batch_norm", "aten::cudnn_batch_norm_backward", "crucible::cudnn_batch_norm_functional"})
    CHECK(count_calls(r.graph, op) == 0);
  const Tensors actual = run_traced(r, module_graph_inputs(*bn, {x, weights}));
  const at::Tensor loss = step(*bn, {x, weights})[0];
  REQUIRE_CLOSE(actual[0], loss, 1e-4, 1e-5);
  const auto& sig = r.graph.signature();
  const auto mutated = sig.outputs_of(ir::OutputKind::MutatedInput);
  REQUIRE(mutated.size() == 3);  // running_mean, running_var, num_batches_tracked
  REQUIRE_CLOSE(actual[mutated[0]], bn->running_mean, 1e-4, 1e-5);
  REQUIRE_CLOSE(actual[mutated[1]], bn->running_var, 1e-4, 1e-5);
  const auto params = bn->parameters();
  for (size_t g : sig.outputs_of(ir::OutputKind::Gradient))
    REQUIRE_CLOSE(actual[g], params[*sig.outputs[g].input_index].grad(), 1e-4, 1e-5);
}

TEST_CASE("CUDA: functionalized in-place updates of a GPU input come back as a mutated-input output",
          "[tracer][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  auto fn = [](const Tensors& in) {
    in[0].mul_(2.0).add_(in[1]);
    return Tensors{in[0].sum()};
  };
  const Tensors inputs = {at::randn({32}, at::kCUDA), at::randn({32}, at::kCUDA)};
  crucible::tracer::TraceOptions options;
  options.functionalize = true;
  auto r = crucible::tracer::make_fx(fn, inputs, options);
  REQUIRE(r.input_mutations[0].data);
  REQUIRE_FALSE(r.input_mutations[1].data);
  for (const ir::Node* n : r.graph.nodes()) REQUIRE_FALSE((n->is_call() && n->is_mutating()));
  Tensors eager = crucible::testing::clones(inputs);
  const at::Tensor sum = fn(eager)[0];
  auto actual = run_traced(r, crucible::testing::clones(inputs));
  REQUIRE_EQUAL_TENSORS(actual[0], sum);
  const auto mutated = r.graph.signature().outputs_of(ir::OutputKind::MutatedInput);
  REQUIRE(mutated.size() == 1);
  REQUIRE_EQUAL_TENSORS(actual[mutated[0]], eager[0]);
}

// Note [Attention kernels' metadata] in ir/src/meta_functions.cpp: with each
// fused kernel scaled_dot_product_attention can pick on the GPU, under bf16
// autocast, with dropout, forward and backward, a fake-mode trace records
// what a real-mode trace records (ops, casts, every value's metadata) and
// replays eager's values, on heads-major and sequence-major inputs and on
// thirds of one fused projection (views of a larger buffer), whose
// memory-efficient backward alone is left to a real-mode trace.
TEST_CASE("CUDA: attention under bf16 autocast on fake tensors records the real trace's graph, for each fused kernel",
          "[tracer][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  at::Context& ctx = at::globalContext();
  struct Kernels {  // the kernels scaled_dot_product_attention may pick, put back at the end
    at::Context& ctx;
    bool flash = ctx.userEnabledFlashSDP(), efficient = ctx.userEnabledMemEfficientSDP(),
         cudnn = ctx.userEnabledCuDNNSDP();
    ~Kernels() {
      ctx.setSDPUseFlash(flash);
      ctx.setSDPUseMemEfficient(efficient);
      ctx.setSDPUseCuDNN(cudnn);
    }
  } restore{ctx};
  constexpr int64_t B = 2, T = 64, H = 2, E = 64, C = H * E;
  for (const std::string layout : {"heads-major", "sequence-major", "fused projection"}) {
    // x [B, T, C], w [3C, C] -> loss, dL/dw.
    auto fn = [layout](const Tensors& in) {
      const at::Tensor w = in[1].detach().requires_grad_();
      at::Tensor out;
      {
        crucible::runtime::AutocastGuard autocast(at::kCUDA, at::kBFloat16);
        const std::vector<at::Tensor> qkv = at::linear(in[0], w).split(C, 2);
        auto heads = [&](const at::Tensor& t) {
          at::Tensor h = t.view({B, T, H, E}).transpose(1, 2);
          if (layout == "heads-major") return h.contiguous();
          if (layout == "sequence-major") return t.contiguous().view({B, T, H, E}).transpose(1, 2);
          return h;  // a view of the fused projection's output: not dense
        };
        out = at::scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), {}, 0.1,
                                               /*is_causal=*/true);
      }
      const at::Tensor loss = out.to(at::kFloat).square().sum();
      return Tensors{loss.detach(), torch::autograd::grad({loss}, {w})[0]};
    };
    const Tensors inputs = {at::randn({B, T, C}, at::kCUDA), at::randn({3 * C, C}, at::kCUDA) * 0.1};
    for (const std::string kernel : {"flash", "efficient", "cudnn"}) {
      INFO(layout << ", " << kernel);
      ctx.setSDPUseFlash(kernel == "flash");
      ctx.setSDPUseMemEfficient(kernel == "efficient");
      ctx.setSDPUseCuDNN(kernel == "cudnn");
      crucible::tracer::TraceOptions real_mode;
      real_mode.mode = crucible::tracer::TraceMode::Real;
      const auto real = crucible::tracer::make_fx(fn, inputs, real_mode);
      // A kernel may refuse the fused projection's strides (the math path runs then).
      const bool ran = count_calls(real.graph, "aten::_scaled_dot_product_" + kernel + "_attention") == 1;
      if (layout != "fused projection") REQUIRE(ran);
      const auto r = crucible::tracer::make_fx(fn, inputs);
      if (ran && layout == "fused projection" && kernel == "efficient") {
        CHECK(r.mode == crucible::tracer::TraceMode::Real);  // it may pack the thirds' gradients into one buffer
        continue;
      }
      REQUIRE(r.mode == crucible::tracer::TraceMode::Fake);
      REQUIRE(crucible::ir::to_text(r.graph) == crucible::ir::to_text(real.graph));
      at::manual_seed(11);
      const Tensors expected = fn(inputs);
      at::manual_seed(11);
      const Tensors actual = run_traced(r, inputs);
      // The same kernels on the same inputs and draws; the backward kernels
      // may accumulate with atomics in another order (bf16 gradients).
      REQUIRE_CLOSE(actual[0], expected[0], 1e-5, 1e-5);
      REQUIRE_CLOSE(actual[1], expected[1], 2e-2, 2e-2);
    }
  }
}
