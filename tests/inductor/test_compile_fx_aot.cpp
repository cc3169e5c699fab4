// compile_fx (the whole path: core decompositions, AOTAutograd, min-cut
// partition, post-grad passes, compile_fx_inner) against eager LibTorch:
// values and gradients of a function and of a module, the inference path
// with an input mutation, and which stages, partition and cache it used.
#include <crucible/autograd/aot_function.h>
#include <crucible/autograd/error.h>
#include <crucible/inductor/compile_fx_aot.h>
#include <crucible/ir/graph.h>
#include <crucible/ir/instrument.h>
#include <crucible/runtime/instruments.h>
#include <crucible/runtime/metrics.h>

#include "catch.h"
#include "module_testing.h"
#include "testing.h"

#include <torch/nn/module.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

using namespace crucible;
using Tensors = std::vector<at::Tensor>;

namespace {

// One kernel cache per test run, shared by the test cases.
inductor::InductorOptions options() {
  static const std::string dir = crucible::testing::temp_dir("crucible-compile-fx-aot-test");
  inductor::InductorOptions o;
  o.cache_dir = dir;
  return o;
}

// Tolerances against eager, float32. Fused kernels evaluate pointwise chains
// in another order than eager's separate kernels (a*b+c contracted to an FMA,
// libm's exp/tanh/erf where ATen uses its vectorized ones): a few ulps,
// relative 1e-5. The decomposed softmax, GELU and losses sum their rows in
// another order (in double in generated code) than ATen's fused kernels do,
// and gradients go through several such sums and through the mm extern
// kernels fed by them: relative 1e-4, with an absolute floor for the
// elements that nearly cancel.
constexpr double kPointwiseRtol = 1e-5, kPointwiseAtol = 1e-6;
constexpr double kReductionRtol = 1e-4, kReductionAtol = 1e-5;

Tensors leaves(const Tensors& ts, const std::vector<bool>& requires_grad) {
  Tensors out;
  for (size_t i = 0; i < ts.size(); ++i) out.push_back(ts[i].detach().clone().requires_grad_(requires_grad[i]));
  return out;
}

// A linear layer, GELU, softmax and a sum of squares: the GELU, the softmax
// and their backwards are decomposed (core_aten_decompositions) and fused.
Tensors gelu_softmax(const Tensors& in) {
  const at::Tensor h = at::gelu(at::addmm(in[2], in[0], in[1].t()));
  const at::Tensor p = at::softmax(h, -1);
  return {h, (p * p + h).sum()};
}

// sin(sin(sin(x))), summed: the backward needs cos of x and of both
// intermediates. The default partition saves the intermediates; the min-cut
// one saves x alone and recomputes the sines (pointwise, cheap).
Tensors sine_chain(const Tensors& in) { return {in[0].sin().sin().sin().sum()}; }

// The metrics of the last compiled graph of `kind` in the process-wide log.
runtime::CompilationMetrics last_record(const std::string& kind) {
  const auto records = runtime::default_metrics_log().records();
  for (auto it = records.rbegin(); it != records.rend(); ++it)
    if (it->kind == kind) return *it;
  FAIL("no " << kind << " graph in the metrics log");
  return {};
}

// Records the stages of a compilation, and the ops of each graph the
// backend stage receives.
struct StageRecorder : ir::Instrument {
  void before_stage(const ir::StageEvent& event) override {
    std::lock_guard<std::mutex> lock(mu);
    stages.emplace_back(event.stage);
    if (event.stage != "backend") return;
    std::vector<std::string>& targets = backend_ops[std::string(event.graphs.at(0).name)];
    for (const ir::Node* n : event.graphs.at(0).graph->nodes())
      if (n->is_call()) targets.push_back(n->target());
  }
  bool has_op_prefix(const std::string& graph, const std::string& prefix) const {
    for (const std::string& t : backend_ops.at(graph))
      if (t.rfind(prefix, 0) == 0) return true;
    return false;
  }
  std::mutex mu;
  std::vector<std::string> stages;
  std::map<std::string, std::vector<std::string>> backend_ops;
};

}  // namespace

