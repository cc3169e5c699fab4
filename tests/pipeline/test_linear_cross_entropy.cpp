// crucible::linear_cross_entropy and the fuse_linear_cross_entropy
// pre-grad pass (ir/fuse_linear_cross_entropy.h), against eager LibTorch's
// linear followed by cross_entropy: the loss and the gradients of the
// input, the weight and the bias, with ignored targets, over many chunks.
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
  at::Tensor target = at::randint(0, v, {n}, at::kLong);
  target.index_put_({at::arange(0, n, 5)}, -100);  // every fifth row ignored
  const at::Tensor x0 = at::randn({n, c}), w0 = at::randn({v, c}) * 0.3, b0 = at::randn({v}) * 0.1;
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
  const at::Tensor target = at::randint(0, v, {n}, at::kLong);
  const at::Tensor x0 = at::randn({n, c}).to(at::kBFloat16), w0 = (at::randn({v, c}) * 0.3).to(at::kBFloat16);
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

TEST_CASE("fuse_linear_cross_entropy: a GPT trains as eager with its head and loss fused",
          "[pipeline][linear_cross_entropy]") {
  const models::GptConfig config{.vocab_size = 512, .block_size = 32, .n_layer = 2, .n_head = 2, .n_embd = 32};
  torch::manual_seed(0);
  models::Model compiled = models::make_gpt(config), eager = models::make_gpt(config);
  models::copy_state(*compiled.module, *eager.module);
  torch::optim::AdamW c_opt(compiled.module->parameters(), torch::optim::AdamWOptions(1e-3));
  torch::optim::AdamW e_opt(eager.module->parameters(), torch::optim::AdamWOptions(1e-3));
  pipeline::TrainStep step = pipeline::Builder()
                                 .backend("interpreter")
                                 .pre_grad_passes({"fuse_linear_cross_entropy"})
                                 .compile_train_step(compiled.module, c_opt, models::loss_of(compiled));
  for (uint64_t i = 0; i < 4; ++i) {
    const data::Batch b = compiled.example_batch(4, i);
    const at::Tensor c = step({b.inputs, b.targets});
    e_opt.zero_grad();
    const at::Tensor e = eager.loss(eager.forward(b.inputs), b.targets);
    e.backward();
    e_opt.step();
    // The chunked sums differ from eager's in rounding (see above), and
    // AdamW's first steps normalize gradients: parameters move by lr times
    // values of order 1, so rounding in the gradients shows at ~1e-6.
    REQUIRE_CLOSE(c, e.detach(), 1e-5, 1e-6);
  }
  std::string text;
  for (const ir::Node* node : step.graph().nodes()) text += node->target() + "\n";
  CHECK(text.find("crucible::linear_cross_entropy_forward") != std::string::npos);
  CHECK(text.find("aten::_log_softmax\n") == std::string::npos);
  auto ep = eager.module->named_parameters();
  for (const auto& p : compiled.module->named_parameters())
    REQUIRE_CLOSE(p.value().detach(), ep[p.key()].detach(), 1e-4, 1e-5);
}

// The pattern's other spellings: a 2-D input's Linear with a bias is addmm,
// and logits made under autocast reach the loss through a _to_copy to
// float32 (as a loss written `cross_entropy(logits.float(), ...)` or CUDA
// autocast's log_softmax gives them).
TEST_CASE("fuse_linear_cross_entropy: a biased head and an autocast head train as eager",
          "[pipeline][linear_cross_entropy]") {
  for (const bool autocast : {false, true}) {
    INFO((autocast ? "bf16 autocast" : "float32"));
    auto make = [] {
      return torch::nn::Sequential(torch::nn::Linear(12, 24), torch::nn::GELU(), torch::nn::Linear(24, 300)).ptr();
    };
    torch::manual_seed(2);
    std::shared_ptr<torch::nn::SequentialImpl> compiled = make(), eager = make();
    models::copy_state(*compiled, *eager);
    pipeline::LossFn loss = [autocast](torch::nn::Module& m, const std::vector<at::Tensor>& batch) {
      at::Tensor logits;
      {
        std::optional<runtime::AutocastGuard> on;
        if (autocast) on.emplace(at::kCPU, at::kBFloat16);
        logits = dynamic_cast<torch::nn::SequentialImpl&>(m).forward(batch[0]);
      }
      return at::cross_entropy_loss(logits.to(at::kFloat), batch[1]);
    };
    torch::optim::AdamW c_opt(compiled->parameters(), torch::optim::AdamWOptions(1e-2));
    torch::optim::AdamW e_opt(eager->parameters(), torch::optim::AdamWOptions(1e-2));
    pipeline::TrainStep step = pipeline::Builder()
                                   .backend("interpreter")
                                   .pre_grad_passes({"fuse_linear_cross_entropy"})
                                   .compile_train_step(compiled, c_opt, loss);
    for (int64_t i = 0; i < 3; ++i) {
      at::manual_seed(10 + i);
      const std::vector<at::Tensor> batch{at::randn({40, 12}), at::randint(0, 300, {40}, at::kLong)};
      const at::Tensor c = step(batch);
      e_opt.zero_grad();
      const at::Tensor e = loss(*eager, batch);
      e.backward();
      e_opt.step();
      // float32: rounding of the chunked sums (see above). bf16: the same
      // bf16 logits, and gradients within a bf16 ulp of eager's, which
      // AdamW's normalized first steps turn into parameter differences of
      // lr * 2^-8 at most.
      REQUIRE_CLOSE(c, e.detach(), autocast ? 1e-4 : 1e-5, 1e-6);
    }
    std::string targets;
    for (const ir::Node* node : step.graph().nodes()) targets += node->target() + "\n";
    CHECK(targets.find("crucible::linear_cross_entropy_forward") != std::string::npos);
    auto ep = eager->named_parameters();
    for (const auto& p : compiled->named_parameters())
      REQUIRE_CLOSE(p.value().detach(), ep[p.key()].detach(), autocast ? 1e-2 : 1e-4, autocast ? 1e-4 : 1e-5);
  }
}
