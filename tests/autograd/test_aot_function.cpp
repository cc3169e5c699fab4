// aot_function against eager LibTorch: outputs and gradients through
// loss.backward() and torch::autograd::grad, the inference path, and
// recompilation on new shapes.
#include <crucible/autograd/aot_function.h>
#include <crucible/autograd/error.h>
#include <crucible/runtime/metrics.h>
#include <crucible/runtime/timing.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "catch.h"
#include "testing.h"

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
  REQUIRE_CLOSE(c_in[1].grad(), e_in[1].grad(), 1e-6, 1e-6);
  REQUIRE_CLOSE(c_in[2].grad(), e_in[2].grad(), 1e-6, 1e-6);
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
  for (size_t i = 0; i < 3; ++i) REQUIRE_CLOSE(cg[i], eg[i], 1e-6, 1e-6);
  // A second backward works with retain_graph, and a third one without it
  // fails because the saved values were freed by the second, as in eager.
  const auto cg2 = torch::autograd::grad({c_loss}, c_in);
  for (size_t i = 0; i < 3; ++i) REQUIRE_CLOSE(cg2[i], eg[i], 1e-6, 1e-6);
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

TEST_CASE("aot_function: 20 SGD steps of a two-layer MLP end where eager ends", "[autograd]") {
  at::manual_seed(4);
  // A two-layer MLP over its parameters: inputs are w1, b1, w2, b2, x, y.
  auto mlp_loss = [](const std::vector<at::Tensor>& in) {
    const auto h = at::relu(at::addmm(in[1], in[4], in[0].t()));
    const auto logits = at::addmm(in[3], h, in[2].t());
    return std::vector<at::Tensor>{at::mse_loss(logits, in[5])};
  };
  std::vector<at::Tensor> init{at::randn({16, 8}) * 0.3, at::zeros({16}), at::randn({4, 16}) * 0.3, at::zeros({4})};
  std::vector<at::Tensor> eager_p, aot_p;
  for (const auto& p : init) {
    eager_p.push_back(p.clone().requires_grad_());
    aot_p.push_back(p.clone().requires_grad_());
  }
  auto compiled = autograd::aot_function(mlp_loss);
  const double lr = 0.1;
  at::Tensor eager_loss, aot_loss;
  for (int step = 0; step < 20; ++step) {
    const auto x = at::randn({32, 8}), y = at::randn({32, 4});
    std::vector<at::Tensor> e_in = eager_p, c_in = aot_p;
    e_in.insert(e_in.end(), {x, y});
    c_in.insert(c_in.end(), {x, y});
    eager_loss = mlp_loss(e_in)[0];
    aot_loss = compiled(c_in)[0];
    eager_loss.backward();
    aot_loss.backward();
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < eager_p.size(); ++i) {
      eager_p[i].sub_(eager_p[i].grad() * lr);
      aot_p[i].sub_(aot_p[i].grad() * lr);
      eager_p[i].mutable_grad().zero_();
      aot_p[i].mutable_grad().zero_();
    }
  }
  REQUIRE(compiled.num_compilations() == 1);
  // Forward kernels are eager's; backward ones too, but gradient
  // accumulation order may differ, and 20 steps compound float rounding:
  // 1e-5 relative is a few hundred float32 ulps.
  REQUIRE_CLOSE(aot_loss.detach(), eager_loss.detach(), 1e-5, 1e-6);
  for (size_t i = 0; i < eager_p.size(); ++i) REQUIRE_CLOSE(aot_p[i].detach(), eager_p[i].detach(), 1e-5, 1e-6);
}

TEST_CASE("aot_function: f(x, x) gives the gradient of two uses of one leaf", "[autograd]") {
  at::manual_seed(5);
  auto f = [](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{(in[0] * in[1].sin()).sum()}; };
  auto compiled = autograd::aot_function(f);
  const auto data = at::randn({6});
  const auto cx = data.clone().requires_grad_(), ex = data.clone().requires_grad_();
  const auto c_out = compiled({cx, cx});
  const auto e_out = f({ex, ex});
  REQUIRE_EQUAL_TENSORS(c_out[0], e_out[0].detach());
  c_out[0].backward();
  e_out[0].backward();
  // d/dx sum(x sin x) = sin x + x cos x: two gradients accumulated into one
  // leaf, in an order the engine picks; allow rounding.
  REQUIRE_CLOSE(cx.grad(), ex.grad(), 1e-6, 1e-6);
  REQUIRE_CLOSE(cx.grad(), data.sin() + data * data.cos(), 1e-6, 1e-6);
}