TEST_CASE("compile_fx: a function's values and input gradients equal eager's", "[compile_fx_aot]") {
  at::manual_seed(0);
  const Tensors data{at::randn({6, 5}), at::randn({7, 5}), at::randn({7})};
  const Tensors c_in = leaves(data, {true, true, true});
  const Tensors e_in = leaves(data, {true, true, true});
  auto compiled = inductor::compile_fx(gelu_softmax, c_in, options());
  // Compiled here, for the example inputs, before any call.
  REQUIRE(compiled.num_compilations() == 1);
  const Tensors c_out = compiled(c_in);
  const Tensors e_out = gelu_softmax(e_in);
  REQUIRE(compiled.num_compilations() == 1);
  REQUIRE(c_out.size() == 2);
  REQUIRE(c_out[1].requires_grad());
  REQUIRE_CLOSE(c_out[0].detach(), e_out[0].detach(), kPointwiseRtol, kPointwiseAtol);
  REQUIRE_CLOSE(c_out[1].detach(), e_out[1].detach(), kReductionRtol, kReductionAtol);
  // Both outputs feed the loss: the backward takes a tangent for each.
  (c_out[1] + c_out[0].pow(2).mean()).backward();
  (e_out[1] + e_out[0].pow(2).mean()).backward();
  for (size_t i = 0; i < 3; ++i) {
    INFO("gradient of input " << i);
    REQUIRE_CLOSE(c_in[i].grad(), e_in[i].grad(), kReductionRtol, kReductionAtol);
  }
  // New sizes compile again, through the same config.
  const Tensors more = leaves({at::randn({3, 5}), data[1], data[2]}, {false, true, true});
  REQUIRE_CLOSE(compiled(more)[0].detach(), gelu_softmax(more)[0].detach(), kPointwiseRtol, kPointwiseAtol);
  REQUIRE(compiled.num_compilations() == 2);
}

TEST_CASE("compile_fx: a module's loss and parameter gradients equal eager's, across an in-place update",
          "[compile_fx_aot]") {
  torch::manual_seed(1);
  auto cm = std::make_shared<testing::Mlp>(8, 16, 4);
  auto em = std::make_shared<testing::Mlp>(8, 16, 4);
  {
    torch::NoGradGuard no_grad;
    const auto cp = cm->parameters(), ep = em->parameters();
    for (size_t i = 0; i < cp.size(); ++i) ep[i].copy_(cp[i]);
  }
  const auto loss_fn = [](testing::Mlp& m, const Tensors& in) { return torch::mse_loss(m.forward(in[0]), in[1]); };
  const Tensors batch{torch::randn({5, 8}), torch::randn({5, 4})};
  auto compiled = inductor::compile_fx(
      cm, [&](torch::nn::Module& m, const Tensors& in) { return Tensors{loss_fn(static_cast<testing::Mlp&>(m), in)}; },
      batch, options());
  REQUIRE(compiled.num_compilations() == 1);
  for (int step = 0; step < 2; ++step) {
    INFO("step " << step);
    const at::Tensor c_loss = compiled(batch)[0];
    const at::Tensor e_loss = loss_fn(*em, batch);
    REQUIRE_CLOSE(c_loss.detach(), e_loss.detach(), kReductionRtol, kReductionAtol);
    c_loss.backward();
    e_loss.backward();
    const auto cp = cm->named_parameters(), ep = em->named_parameters();
    REQUIRE(cp.size() == 4);
    for (size_t i = 0; i < cp.size(); ++i) {
      INFO("gradient of " << cp[i].key());
      REQUIRE_CLOSE(cp[i].value().grad(), ep[i].value().grad(), kReductionRtol, kReductionAtol);
    }
    // An SGD step in place: the next call reads the updated parameters.
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < cp.size(); ++i) {
      cp[i].value().sub_(0.5 * cp[i].value().grad());
      ep[i].value().sub_(0.5 * ep[i].value().grad());
      cp[i].value().grad().zero_();
      ep[i].value().grad().zero_();
    }
  }
  REQUIRE(compiled.num_compilations() == 1);
}

