// aot_function against eager LibTorch: outputs and gradients through
// loss.backward() and torch::autograd::grad, the inference path, and
// recompilation on new shapes.
#include <crucible/autograd/aot_function.h>
#include <crucible/autograd/error.h>
#include <crucible/runtime/instruments.h>
#include <crucible/runtime/metrics.h>
#include <crucible/runtime/timing.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "catch.h"
#include "testing.h"

using crucible::testing::kGradAtol;
using crucible::testing::kGradRtol;
using namespace crucible;

namespace {

std::vector<at::Tensor> mlp_fn(const std::vector<at::Tensor>& in) {
  const auto& x = in[0];
  const auto& w = in[1];
  const auto& b = in[2];
  const auto h = at::relu(at::addmm(b, x, w.t()));
  return {h, h.sum()};
}

std::vector<at::Tensor> leaves(const std::vector<at::Tensor>& ts, std::vector<bool> requires_grad) {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < ts.size(); ++i) out.push_back(ts[i].detach().clone().requires_grad_(requires_grad[i]));
  return out;
}

}  // namespace

TEST_CASE("aot_function: values and loss.backward() gradients equal eager", "[autograd]") {
  at::manual_seed(0);
  const std::vector<at::Tensor> data{at::randn({4, 3}), at::randn({5, 3}), at::randn({5})};
  auto compiled = autograd::aot_function(mlp_fn);
  // x does not require grad: no gradient is computed for it, as in eager.
  const auto c_in = leaves(data, {false, true, true});
  const auto e_in = leaves(data, {false, true, true});
  const auto c_out = compiled(c_in);
  const auto e_out = mlp_fn(e_in);
  REQUIRE(c_out.size() == 2);
  // The interpreter runs the kernels eager runs, in the same order: bitwise.
  REQUIRE_EQUAL_TENSORS(c_out[0], e_out[0].detach());
  REQUIRE_EQUAL_TENSORS(c_out[1], e_out[1].detach());
  REQUIRE(c_out[1].requires_grad());
  // Backward through both outputs, the way a user writes it.
  (c_out[1] * 2 + c_out[0].mean()).backward();
  (e_out[1] * 2 + e_out[0].mean()).backward();
  REQUIRE_FALSE(c_in[0].grad().defined());
  // The traced backward runs the engine's kernels; summation order may
  // differ where the engine accumulates the two outputs' gradients.
  REQUIRE_CLOSE(c_in[1].grad(), e_in[1].grad(), kGradRtol, kGradAtol);
  REQUIRE_CLOSE(c_in[2].grad(), e_in[2].grad(), kGradRtol, kGradAtol);
  REQUIRE(compiled.num_compilations() == 1);
}

TEST_CASE("aot_function: torch::autograd::grad and retain_graph behave as eager", "[autograd]") {
  at::manual_seed(1);
  const std::vector<at::Tensor> data{at::randn({2, 3}), at::randn({4, 3}), at::randn({4})};
  auto compiled = autograd::aot_function(mlp_fn);
  const auto c_in = leaves(data, {true, true, true});
  const auto e_in = leaves(data, {true, true, true});
  const auto c_loss = compiled(c_in)[1];
  const auto e_loss = mlp_fn(e_in)[1];
  const auto cg = torch::autograd::grad({c_loss}, c_in, {}, /*retain_graph=*/true);
  const auto eg = torch::autograd::grad({e_loss}, e_in, {}, /*retain_graph=*/true);
  for (size_t i = 0; i < 3; ++i) REQUIRE_CLOSE(cg[i], eg[i], kGradRtol, kGradAtol);
  // A second backward works with retain_graph, and a third one without it
  // fails because the saved values were freed by the second, as in eager.
  const auto cg2 = torch::autograd::grad({c_loss}, c_in);
  for (size_t i = 0; i < 3; ++i) REQUIRE_CLOSE(cg2[i], eg[i], kGradRtol, kGradAtol);
  REQUIRE_THROWS(torch::autograd::grad({c_loss}, c_in));
}

TEST_CASE("aot_function: the inference path runs when nothing needs a gradient", "[autograd]") {
  at::manual_seed(2);
  const std::vector<at::Tensor> data{at::randn({3, 3}), at::randn({2, 3}), at::randn({2})};
  auto compiled = autograd::aot_function(mlp_fn);
  const auto out = compiled(data);
  const auto ref = mlp_fn(data);
  REQUIRE_EQUAL_TENSORS(out[0], ref[0]);
  REQUIRE_EQUAL_TENSORS(out[1], ref[1]);
  REQUIRE_FALSE(out[0].requires_grad());
  // Grad mode off with inputs that require grad: inference too.
  const auto in = leaves(data, {true, true, true});
  at::NoGradGuard no_grad;
  const auto out2 = compiled(in);
  REQUIRE_FALSE(out2[1].requires_grad());
  REQUIRE_EQUAL_TENSORS(out2[1], ref[1]);
}

