// Traceable SGD / Adam / AdamW against torch::optim: two identical copies of a
// small network train on the same batches with real gradients, one stepped by
// torch::optim, one by crucible::pipeline, under a changing learning rate.
#include <crucible/pipeline/error.h>
#include <crucible/pipeline/optim.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>

#include "catch.h"
#include "testing.h"

using namespace crucible::pipeline;

namespace {

// A 20 -> 16 -> 5 tanh network; every parameter gets a gradient each step.
std::vector<at::Tensor> make_params(uint64_t seed, at::Device device = at::kCPU) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<at::Tensor> ps = {at::randn({16, 20}, gen) * 0.3, at::randn({16}, gen) * 0.1,
                                at::randn({5, 16}, gen) * 0.3, at::randn({5}, gen) * 0.1};
  for (auto& p : ps) p = p.to(device).requires_grad_(true);
  return ps;
}

std::vector<at::Tensor> clone_params(const std::vector<at::Tensor>& ps) {
  std::vector<at::Tensor> out;
  for (const auto& p : ps) out.push_back(p.detach().clone().requires_grad_(true));
  return out;
}

// Fills each parameter's .grad() with d loss / d param on batch `step`.
void backward(const std::vector<at::Tensor>& ps, int64_t step) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  at::Tensor x = at::randn({32, 20}, gen).to(ps[0].device());
  at::Tensor y = at::randint(0, 5, {32}, gen, at::kLong).to(ps[0].device());
  at::Tensor h = at::tanh(at::linear(x, ps[0], ps[1]));
  at::Tensor loss = at::cross_entropy_loss(at::linear(h, ps[2], ps[3]), y);
  for (const auto& p : ps)
    if (p.grad().defined()) p.mutable_grad().zero_();
  loss.backward();
}

// A schedule that changes the rate every step: warm-up, then cosine decay.
double schedule(double base, int64_t step, int64_t steps) {
  if (step < 10) return base * (step + 1) / 10.0;
  return base * 0.5 * (1 + std::cos(M_PI * static_cast<double>(step) / static_cast<double>(steps)));
}

// `rtol` 0: bitwise.
template <typename TorchOptimizer, typename TorchOptions>
void compare(const OptimizerOptions& options, TorchOptions torch_options, at::Device device = at::kCPU,
             int64_t steps = 120, double rtol = 0, double atol = 0) {
  std::vector<at::Tensor> eager = make_params(7, device);
  std::vector<at::Tensor> ours = clone_params(eager);
  TorchOptimizer reference(eager, torch_options);
  OptimizerState state = init_optimizer_state(options, ours);

  for (int64_t step = 0; step < steps; ++step) {
    const double lr = schedule(options.lr, step, steps);
    static_cast<TorchOptions&>(reference.param_groups()[0].options()).lr(lr);
    backward(eager, step);
    reference.step();

    backward(ours, step);
    std::vector<at::Tensor> grads;
    for (const auto& p : ours) grads.push_back(p.grad());
    optimizer_step(options, ours, grads, state, lr_tensor(lr, options.capturable ? device : at::Device(at::kCPU)));
  }
  // The same ATen ops on the same operands in the same order (see Note
  // [Traceable optimizer state]): the parameters agree bitwise, unless
  // capturable (see there).
  for (size_t i = 0; i < eager.size(); ++i) {
    INFO("parameter " << i);
    REQUIRE_CLOSE(ours[i].detach(), eager[i].detach(), rtol, atol);
  }
  // The parameters moved: a comparison of two untouched copies would pass trivially.
  REQUIRE_FALSE(at::allclose(ours[0].detach(), make_params(7, device)[0], 1e-3, 1e-3));
  for (const ParamState& s : state.params) {
    REQUIRE(s.step.item<double>() == static_cast<double>(steps));
    REQUIRE(s.step.device().type() == (options.capturable ? device.type() : at::kCPU));
  }
}

}  // namespace