TEST_CASE("compile_fx: the inference path, with an input written in place, equals eager", "[compile_fx_aot]") {
  at::manual_seed(2);
  // Writes its input (kept in the graph as a trailing copy: Note [compile_fx])
  // and returns a function of the new value.
  const auto fn = [](const Tensors& in) {
    in[0].mul_(2).add_(in[1]);
    return Tensors{at::softmax(in[0], 1) * in[1].exp()};
  };
  const Tensors data{at::randn({4, 9}), at::randn({4, 9})};
  const int64_t inference_before = runtime::default_counters().get("graphs", "inference");
  const int64_t forward_before = runtime::default_counters().get("graphs", "forward");

  SECTION("inputs that do not require grad") {
    const Tensors c_in = leaves(data, {false, false}), e_in = leaves(data, {false, false});
    auto compiled = inductor::compile_fx(fn, c_in, options());
    // Compiling ran `fn` on copies: the example inputs are unchanged.
    REQUIRE_EQUAL_TENSORS(c_in[0], data[0]);
    const Tensors c_out = compiled(c_in);
    const Tensors e_out = fn(e_in);
    REQUIRE_FALSE(c_out[0].requires_grad());
    REQUIRE_CLOSE(c_out[0], e_out[0], kReductionRtol, kReductionAtol);
    REQUIRE_CLOSE(c_in[0], e_in[0], kPointwiseRtol, kPointwiseAtol);
  }
  SECTION("inputs that require grad, under NoGradGuard") {
    torch::NoGradGuard no_grad;
    const Tensors c_in = leaves(data, {true, true}), e_in = leaves(data, {true, true});
    auto compiled = inductor::compile_fx(fn, c_in, options());
    const Tensors c_out = compiled(c_in);
    const Tensors e_out = fn(e_in);
    REQUIRE_FALSE(c_out[0].requires_grad());
    REQUIRE_CLOSE(c_out[0], e_out[0], kReductionRtol, kReductionAtol);
    REQUIRE_CLOSE(c_in[0], e_in[0], kPointwiseRtol, kPointwiseAtol);
  }
  // One inference graph, no forward graph.
  REQUIRE(runtime::default_counters().get("graphs", "inference") == inference_before + 1);
  REQUIRE(runtime::default_counters().get("graphs", "forward") == forward_before);
}

TEST_CASE("compile_fx: the backward saves what the min-cut partition chooses", "[compile_fx_aot]") {
  at::manual_seed(3);
  const at::Tensor x = at::randn({64});
  const at::Tensor e_x = x.clone().requires_grad_();
  sine_chain({e_x})[0].backward();

  runtime::default_metrics_log().clear();
  const Tensors c_in = leaves({x}, {true});
  auto compiled = inductor::compile_fx(sine_chain, c_in, options());
  const at::Tensor loss = compiled(c_in)[0];
  REQUIRE_CLOSE(loss.detach(), sine_chain({x})[0], kPointwiseRtol, kPointwiseAtol);
  loss.backward();
  REQUIRE_CLOSE(c_in[0].grad(), e_x.grad(), kPointwiseRtol, kPointwiseAtol);
  // The backward takes x (saved) and the tangent: the sines are recomputed.
  REQUIRE(last_record("backward").graph_input_count == 2);

  // The default partition, for contrast, saves the intermediates too.
  runtime::default_metrics_log().clear();
  const Tensors d_in = leaves({x}, {true});
  autograd::aot_function(sine_chain)(d_in)[0].backward();
  REQUIRE(last_record("backward").graph_input_count > 2);
}

