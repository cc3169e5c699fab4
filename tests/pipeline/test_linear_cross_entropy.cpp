// crucible::linear_cross_entropy and the fuse_linear_cross_entropy
// pre-grad pass (ir/fuse_linear_cross_entropy.h), against eager LibTorch's
// linear followed by cross_entropy: the loss and the gradients of the
// input, the weight and the bias, with ignored targets, over many chunks.
// CRUCIBLE_TEST_DEVICE=cuda runs them on the GPU.
#include <crucible/ir/fuse_linear_cross_entropy.h>
#include <crucible/models/zoo.h>
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/train_step.h>
#include <crucible/runtime/autocast.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "catch.h"
#include "testing.h"

using namespace crucible;

namespace {

at::Tensor fused(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b, const at::Tensor& t) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("crucible::linear_cross_entropy", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                               const at::Tensor&, int64_t)>();
  return op.call(x, w, b, t, -100);
}

}  // namespace

TEST_CASE("linear_cross_entropy: loss and gradients equal linear + cross_entropy, over chunks, with ignored targets",
          "[pipeline][linear_cross_entropy]") {
  // N = 600 rows: chunks of 256, 256 and 88.
  at::manual_seed(3);
  const int64_t n = 600, c = 8, v = 256;
  if (testing::compile_only()) CRUCIBLE_SKIP("CUDA asked for and no GPU here");
  const at::Device dev = testing::test_device();
  at::Tensor target = at::randint(0, v, {n}, at::kLong);
  target.index_put_({at::arange(0, n, 5)}, -100);  // every fifth row ignored
  target = target.to(dev);
  const at::Tensor x0 = at::randn({n, c}).to(dev), w0 = (at::randn({v, c}) * 0.3).to(dev),
                   b0 = (at::randn({v}) * 0.1).to(dev);
  for (const bool with_bias : {false, true}) {
    INFO((with_bias ? "with a bias" : "without a bias"));
    const at::Tensor xe = x0.clone().requires_grad_(), we = w0.clone().requires_grad_(),
                     be = b0.clone().requires_grad_();
    const at::Tensor xc = x0.clone().requires_grad_(), wc = w0.clone().requires_grad_(),
                     bc = b0.clone().requires_grad_();
    const at::Tensor eager = at::cross_entropy_loss(at::linear(xe, we, with_bias ? be : at::Tensor()), target);
    const at::Tensor compiled = fused(xc, wc, with_bias ? std::optional(bc) : std::nullopt, target);
    // float32 throughout; the chunks sum the loss and grad_weight in
    // another order than eager's one reduction and one matmul: rounding of
    // a few ulps of the sums.
    REQUIRE_CLOSE(compiled, eager.detach(), 1e-5, 1e-6);
    (compiled * 3.0).backward();
    (eager * 3.0).backward();
    REQUIRE_CLOSE(xc.grad(), xe.grad(), 1e-5, 1e-6);
    REQUIRE_CLOSE(wc.grad(), we.grad(), 1e-5, 1e-6);
    if (with_bias) REQUIRE_CLOSE(bc.grad(), be.grad(), 1e-5, 1e-6);
    // An ignored row gets no gradient.
    REQUIRE(xc.grad()[0].abs().max().item<double>() == 0.0);
  }
}

TEST_CASE("linear_cross_entropy: bf16 logits upcast to float32, as under autocast",
          "[pipeline][linear_cross_entropy]") {
  at::manual_seed(4);
  const int64_t n = 300, c = 16, v = 128;
  if (testing::compile_only()) CRUCIBLE_SKIP("CUDA asked for and no GPU here");
  const at::Device dev = testing::test_device();
  const at::Tensor target = at::randint(0, v, {n}, at::kLong).to(dev);
  const at::Tensor x0 = at::randn({n, c}).to(dev, at::kBFloat16), w0 = (at::randn({v, c}) * 0.3).to(dev, at::kBFloat16);
  const at::Tensor xe = x0.clone().requires_grad_(), we = w0.clone().requires_grad_();
  const at::Tensor xc = x0.clone().requires_grad_(), wc = w0.clone().requires_grad_();
  const at::Tensor eager = at::cross_entropy_loss(at::mm(xe, we.t()).to(at::kFloat), target);
  const at::Tensor compiled = fused(xc, wc, std::nullopt, target);
  REQUIRE(compiled.scalar_type() == at::kFloat);
  // The same bf16 logits and float32 softmax: the loss to float32 rounding.
  REQUIRE_CLOSE(compiled, eager.detach(), 1e-5, 1e-6);
  compiled.backward();
  eager.backward();
  // The logits' gradient is rounded to bf16 before the matmuls, as eager
  // rounds it; grad_weight sums the chunks in float32 where eager's one
  // bf16 matmul rounds its output once: a bf16 ulp (2^-8) of difference.
  REQUIRE_CLOSE(xc.grad().to(at::kFloat), xe.grad().to(at::kFloat), 1e-2, 1e-3);
  REQUIRE_CLOSE(wc.grad().to(at::kFloat), we.grad().to(at::kFloat), 1e-2, 1e-3);
}