TEST_CASE("SGD matches torch::optim::SGD over 120 steps", "[pipeline][optim]") {
  SECTION("plain") {
    compare<torch::optim::SGD>({.kind = OptimizerKind::SGD, .lr = 0.1}, torch::optim::SGDOptions(0.1));
  }
  SECTION("momentum") {
    compare<torch::optim::SGD>({.kind = OptimizerKind::SGD, .lr = 0.05, .momentum = 0.9},
                               torch::optim::SGDOptions(0.05).momentum(0.9));
  }
  SECTION("momentum, dampening and weight decay") {
    compare<torch::optim::SGD>(
        {.kind = OptimizerKind::SGD, .lr = 0.05, .weight_decay = 1e-3, .momentum = 0.9, .dampening = 0.2},
        torch::optim::SGDOptions(0.05).momentum(0.9).dampening(0.2).weight_decay(1e-3));
  }
  SECTION("Nesterov and weight decay") {
    compare<torch::optim::SGD>(
        {.kind = OptimizerKind::SGD, .lr = 0.05, .weight_decay = 1e-2, .momentum = 0.9, .nesterov = true},
        torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-2));
  }
}

TEST_CASE("Adam matches torch::optim::Adam over 120 steps", "[pipeline][optim]") {
  SECTION("defaults") {
    compare<torch::optim::Adam>({.kind = OptimizerKind::Adam, .lr = 1e-2}, torch::optim::AdamOptions(1e-2));
  }
  SECTION("weight decay, betas, eps and amsgrad") {
    compare<torch::optim::Adam>(
        {.kind = OptimizerKind::Adam,
         .lr = 1e-2,
         .weight_decay = 1e-2,
         .beta1 = 0.8,
         .beta2 = 0.99,
         .eps = 1e-6,
         .amsgrad = true},
        torch::optim::AdamOptions(1e-2).weight_decay(1e-2).betas({0.8, 0.99}).eps(1e-6).amsgrad(true));
  }
}

TEST_CASE("AdamW matches torch::optim::AdamW over 120 steps", "[pipeline][optim]") {
  SECTION("weight decay 1e-2 (torch's default)") {
    compare<torch::optim::AdamW>({.kind = OptimizerKind::AdamW, .lr = 1e-2, .weight_decay = 1e-2},
                                 torch::optim::AdamWOptions(1e-2));
  }
  SECTION("amsgrad and a large weight decay") {
    compare<torch::optim::AdamW>({.kind = OptimizerKind::AdamW, .lr = 1e-2, .weight_decay = 0.1, .amsgrad = true},
                                 torch::optim::AdamWOptions(1e-2).weight_decay(0.1).amsgrad(true));
  }
}

// CUDA's kernels round differently from the CPU's (addcdiv_ is one FMA there),
// and the state's CPU step count keeps host arithmetic where torch::optim has
// it: the updates still agree bitwise with torch::optim on the GPU.
TEST_CASE("on CUDA: SGD, Adam and AdamW match torch::optim over 120 steps", "[pipeline][optim][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  SECTION("SGD with momentum and weight decay") {
    compare<torch::optim::SGD>({.kind = OptimizerKind::SGD, .lr = 0.05, .weight_decay = 1e-3, .momentum = 0.9},
                               torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-3), at::kCUDA);
  }
  SECTION("Adam with amsgrad") {
    compare<torch::optim::Adam>({.kind = OptimizerKind::Adam, .lr = 1e-2, .amsgrad = true},
                                torch::optim::AdamOptions(1e-2).amsgrad(true), at::kCUDA);
  }
  SECTION("AdamW") {
    compare<torch::optim::AdamW>({.kind = OptimizerKind::AdamW, .lr = 1e-2, .weight_decay = 1e-2},
                                 torch::optim::AdamWOptions(1e-2), at::kCUDA);
  }
}

// Capturable (step counts and rate on the GPU, as torch.optim's capturable):
// the bias corrections are computed by CUDA's float64 pow and division
// instead of the host's, which may differ from them in the last bit and so
// move a float32 update by an ulp now and then; 120 steps of such ulps stay
// far below 1e-5 relative, while a baked or skipped step is off by the
// update's own size (1e-2 relative and more).
TEST_CASE("on CUDA, capturable: the update runs on the device and matches torch::optim", "[pipeline][optim][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  SECTION("SGD with momentum") {
    compare<torch::optim::SGD>({.kind = OptimizerKind::SGD, .lr = 0.05, .momentum = 0.9, .capturable = true},
                               torch::optim::SGDOptions(0.05).momentum(0.9), at::kCUDA, 120, 1e-5, 1e-6);
  }
  SECTION("Adam with amsgrad") {
    compare<torch::optim::Adam>({.kind = OptimizerKind::Adam, .lr = 1e-2, .amsgrad = true, .capturable = true},
                                torch::optim::AdamOptions(1e-2).amsgrad(true), at::kCUDA, 120, 1e-5, 1e-6);
  }
  SECTION("AdamW") {
    compare<torch::optim::AdamW>({.kind = OptimizerKind::AdamW, .lr = 1e-2, .weight_decay = 1e-2, .capturable = true},
                                 torch::optim::AdamWOptions(1e-2), at::kCUDA, 120, 1e-5, 1e-6);
  }
}