TEST_CASE("compile_fx_config: decompositions, post-grad passes and compile_fx_inner on every graph",
          "[compile_fx_aot]") {
  at::manual_seed(4);
  auto recorder = std::make_shared<StageRecorder>();
  autograd::AotConfig config = inductor::compile_fx_config(options(), {recorder});
  config.cache = nullptr;  // every graph reaches the backend
  auto compiled = autograd::aot_function(gelu_softmax, config);
  const Tensors data{at::randn({3, 4}), at::randn({5, 4}), at::randn({5})};
  const Tensors c_in = leaves(data, {true, true, true}), e_in = leaves(data, {true, true, true});
  const Tensors c_out = compiled(c_in);
  c_out[1].backward();
  gelu_softmax(e_in)[1].backward();
  REQUIRE_CLOSE(c_in[1].grad(), e_in[1].grad(), kReductionRtol, kReductionAtol);

  const std::vector<std::string> forward_stages = {"partition", "fw_compiler", "dce", "cse", "backend"};
  const std::vector<std::string> backward_stages = {"bw_compiler", "dce", "cse", "backend"};
  auto contains_in_order = [&](const std::vector<std::string>& wanted) {
    size_t next = 0;
    for (const std::string& s : recorder->stages)
      if (next < wanted.size() && s == wanted[next]) ++next;
    return next == wanted.size();
  };
  std::string stages;
  for (const std::string& s : recorder->stages) stages += s + " ";
  INFO("stages: " << stages);
  REQUIRE(contains_in_order(forward_stages));
  REQUIRE(contains_in_order(backward_stages));
  // Softmax and GELU reach the backend decomposed: exp and erf, no fused op.
  REQUIRE(recorder->backend_ops.count("forward") == 1);
  REQUIRE(recorder->backend_ops.count("backward") == 1);
  REQUIRE_FALSE(recorder->has_op_prefix("forward", "aten::_softmax"));
  REQUIRE_FALSE(recorder->has_op_prefix("forward", "aten::gelu"));
  REQUIRE(recorder->has_op_prefix("forward", "aten::exp"));
  REQUIRE(recorder->has_op_prefix("forward", "aten::erf"));
  REQUIRE_FALSE(recorder->has_op_prefix("backward", "aten::_softmax_backward_data"));
  REQUIRE_FALSE(recorder->has_op_prefix("backward", "aten::gelu_backward"));
}

TEST_CASE("compile_fx: callables with equal options share compiled graphs, other options do not", "[compile_fx_aot]") {
  at::manual_seed(5);
  // A function no other test compiles, so the first compilation misses.
  const auto fn = [](const Tensors& in) { return Tensors{(in[0].tanh() * 3 - in[0]).cos()}; };
  const at::Tensor x = at::randn({3, 11});
  const at::Tensor expected = fn({x})[0];
  auto outcome = [&](const inductor::InductorOptions& o) {
    auto compiled = inductor::compile_fx(fn, {x}, o);
    REQUIRE_CLOSE(compiled({x})[0], expected, kPointwiseRtol, kPointwiseAtol);
    return last_record("inference").graph_cache;
  };
  inductor::InductorOptions other = options();
  other.threads = 1;
  CHECK(outcome(options()) == "miss");
  CHECK(outcome(options()) == "hit");
  CHECK(outcome(other) == "miss");
  CHECK(outcome(other) == "hit");
}

TEST_CASE("compile_fx: a new compilation reads the traced graph kept in the cache directory", "[compile_fx_aot]") {
  // Note [AOT trace cache]: the first compile_fx runs the function twice,
  // on meta tensors (TraceMode::Auto: the metadata analysis, the joint
  // trace); the second (as a new process would, here with the in-memory
  // graph cache also hit) once, for the analysis, and not again for the
  // trace.
  at::manual_seed(9);
  inductor::InductorOptions o;
  o.cache_dir = crucible::testing::temp_dir("crucible-compile-fx-trace-cache");
  auto calls = std::make_shared<int>(0);
  const tracer::TensorFn fn = [calls](const Tensors& in) {
    ++*calls;
    return gelu_softmax(in);
  };
  const Tensors data{at::randn({4, 5}), at::randn({6, 5}), at::randn({6})};
  const int64_t hits = runtime::default_counters().get("aot_autograd", "trace_cache_hit");
  for (int compile = 0; compile < 2; ++compile) {
    *calls = 0;
    const Tensors c_in = leaves(data, {true, true, true}), e_in = leaves(data, {true, true, true});
    auto compiled = inductor::compile_fx(fn, c_in, o);
    CHECK(*calls == (compile == 0 ? 2 : 1));
    const Tensors c_out = compiled(c_in);
    const Tensors e_out = gelu_softmax(e_in);
    REQUIRE_CLOSE(c_out[1].detach(), e_out[1].detach(), kReductionRtol, kReductionAtol);
    c_out[1].backward();
    e_out[1].backward();
    for (size_t i = 0; i < 3; ++i) REQUIRE_CLOSE(c_in[i].grad(), e_in[i].grad(), kReductionRtol, kReductionAtol);
  }
  CHECK(runtime::default_counters().get("aot_autograd", "trace_cache_hit") == hits + 1);
}