TEST_CASE("aot_function: a new input shape recompiles; recompile_limit stops it", "[autograd]") {
  at::manual_seed(3);
  autograd::AotConfig config;
  config.recompile_limit = 2;
  auto compiled = autograd::aot_function(mlp_fn, config);
  const auto w = at::randn({5, 3}).requires_grad_(), b = at::randn({5}).requires_grad_();
  for (int64_t rows : {4, 4, 7}) {
    const auto x = at::randn({rows, 3});
    const auto out = compiled({x, w, b});
    REQUIRE_EQUAL_TENSORS(out[0], mlp_fn({x, w, b})[0].detach());
  }
  REQUIRE(compiled.num_compilations() == 2);
  REQUIRE_THROWS_WITH(compiled({at::randn({9, 3}), w, b}), CRUCIBLE_HAS_SUBSTR("recompile_limit is reached"));
}

TEST_CASE("aot_function: dtype, requires_grad, grad mode and aliasing changes each recompile, with the reason",
          "[autograd]") {
  at::manual_seed(3);
  runtime::default_metrics_log().clear();
  auto f = [](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{(in[0] * in[1]).sum(0)}; };
  auto compiled = autograd::aot_function(f);
  const auto x = at::randn({4, 3}), y = at::randn({4, 3});
  auto check = [&](const std::vector<at::Tensor>& in, size_t compilations, const std::string& reason) {
    const auto out = compiled(in)[0];
    REQUIRE_EQUAL_TENSORS(out.detach(), f(in)[0].detach());
    REQUIRE(compiled.num_compilations() == compilations);
    if (!reason.empty()) {
      const auto records = runtime::default_metrics_log().records();
      INFO(records.back().recompile_reason);
      REQUIRE(records.back().recompile_reason.find(reason) != std::string::npos);
    }
  };
  // The reason is the first failing guard of the closest compilation.
  check({x, y}, 1, "first call");
  check({x.clone(), y.clone()}, 1, "");  // same metadata: cached
  check({x.to(at::kDouble), y.to(at::kDouble)}, 2, "input 0: dtype Double (compiled for Float)");
  check({x, y.clone().requires_grad_()}, 3, "input 1: requires_grad true (compiled for false)");
  {
    at::NoGradGuard no_grad;
    check({x, y.clone().requires_grad_()}, 4, "grad mode off (compiled with it on)");
  }
  check({x, x}, 5, "input 0: shares storage with other inputs differently");
  check({x.t().contiguous().t(), y}, 6, "input 0: strides [1, 4] (compiled for [3, 1])");
  // Slices of one buffer at another offset share a compilation (unaliased
  // offsets are not guarded).
  const auto buffer = at::randn({8, 3});
  check({buffer.slice(0, 0, 4), y}, 6, "");
  check({buffer.slice(0, 4, 8), y}, 6, "");
}

TEST_CASE("aot_function: compilations are timed and recorded in the metrics log", "[autograd]") {
  runtime::default_metrics_log().clear();
  runtime::default_phase_timer().clear();
  auto compiled = autograd::aot_function(mlp_fn);
  const auto x = at::randn({2, 3}), w = at::randn({4, 3}).requires_grad_(), b = at::randn({4});
  compiled({x, w, b})[1].backward();
  compiled({x, w, b})[1].backward();  // cached: no new record
  const auto records = runtime::default_metrics_log().records();
  REQUIRE(records.size() == 2);
  REQUIRE(records[0].kind == "forward");
  REQUIRE(records[0].recompile_reason == "first call");
  REQUIRE(records[1].kind == "backward");
  REQUIRE(records[0].compile_id == records[1].compile_id);
  // The forward graph takes the 3 primals; the backward takes saved values and one tangent per output.
  REQUIRE(records[0].graph_input_count == 3);
  REQUIRE(records[1].graph_op_count > 0);
  const std::string report = runtime::default_phase_timer().report();
  for (const char* phase : {"compile", "collect_metadata", "trace_joint", "partition", "fw_compiler", "bw_compiler"})
    REQUIRE(report.find(phase) != std::string::npos);
}

TEST_CASE("aot_function: instruments of the caller's replace the process-wide ones", "[autograd]") {
  runtime::default_metrics_log().clear();
  runtime::default_counters().clear();
  runtime::MetricsLog log;
  runtime::Counters counters;
  autograd::AotConfig config;
  config.instruments = {std::make_shared<runtime::MetricsRecorder>(log),
                        std::make_shared<runtime::CounterRecorder>(counters)};
  auto compiled = autograd::aot_function(mlp_fn, config);
  const auto x = at::randn({2, 3}), w = at::randn({4, 3}).requires_grad_(), b = at::randn({4});
  const auto out = compiled({x, w, b});
  REQUIRE_EQUAL_TENSORS(out[1].detach(), mlp_fn({x, w, b})[1].detach());
  out[1].backward();
  CHECK(log.records().size() == 2);  // forward, backward
  CHECK(counters.get("graphs", "forward") == 1);
  CHECK(counters.get("graphs", "backward") == 1);
  CHECK(counters.get("stats", "compilations") == 2);  // the first call, the first backward
  CHECK(runtime::default_metrics_log().records().empty());
  // The process-wide counters hold only the outcomes AOTAutograd counts
  // there itself (counters["aot_autograd"], as torch's: caches, trace modes).
  for (const auto& [group, keys] : runtime::default_counters().snapshot()) CHECK(group == "aot_autograd");
}