TEST_CASE("optimizer options and state convert both ways", "[pipeline][optim]") {
  std::vector<at::Tensor> ps = make_params(1);
  torch::optim::SGD sgd(ps, torch::optim::SGDOptions(0.3).momentum(0.8).nesterov(true).weight_decay(0.01));
  OptimizerOptions o = optimizer_options_from(sgd);
  REQUIRE(o.kind == OptimizerKind::SGD);
  REQUIRE(o.lr == 0.3);
  REQUIRE(o.momentum == 0.8);
  REQUIRE(o.nesterov);
  REQUIRE(o.weight_decay == 0.01);

  torch::optim::AdamW adamw(ps, torch::optim::AdamWOptions(2e-3).betas({0.5, 0.6}).amsgrad(true));
  OptimizerOptions w = optimizer_options_from(adamw);
  REQUIRE(w.kind == OptimizerKind::AdamW);
  REQUIRE(w.beta1 == 0.5);
  REQUIRE(w.beta2 == 0.6);
  REQUIRE(w.weight_decay == 1e-2);
  REQUIRE(w.amsgrad);

  // step + exp_avg + exp_avg_sq + max_exp_avg_sq per parameter, in order.
  OptimizerState state = init_optimizer_state(w, ps);
  std::vector<at::Tensor> flat = state.flat();
  REQUIRE(flat.size() == 4 * ps.size());
  REQUIRE(flat[0].dim() == 0);
  REQUIRE(flat[0].scalar_type() == at::kDouble);
  REQUIRE(flat[1].sizes() == ps[0].sizes());
  OptimizerState back = OptimizerState::from_flat(w, ps.size(), flat);
  REQUIRE(back.params[1].exp_avg_sq.is_same(state.params[1].exp_avg_sq));
  REQUIRE_THROWS_WITH(OptimizerState::from_flat(o, ps.size(), flat), CRUCIBLE_HAS_SUBSTR("need 8, not 16"));

  torch::optim::Adagrad adagrad(ps, torch::optim::AdagradOptions(0.1));
  REQUIRE_THROWS_AS(optimizer_options_from(adagrad), PipelineError);
  REQUIRE_THROWS_WITH(optimizer_group_options(adagrad),
                      CRUCIBLE_HAS_SUBSTR("torch::optim::Adagrad has no traceable update"));

  // Param groups with their own options: one set each, in order;
  // optimizer_options_from insists on one set.
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{ps[0]},
                      std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.1).weight_decay(0.5)));
  groups.emplace_back(std::vector<at::Tensor>{ps[1]},
                      std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.2).momentum(0.9)));
  torch::optim::SGD grouped(std::move(groups), torch::optim::SGDOptions(0.1));
  const std::vector<OptimizerOptions> per_group = optimizer_group_options(grouped);
  REQUIRE(per_group.size() == 2);
  REQUIRE((per_group[0].lr == 0.1 && per_group[0].weight_decay == 0.5 && per_group[0].momentum == 0));
  REQUIRE((per_group[1].lr == 0.2 && per_group[1].weight_decay == 0 && per_group[1].momentum == 0.9));
  REQUIRE_THROWS_WITH(optimizer_options_from(grouped), CRUCIBLE_HAS_SUBSTR("different options"));
  REQUIRE_THROWS_WITH(sgd_step(w, ps, ps, state, lr_tensor(0.1)), CRUCIBLE_HAS_SUBSTR("AdamW"));
  REQUIRE_THROWS_WITH(adam_step(w, ps, {}, state, lr_tensor(0.1)), CRUCIBLE_HAS_SUBSTR("0 gradients"));
  REQUIRE_THROWS_WITH(adam_step(w, ps, ps, state, at::ones({1})), CRUCIBLE_HAS_SUBSTR("0-dim float64"));
}