TEST_CASE("fuse_linear_cross_entropy: a GPT trains as eager with its head and loss fused, in float32 and bf16",
          "[pipeline][linear_cross_entropy]") {
  if (testing::compile_only()) CRUCIBLE_SKIP("CUDA asked for and no GPU here");
  const models::GptConfig config{.vocab_size = 512, .block_size = 32, .n_layer = 2, .n_head = 2, .n_embd = 32};
  const at::Device dev = testing::test_device();
  for (const bool autocast : {false, true}) {
    INFO((autocast ? "bf16 autocast" : "float32"));
    torch::manual_seed(0);
    models::Model compiled = models::make_gpt(config), eager = models::make_gpt(config);
    models::copy_state(*compiled.module, *eager.module);
    compiled.module->to(dev);
    eager.module->to(dev);
    // The forward and the loss under autocast, as `with torch.autocast()`
    // around both.
    auto loss_fn = [autocast, dev](const models::Model& m) -> pipeline::LossFn {
      return [autocast, dev, loss = models::loss_of(m)](torch::nn::Module& module, const std::vector<at::Tensor>& b) {
        std::optional<runtime::AutocastGuard> on;
        if (autocast) on.emplace(dev.type(), at::kBFloat16);
        return loss(module, b);
      };
    };
    // bf16 trains with SGD: a parameter moves by lr times its gradient, so
    // the comparison bounds the gradients (AdamW's first steps turn a sign
    // flip of a near-zero gradient, which bf16 rounding makes, into 2 lr).
    std::unique_ptr<torch::optim::Optimizer> c_opt, e_opt;
    if (autocast) {
      c_opt = std::make_unique<torch::optim::SGD>(compiled.module->parameters(), torch::optim::SGDOptions(1e-2));
      e_opt = std::make_unique<torch::optim::SGD>(eager.module->parameters(), torch::optim::SGDOptions(1e-2));
    } else {
      c_opt = std::make_unique<torch::optim::AdamW>(compiled.module->parameters(), torch::optim::AdamWOptions(1e-3));
      e_opt = std::make_unique<torch::optim::AdamW>(eager.module->parameters(), torch::optim::AdamWOptions(1e-3));
    }
    pipeline::TrainStep step = pipeline::Builder()
                                   .backend("interpreter")
                                   .pre_grad_passes({"fuse_linear_cross_entropy"})
                                   .compile_train_step(compiled.module, *c_opt, loss_fn(compiled));
    const pipeline::LossFn eager_loss = loss_fn(eager);
    for (uint64_t i = 0; i < 4; ++i) {
      data::Batch b = compiled.example_batch(4, i);
      b.inputs = b.inputs.to(dev);
      b.targets = b.targets.to(dev);
      const at::Tensor c = step({b.inputs, b.targets});
      e_opt->zero_grad();
      const at::Tensor e = eager_loss(*eager.module, {b.inputs, b.targets});
      e.backward();
      e_opt->step();
      // float32: the chunked sums differ from eager's in rounding (see
      // above), and AdamW's first steps normalize gradients: parameters
      // move by lr times values of order 1, so rounding in the gradients
      // shows at ~1e-6. bf16: the same bf16 logits; where eager's log-softmax
      // runs in bf16 (CUDA autocast), each row's log-probability (|log p| <
      // 8 here) is off by up to half a bf16 ulp, 2^-6, and so is the mean.
      if (autocast)
        REQUIRE_CLOSE(c, e.detach(), 0.0, std::ldexp(1.0, -6));
      else
        REQUIRE_CLOSE(c, e.detach(), 1e-5, 1e-6);
    }
    std::string text;
    for (const ir::Node* node : step.graph().nodes()) text += node->target() + "\n";
    CHECK(text.find("crucible::linear_cross_entropy_forward") != std::string::npos);
    CHECK(text.find("aten::_log_softmax\n") == std::string::npos);
    // bf16: gradients within 2^-5 relative of eager's (the logits' gradient
    // from log-probabilities off by up to 2^-6; bf16 rounding elsewhere is
    // smaller), of order 1 here: four SGD steps move the parameters apart
    // by lr times that each, at most.
    auto ep = eager.module->named_parameters();
    for (const auto& p : compiled.module->named_parameters())
      REQUIRE_CLOSE(p.value().detach(), ep[p.key()].detach(), autocast ? 1e-2 : 1e-4,
                    autocast ? 4 * 1e-2 * std::ldexp(1.0, -5) : 1e-5);
  }
}