TEST_CASE("aot_function: outputs aliasing an input and an intermediate carry eager's values and gradients",
          "[autograd]") {
  at::manual_seed(6);
  auto f = [](const std::vector<at::Tensor>& in) {
    const auto h = in[0] * in[1];
    return std::vector<at::Tensor>{in[0].t(), h.view({-1}), h.sum()};
  };
  auto compiled = autograd::aot_function(f);
  const auto x = at::randn({3, 4}), w = at::randn({3, 4});
  const auto cx = x.clone().requires_grad_(), cw = w.clone().requires_grad_();
  const auto ex = x.clone().requires_grad_(), ew = w.clone().requires_grad_();
  const auto c_out = compiled({cx, cw});
  const auto e_out = f({ex, ew});
  for (size_t i = 0; i < 3; ++i) REQUIRE_EQUAL_TENSORS(c_out[i], e_out[i].detach());
  (c_out[0].pow(2).sum() + c_out[1].sin().sum() + c_out[2]).backward();
  (e_out[0].pow(2).sum() + e_out[1].sin().sum() + e_out[2]).backward();
  // Three gradient contributions per input, accumulated in the engine's order.
  REQUIRE_CLOSE(cx.grad(), ex.grad(), 1e-6, 1e-6);
  REQUIRE_CLOSE(cw.grad(), ew.grad(), 1e-6, 1e-6);
}

TEST_CASE("aot_function: 20 SGD steps of a small ConvNet end where eager ends", "[autograd]") {
  at::manual_seed(7);
  // conv(1->4, 3x3, pad 1) -> relu -> max_pool 2x2 -> linear(4*4*4 -> 3) -> cross entropy.
  // Inputs: conv_w, conv_b, fc_w, fc_b, images [8, 1, 8, 8], labels [8].
  auto convnet_loss = [](const std::vector<at::Tensor>& in) {
    const auto c = at::relu(at::conv2d(in[4], in[0], in[1], 1, 1));
    const auto p = at::max_pool2d(c, {2, 2});
    const auto logits = at::linear(p.flatten(1), in[2], in[3]);
    return std::vector<at::Tensor>{at::cross_entropy_loss(logits, in[5])};
  };
  std::vector<at::Tensor> init{at::randn({4, 1, 3, 3}) * 0.3, at::zeros({4}), at::randn({3, 64}) * 0.1,
                               at::zeros({3})};
  std::vector<at::Tensor> eager_p, aot_p;
  for (const auto& p : init) {
    eager_p.push_back(p.clone().requires_grad_());
    aot_p.push_back(p.clone().requires_grad_());
  }
  auto compiled = autograd::aot_function(convnet_loss);
  at::Tensor eager_loss, aot_loss;
  for (int step = 0; step < 20; ++step) {
    const auto images = at::randn({8, 1, 8, 8}), labels = at::randint(0, 3, {8});
    std::vector<at::Tensor> e_in = eager_p, c_in = aot_p;
    e_in.insert(e_in.end(), {images, labels});
    c_in.insert(c_in.end(), {images, labels});
    eager_loss = convnet_loss(e_in)[0];
    aot_loss = compiled(c_in)[0];
    eager_loss.backward();
    aot_loss.backward();
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < eager_p.size(); ++i) {
      eager_p[i].sub_(eager_p[i].grad() * 0.1);
      aot_p[i].sub_(aot_p[i].grad() * 0.1);
      eager_p[i].mutable_grad().zero_();
      aot_p[i].mutable_grad().zero_();
    }
  }
  REQUIRE(compiled.num_compilations() == 1);
  // Same tolerance and reason as the MLP test: accumulation order in the
  // backward, compounded over 20 steps.
  REQUIRE_CLOSE(aot_loss.detach(), eager_loss.detach(), 1e-5, 1e-6);
  for (size_t i = 0; i < eager_p.size(); ++i) REQUIRE_CLOSE(aot_p[i].detach(), eager_p[i].detach(), 1e-5, 1e-6);
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
  for (const char* phase : {"aot_autograd", "trace_joint", "partition", "fw_compiler", "bw_compiler"})
    REQUIRE(report.find(phase) != std::string::npos);
}

TEST_CASE("aot_function: dropout forward and backward equal eager from the same generator state", "[autograd]") {
  auto f = [](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{(at::dropout(in[0], 0.5, /*train=*/true) * in[1]).sum()};
  };
  auto compiled = autograd::aot_function(f);
  const auto data = at::randn({64}), wdata = at::randn({64});
  for (int call = 0; call < 2; ++call) {  // the compiling call and a cached one
    const auto cx = data.clone().requires_grad_(), ex = data.clone().requires_grad_();
    const auto cw = wdata.clone().requires_grad_(), ew = wdata.clone().requires_grad_();
    at::manual_seed(100 + call);
    const auto e_out = f({ex, ew})[0];
    at::manual_seed(100 + call);
    const auto c_out = compiled({cx, cw})[0];
    // Same draws, same kernels: bitwise equal values and gradients.
    REQUIRE_EQUAL_TENSORS(c_out, e_out.detach());
    c_out.backward();
    e_out.backward();
    REQUIRE_EQUAL_TENSORS(cx.grad(), ex.grad());
    REQUIRE_EQUAL_TENSORS(cw.grad(), ew.grad());
  }
  REQUIRE(compiled.num_compilations() == 1);
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
  for (size_t i = 0; i < 3; ++i) REQUIRE_CLOSE(c_in[i].grad(), e_in[i].grad(), 1e-6, 1e-6);
}