TEST_CASE("aot_function: a non-contiguous incoming gradient gives eager's gradients", "[autograd]") {
  at::manual_seed(10);
  const std::vector<at::Tensor> data{at::randn({4, 3}), at::randn({5, 3}), at::randn({5})};
  auto compiled = autograd::aot_function(mlp_fn);
  const auto c_in = leaves(data, {true, true, true});
  const auto e_in = leaves(data, {true, true, true});
  const auto grad = at::randn({5, 4}).t();  // [4, 5], strides (1, 4)
  REQUIRE_FALSE(grad.is_contiguous());
  compiled(c_in)[0].backward(grad);
  mlp_fn(e_in)[0].backward(grad);
  // The compiled backward takes a contiguous copy (Note [AOT dispatch]);
  // eager's kernels read the strided one: same values, maybe other rounding.
  for (size_t i = 0; i < 3; ++i) REQUIRE_CLOSE(c_in[i].grad(), e_in[i].grad(), kGradRtol, kGradAtol);
}

TEST_CASE("aot_function: a saved input, or a saved view of one, written before the backward fails it as in eager",
          "[autograd]") {
  auto f = [](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{(in[0] * in[1]).sum() + (in[0].t() * in[2]).sum()};
  };
  auto compiled = autograd::aot_function(f);
  at::manual_seed(11);
  const auto x = at::randn({2, 3}), w = at::randn({2, 3}).requires_grad_(), v = at::randn({3, 2}).requires_grad_();
  for (bool write : {false, true}) {
    const auto cx = x.clone(), ex = x.clone();
    const auto c = compiled({cx, w, v})[0];
    const auto e = f({ex, w, v})[0];
    REQUIRE_EQUAL_TENSORS(c.detach(), e.detach());
    if (!write) {
      REQUIRE_NOTHROW(c.backward());
      REQUIRE_NOTHROW(e.backward());
      continue;
    }
    // x is saved for the gradients of w (itself) and of v (its transpose, a view).
    cx.add_(1);
    ex.add_(1);
    REQUIRE_THROWS_WITH(e.backward(), CRUCIBLE_HAS_SUBSTR("modified by an inplace operation"));
    REQUIRE_THROWS_WITH(c.backward(), CRUCIBLE_HAS_SUBSTR("modified by an inplace operation"));
  }
}

TEST_CASE("aot_function: an undefined input is refused by index before anything runs", "[autograd][errors]") {
  auto compiled =
      autograd::aot_function([](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{in[0] + 1}; });
  REQUIRE_THROWS_WITH(compiled({at::randn({2}), at::Tensor()}), CRUCIBLE_HAS_SUBSTR("input 1 is an undefined tensor"));
  REQUIRE(compiled.num_compilations() == 0);
}

// Note [Auto trace mode]: counters["aot_autograd"] say which mode each trace
// (the metadata analysis, the joint graph) ran in, and that a fake one was
// abandoned.
TEST_CASE("aot_function: the counters tell fake-mode traces from real ones that followed a failed fake one",
          "[autograd]") {
  auto counted = [](std::string_view key) { return runtime::default_counters().get("aot_autograd", key); };
  at::manual_seed(1);
  const std::vector<at::Tensor> data{at::randn({4, 3}), at::randn({5, 3}), at::randn({5})};
  const int64_t fake = counted("trace_fake"), real = counted("trace_real"),
                after_fake = counted("trace_real_after_fake");
  const auto out = autograd::aot_function(mlp_fn)(leaves(data, {false, true, true}));
  REQUIRE_EQUAL_TENSORS(out[0], mlp_fn(data)[0]);
  CHECK(counted("trace_fake") == fake + 2);
  CHECK(counted("trace_real") == real);
  // at::equal of two tensors of the same sizes reads their values: real mode.
  auto branches = [](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{at::equal(in[0], in[1]) ? in[0] * 2.0 : in[0] - in[1]};
  };
  const std::vector<at::Tensor> same{at::ones({3}).requires_grad_(), at::ones({3})};
  REQUIRE_EQUAL_TENSORS(autograd::aot_function(branches)(same)[0], branches(same)[0]);
  CHECK(counted("trace_real_after_fake") == after_fake + 2);
  CHECK(counted("trace_real") == real);
}