// The pattern's other spellings: a 2-D input's Linear with a bias is addmm,
// and logits made under autocast reach the loss through a _to_copy to
// float32 (as a loss written `cross_entropy(logits.float(), ...)` gives
// them), or their bf16 log-softmax does (CUDA autocast's cross_entropy,
// whose log_softmax names the logits' dtype, before nll_loss casts up).
TEST_CASE("fuse_linear_cross_entropy: a biased head and an autocast head train as eager",
          "[pipeline][linear_cross_entropy]") {
  enum class Head { Float32, CastLogits, CastLogProbs };
  for (const Head head : {Head::Float32, Head::CastLogits, Head::CastLogProbs}) {
    const bool autocast = head != Head::Float32;
    INFO((head == Head::Float32      ? "float32"
          : head == Head::CastLogits ? "bf16 autocast, logits cast to float32"
                                     : "bf16 autocast, bf16 log-softmax cast to float32"));
    auto make = [] {
      return torch::nn::Sequential(torch::nn::Linear(12, 24), torch::nn::GELU(), torch::nn::Linear(24, 300)).ptr();
    };
    torch::manual_seed(2);
    std::shared_ptr<torch::nn::SequentialImpl> compiled = make(), eager = make();
    models::copy_state(*compiled, *eager);
    if (testing::compile_only()) CRUCIBLE_SKIP("CUDA asked for and no GPU here");
    const at::Device dev = testing::test_device();
    compiled->to(dev);
    eager->to(dev);
    pipeline::LossFn loss = [autocast, head, dev](torch::nn::Module& m, const std::vector<at::Tensor>& batch) {
      at::Tensor logits;
      {
        std::optional<runtime::AutocastGuard> on;
        if (autocast) on.emplace(dev.type(), at::kBFloat16);
        logits = dynamic_cast<torch::nn::SequentialImpl&>(m).forward(batch[0]);
      }
      if (head == Head::CastLogProbs)
        return at::nll_loss(at::log_softmax(logits, 1, logits.scalar_type()).to(at::kFloat), batch[1]);
      return at::cross_entropy_loss(logits.to(at::kFloat), batch[1]);
    };
    // A bf16 log-softmax trains with SGD: a parameter then moves by lr
    // times its gradient, so the comparison bounds the gradients (AdamW's
    // first steps turn a sign flip of a near-zero gradient into 2 lr).
    std::unique_ptr<torch::optim::Optimizer> c_opt, e_opt;
    if (head == Head::CastLogProbs) {
      c_opt = std::make_unique<torch::optim::SGD>(compiled->parameters(), torch::optim::SGDOptions(1e-2));
      e_opt = std::make_unique<torch::optim::SGD>(eager->parameters(), torch::optim::SGDOptions(1e-2));
    } else {
      c_opt = std::make_unique<torch::optim::AdamW>(compiled->parameters(), torch::optim::AdamWOptions(1e-2));
      e_opt = std::make_unique<torch::optim::AdamW>(eager->parameters(), torch::optim::AdamWOptions(1e-2));
    }
    pipeline::TrainStep step = pipeline::Builder()
                                   .backend("interpreter")
                                   .pre_grad_passes({"fuse_linear_cross_entropy"})
                                   .compile_train_step(compiled, *c_opt, loss);
    for (int64_t i = 0; i < 3; ++i) {
      at::manual_seed(10 + i);
      const std::vector<at::Tensor> batch{at::randn({40, 12}).to(dev), at::randint(0, 300, {40}, at::kLong).to(dev)};
      const at::Tensor c = step(batch);
      e_opt->zero_grad();
      const at::Tensor e = loss(*eager, batch);
      e.backward();
      e_opt->step();
      // float32: rounding of the chunked sums (see above). bf16: the same
      // bf16 logits, and gradients within a bf16 ulp of eager's, which
      // AdamW's normalized first steps turn into parameter differences of
      // lr * 2^-8 at most. A bf16 log-softmax: eager rounds each row's
      // log-probability (|log p| < 8 here) to bf16, half an ulp being 2^-6,
      // where the fused op keeps it in float32; so does their mean.
      if (head == Head::CastLogProbs)
        REQUIRE_CLOSE(c, e.detach(), 0.0, std::ldexp(1.0, -6));
      else
        REQUIRE_CLOSE(c, e.detach(), autocast ? 1e-4 : 1e-5, 1e-6);
    }
    std::string targets;
    for (const ir::Node* node : step.graph().nodes()) targets += node->target() + "\n";
    CHECK(targets.find("crucible::linear_cross_entropy_forward") != std::string::npos);
    // A bf16 log-softmax: eager's softmax, exp of log-probabilities off by
    // up to 2^-6, is up to 2^-5 off relative, and so is the logits'
    // gradient; over three SGD steps the parameters differ by lr times
    // that of gradients of order 1 (here) each step, at most.
    const double atol = head == Head::CastLogProbs ? 3 * 1e-2 * std::ldexp(1.0, -5) : autocast ? 1e-4 : 1e-5;
    auto ep = eager->named_parameters();
    for (const auto& p : compiled->named_parameters())
      REQUIRE_CLOSE(p.value().detach(), ep[p.key()].detach(), autocast ? 1e-2 : 1e-4, atol);
  }
}