TEST_CASE("compile_fx: errors come at compile_fx, before anything runs", "[compile_fx_aot]") {
  // Shapes that do not multiply: fn fails while traced.
  const auto bad = [](const Tensors& in) { return Tensors{at::mm(in[0], in[1])}; };
  REQUIRE_THROWS_AS(inductor::compile_fx(bad, {at::randn({2, 3}), at::randn({4, 5})}, options()), autograd::AotError);
  REQUIRE_THROWS_AS(inductor::compile_fx(
                        std::shared_ptr<torch::nn::Module>(), [](torch::nn::Module&, const Tensors& in) { return in; },
                        {at::randn({2})}, options()),
                    autograd::AotError);
}

// Ops beyond the zoo's (sorting, scans, indexing with integer tensors,
// scatter and index_put with accumulation, padding modes, the activations
// of torch::nn, norms, pooling with padding and dilation, interpolation),
// one function with an output per op: values and the input's gradient equal
// eager's in float64 (rtol 1e-9: reductions sum in another order, nothing
// more).
TEST_CASE("compile_fx: values and gradients of ops beyond the zoo's equal eager's", "[compile_fx_aot]") {
  using F = std::function<at::Tensor(const at::Tensor&)>;
  std::vector<std::pair<std::string, F>> fs = {
      {"sort", [](const at::Tensor& x) { return std::get<0>(at::sort(x, 1)); }},
      {"topk", [](const at::Tensor& x) { return std::get<0>(at::topk(x, 3, 1)); }},
      {"argmax", [](const at::Tensor& x) { return x * at::argmax(x, 1, true).to(x.scalar_type()); }},
      {"cumprod", [](const at::Tensor& x) { return at::cumprod(x, 1); }},
      {"logcumsumexp", [](const at::Tensor& x) { return at::logcumsumexp(x, 1); }},
      {"flip", [](const at::Tensor& x) { return at::flip(x, {1}) * x; }},
      {"roll", [](const at::Tensor& x) { return at::roll(x, {2}, {1}) * x; }},
      {"repeat",
       [](const at::Tensor& x) {
         return x.repeat({2, 3});
       }},
      {"tril", [](const at::Tensor& x) { return at::tril(x) + at::triu(x, 1) * 2; }},
      {"reflect",
       [](const at::Tensor& x) {
         return at::pad(x.unsqueeze(0), {2, 2}, "reflect");
       }},
      {"replicate",
       [](const at::Tensor& x) {
         return at::pad(x.unsqueeze(0), {2, 2}, "replicate");
       }},
      {"index_select",
       [](const at::Tensor& x) {
         return at::index_select(x, 1, torch::tensor({0, 2, 2, 5}, torch::kLong));
       }},
      {"gather",
       [](const at::Tensor& x) {
         return at::gather(x, 1, torch::tensor({{0, 1}, {2, 3}, {4, 5}, {5, 5}}, torch::kLong));
       }},
      {"scatter_add",
       [](const at::Tensor& x) {
         return at::zeros({4, 3}, x.options())
             .scatter_add(1, torch::tensor({{0, 1, 2, 0, 1, 2}}, torch::kLong).expand({4, 6}), x);
       }},
      {"index_put",
       [](const at::Tensor& x) {
         return at::zeros({6, 6}, x.options()).index_put({torch::tensor({0, 2, 2, 5}, torch::kLong)}, x, true);
       }},
      {"indexing",
       [](const at::Tensor& x) {
         return x.index({torch::tensor({3, 1}, torch::kLong), at::indexing::Slice(1, 5)});
       }},
      {"remainder", [](const at::Tensor& x) { return at::remainder(x * 3, 0.7) + at::fmod(x * 3, 0.7); }},
      {"atan2", [](const at::Tensor& x) { return at::atan2(x, x.flip(1) + 0.1); }},
      {"lerp", [](const at::Tensor& x) { return at::lerp(x, x * x, 0.3); }},
      {"clamp_t", [](const at::Tensor& x) { return at::clamp(x, -x.abs().mean(), x.abs().mean()); }},
      {"hardtanh", [](const at::Tensor& x) { return at::hardtanh(x, -0.5, 0.5) + at::elu(x) + at::selu(x); }},
      {"mish", [](const at::Tensor& x) { return at::mish(x) + at::hardswish(x) + at::hardsigmoid(x); }},
      {"celu", [](const at::Tensor& x) { return at::celu(x) + at::log_sigmoid(x) + x / (1 + x.abs()); }},
      {"logit", [](const at::Tensor& x) { return at::logit(at::sigmoid(x)) + at::log1p(x.abs()) + at::expm1(x); }},
      {"rsqrt", [](const at::Tensor& x) { return at::rsqrt(x.abs() + 1) + at::sinh(x) + at::asin(x.tanh() * 0.9); }},
      {"norm", [](const at::Tensor& x) { return at::linalg_vector_norm(x, 2, {1}) + at::norm(x, 1); }},
      {"std", [](const at::Tensor& x) { return at::std(x, {1}) + at::var(x, {0}, false).sum(); }},
      {"prod", [](const at::Tensor& x) { return at::prod(x, 1); }},
      {"maxdim", [](const at::Tensor& x) { return std::get<0>(at::max(x, 1)) + std::get<0>(at::min(x, 1)); }},
      {"median", [](const at::Tensor& x) { return std::get<0>(at::median(x, 1)); }},
      {"diag", [](const at::Tensor& x) { return at::diag(x.narrow(1, 0, 4)) + at::trace(x.narrow(1, 0, 4)); }},
      {"outer", [](const at::Tensor& x) { return at::outer(x[0], x[1]); }},
      {"unfold", [](const at::Tensor& x) { return x.unfold(1, 3, 1) * 2; }},
      {"split",
       [](const at::Tensor& x) {
         auto p = x.split_with_sizes({2, 4}, 1);
         return p[0].sum(1) * p[1].sum(1);
       }},
      {"unbind",
       [](const at::Tensor& x) {
         auto p = x.unbind(0);
         return at::stack({p[3], p[0]}, 1);
       }},
      {"diff", [](const at::Tensor& x) { return at::diff(x, 1, 1); }},
      {"cos_sim",
       [](const at::Tensor& x) {
         return at::cosine_similarity(x, x.flip(0), 1) + at::pairwise_distance(x, x.flip(0));
       }},
      {"glu", [](const at::Tensor& x) { return at::glu(x, 1) + at::softmax(-x, 1).narrow(1, 0, 3); }},
      {"cdist", [](const at::Tensor& x) { return at::cdist(x, x.flip(0) + 0.5); }},
      {"expand_inplace",
       [](const at::Tensor& x) {
         auto y = x.clone();
         y.narrow(1, 0, 2).copy_(x.narrow(1, 4, 2));
         return y;
       }},
      {"masked_scatter", [](const at::Tensor& x) { return x.masked_fill(x > 0.5, 0.5) + at::where(x < 0, x * x, x); }},
      {"sign", [](const at::Tensor& x) { return at::sign(x) * x + at::floor(x) + at::round(x * 2) + at::trunc(x); }},
      {"pow", [](const at::Tensor& x) { return at::pow(x.abs() + 0.5, x) + at::pow(2.0, x) + at::pow(x, 3); }},
      {"logsumexp0",
       [](const at::Tensor& x) {
         return at::logsumexp(x, std::vector<int64_t>{0, 1});
       }},
      {"amax", [](const at::Tensor& x) { return at::amax(x, {0}) - at::amin(x, {1}).sum(); }},
      {"nan_to_num", [](const at::Tensor& x) { return at::nan_to_num(at::log(x)); }},
      {"bilinear",
       [](const at::Tensor& x) {
         return at::upsample_bilinear2d(x.view({1, 1, 4, 6}), {7, 9}, true);
       }},
      {"nearest",
       [](const at::Tensor& x) {
         return at::upsample_nearest2d(x.view({1, 1, 4, 6}), {7, 9});
       }},
      {"avgpool_pad",
       [](const at::Tensor& x) {
         return at::avg_pool2d(x.view({1, 1, 4, 6}), 3, 2, 1, true, false);
       }},
      {"ctc_loss",  // lengths given as ints: a static shape, though the op is tagged dynamic
       [](const at::Tensor& x) {
         return at::ctc_loss(at::log_softmax(x.view({4, 2, 3}), 2), torch::tensor({{1, 2}, {2, 0}}, torch::kLong),
                             std::vector<int64_t>{4, 3}, std::vector<int64_t>{2, 1}, 0, at::Reduction::None);
       }},
      {"maxpool_dil",
       [](const at::Tensor& x) {
         return at::max_pool2d(x.view({1, 1, 4, 6}), 2, 1, 0, 2);
       }},
  };
  auto f = [&fs](const Tensors& in) {
    Tensors out;
    for (const auto& op : fs) out.push_back(op.second(in[0]));
    return out;
  };
  at::manual_seed(3);
  const at::Tensor x = at::randn({4, 6}, at::kDouble);
  auto compiled = inductor::compile_fx(f, {x.clone().requires_grad_()}, options());
  at::Tensor xc = x.clone().requires_grad_(), xe = x.clone().requires_grad_();
  const Tensors oc = compiled({xc}), oe = f({xe});
  REQUIRE(oc.size() == fs.size());
  at::Tensor lc = at::zeros({}, at::kDouble), le = at::zeros({}, at::kDouble);
  for (size_t o = 0; o < fs.size(); ++o) {
    INFO(fs[o].first);
    REQUIRE_CLOSE(oc[o], oe[o], 1e-9, 1e-11);
    if (!oe[o].requires_grad()) continue;
    const at::Tensor w = at::randn(oe[o].sizes(), at::kDouble);
    lc = lc + (oc[o] * w).sum();
    le = le + (oe[o] * w).sum();
  }
  lc.backward();
  le.backward();
  REQUIRE_CLOSE(xc.grad(), xe.grad(), 1e-9, 1e-11);
}

// The scenarios of AOTAutograd's notes through compile_fx: an input mutated
// beside one that requires grad (the backward graph then has fewer
// placeholders than the gradient's primal index), outputs that alias an
// input, an input returned as is, a metadata mutation, writes through a view
// of an input and of an intermediate, random ops, a mutated input returned
// as a view. Outputs (values, view-ness, strides), inputs after the call and
// gradients equal eager's in float64.
TEST_CASE("compile_fx: mutations, aliasing outputs and random ops as AOTAutograd's notes list them",
          "[compile_fx_aot]") {
  struct Case {
    std::string name;
    std::function<Tensors(const Tensors&)> fn;
    std::function<Tensors()> inputs;  // fresh inputs
    std::vector<bool> grad;
  };
  auto r = [](std::vector<int64_t> s) { return at::randn(s, at::kDouble); };
  std::vector<Case> cases = {
      {"mutate input",
       [](const Tensors& in) {
         in[0].add_(in[1]);
         return Tensors{in[0] * 2};
       },
       [&] {
         return Tensors{r({3, 4}), r({3, 4})};
       },
       {false, true}},
      {"alias outputs",
       [](const Tensors& in) {
         return Tensors{in[0].view(-1), in[0].t(), in[0] * 3};
       },
       [&] {
         return Tensors{r({3, 4})};
       },
       {true}},
      {"return input",
       [](const Tensors& in) {
         return Tensors{in[0], in[1] + 1};
       },
       [&] {
         return Tensors{r({3}), r({3})};
       },
       {true, true}},
      {"metadata mut",
       [](const Tensors& in) {
         in[0].t_();
         return Tensors{in[0] + 1};
       },
       [&] {
         return Tensors{r({3, 4})};
       },
       {false}},
      {"mutate view",
       [](const Tensors& in) {
         in[0].narrow(0, 1, 2).mul_(3);
         return Tensors{in[0].sum(0)};
       },
       [&] {
         return Tensors{r({4, 4})};
       },
       {false}},
      {"mutate nonleaf view",
       [](const Tensors& in) {
         auto h = in[0] * 1;
         h.narrow(0, 1, 2).mul_(in[1]);
         return Tensors{h.sum()};
       },
       [&] {
         return Tensors{r({4, 4}), r({2, 4})};
       },
       {true, true}},
      {"rng",
       [](const Tensors& in) { return Tensors{at::dropout(in[0], 0.5, true) + at::rand_like(in[0])}; },
       [&] {
         return Tensors{r({5, 5})};
       },
       {true}},
      {"mutate and alias out",
       [](const Tensors& in) {
         in[0].mul_(2);
         return Tensors{in[0].view({-1})};
       },
       [&] {
         return Tensors{r({3, 4})};
       },
       {false}},
      // Batch norm in training writes the running statistics its schema
      // does not mark as written: inputs of the function, and tensors it makes.
      {"batch norm statistics as inputs",
       [](const Tensors& in) {
         const at::Tensor y = at::batch_norm(in[0], in[1], {}, in[2], in[3], true, 0.3, 1e-5, false);
         return Tensors{y, in[2] * 2};
       },
       [&] {
         return Tensors{r({4, 3, 5}), r({3}), r({3}), r({3}).abs()};
       },
       {true, true, false, false}},
      {"batch norm statistics made inside",
       [](const Tensors& in) {
         const at::Tensor mean = at::zeros({3}, in[0].options()), var = at::ones({3}, in[0].options());
         const at::Tensor y = at::batch_norm(in[0], {}, {}, mean, var, true, 0.3, 1e-5, false);
         return Tensors{y, mean + var};
       },
       [&] {
         return Tensors{r({4, 3})};
       },
       {true}},
  };
  for (auto& c : cases) {
    INFO(c.name);
    at::manual_seed(1);
    const Tensors base = c.inputs();
    auto compiled = inductor::compile_fx(c.fn, leaves(base, c.grad), options());
    Tensors ic = leaves(base, c.grad), ie = leaves(base, c.grad);
    at::manual_seed(7);
    const Tensors oc = compiled(ic);
    at::manual_seed(7);
    const Tensors oe = c.fn(ie);
    REQUIRE(oc.size() == oe.size());
    at::Tensor lc = at::zeros({}, at::kDouble), le = at::zeros({}, at::kDouble);
    for (size_t i = 0; i < oe.size(); ++i) {
      INFO("output " << i);
      REQUIRE_CLOSE(oc[i].detach(), oe[i].detach(), 1e-9, 1e-11);
      REQUIRE(oc[i].is_view() == oe[i].is_view());
      REQUIRE(oc[i].strides() == oe[i].strides());
      if (!oe[i].requires_grad()) continue;
      lc = lc + (oc[i] * static_cast<double>(i + 1)).sum();
      le = le + (oe[i] * static_cast<double>(i + 1)).sum();
    }
    for (size_t i = 0; i < ie.size(); ++i) {
      INFO("input " << i);
      REQUIRE_CLOSE(ic[i].detach(), ie[i].detach(), 1e-9, 1e-11);
    }
    if (!le.requires_grad()) continue;
    lc.backward();
    le.backward();
    for (size_t i = 0; i < ie.size(); ++i) {
      INFO("gradient of input " << i);
      if (c.grad[i]) REQUIRE_CLOSE(ic[i].grad(), ie[i].grad(), 1e-9, 1e-11);
    }
  }
}
