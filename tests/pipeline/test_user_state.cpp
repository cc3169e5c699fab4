// What the user holds stays eager's: a program that trains through compiled
// steps and, anywhere in between, checkpoints and resumes the LibTorch way
// (torch::save / torch::load of the module and the optimizer), steps
// eagerly, schedules its learning rate, clips its gradients, reads .grad or
// changes its module, ends where the same program run eagerly ends (Note
// [The optimizer's own state] in pipeline/src/optimizer_binding.h).
//
// Tolerances. With the interpreter the compiled step runs eager's kernels
// on the same operands in the same order (Note [Traceable optimizer state]):
// every comparison on the CPU is bitwise. The inductor's fused kernels
// round in their own order, and training amplifies last-bit differences (a
// small ResNet's float32 run drifts 1e-2 from eager's in 15 steps without
// any fault), so the programs run in float64, where 17 steps stay within
// rtol 1e-7 / atol 1e-9 of eager's: a lost moment, a step count off by one
// or a state that was not picked up is off by 1e-3 and more (the resumed
// float32 run that found the defect was 1.8e-1 away).
#include <crucible/data/fashion_mnist.h>
#include <crucible/models/zoo.h>
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/error.h>
#include <crucible/pipeline/train_step.h>
#include <crucible/tracer/decomposition.h>
#include <crucible/tracer/error.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/schedulers/reduce_on_plateau_scheduler.h>
#include <torch/optim/schedulers/step_lr.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>
#include <torch/utils.h>

#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "catch.h"
#include "data_dir.h"
#include "testing.h"

using namespace crucible::pipeline;
using namespace crucible::models;

namespace {

// The first 40 * 16 training images, read once.
const crucible::data::FashionMnist& images() {
  static const crucible::data::FashionMnist subset = [] {
    crucible::data::FashionMnist all =
        crucible::data::load_fashion_mnist(crucible::data::Split::Train, fashion_mnist_test_dir());
    return crucible::data::FashionMnist{all.images.slice(0, 0, 40 * 16).clone(),
                                        all.labels.slice(0, 0, 40 * 16).clone()};
  }();
  return subset;
}

// Images in the model's dtype.
std::vector<at::Tensor> batch(int64_t step, at::ScalarType dtype = at::kDouble) {
  const int64_t start = (step * 16) % images().images.size(0);
  const at::Device device = crucible::testing::test_device();
  return {images().images.slice(0, start, start + 16).to(device, dtype),
          images().labels.slice(0, start, start + 16).to(device)};
}

using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(torch::nn::Module&)>;

struct OptimizerCase {
  std::string name;
  MakeOptimizer make;
};

// Every optimizer and option the compiled step accepts.
std::vector<OptimizerCase> optimizer_cases() {
  using namespace torch::optim;
  return {
      {"SGD, momentum",
       [](torch::nn::Module& m) {
         return std::make_unique<SGD>(m.parameters(), SGDOptions(0.05).momentum(0.9).weight_decay(1e-3));
       }},
      {"SGD, Nesterov",
       [](torch::nn::Module& m) {
         return std::make_unique<SGD>(m.parameters(), SGDOptions(0.05).momentum(0.9).nesterov(true));
       }},
      {"SGD, dampening",
       [](torch::nn::Module& m) {
         return std::make_unique<SGD>(m.parameters(), SGDOptions(0.05).momentum(0.8).dampening(0.3));
       }},
      {"SGD, no momentum",
       [](torch::nn::Module& m) { return std::make_unique<SGD>(m.parameters(), SGDOptions(0.05)); }},
      {"Adam, amsgrad",
       [](torch::nn::Module& m) {
         return std::make_unique<Adam>(m.parameters(), AdamOptions(3e-3).amsgrad(true).weight_decay(1e-3));
       }},
      {"AdamW",
       [](torch::nn::Module& m) {
         return std::make_unique<AdamW>(m.parameters(), AdamWOptions(3e-3).weight_decay(1e-2));
       }},
  };
}

// A model and its optimizer, stepped eagerly or through a compiled step.
struct Run {
  Model model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::optional<TrainStep> step;
  at::ScalarType dtype;  // the module's
};

Model mlp() { return make_mlp({.in_features = 784, .hidden = {24}, .num_classes = 10}); }
// With batch norm: running statistics are buffers a checkpoint holds too.
Model resnet() { return make_resnet({.in_channels = 1, .image_size = 28, .width = 4, .blocks = {1, 1, 1, 1}}); }

// In float64 unless asked otherwise, so that a fused backend's other
// summation orders stay ~1e-15 relative over a program (a small ResNet's
// float32 run drifts from eager's by 1e-2 in 15 steps without any fault).
Run fresh_run(const MakeOptimizer& make_opt, uint64_t seed, const std::function<Model()>& make_model = mlp,
              at::ScalarType dtype = at::kDouble) {
  torch::manual_seed(seed);
  Run r{make_model(), nullptr, std::nullopt, dtype};
  r.model.module->to(crucible::testing::test_device(), dtype);
  r.optimizer = make_opt(*r.model.module);
  return r;
}

enum class How { Eager, Compiled };

at::Tensor eager_step(Run& r, int64_t i) {
  const std::vector<at::Tensor> b = batch(i, r.dtype);
  r.optimizer->zero_grad();
  at::Tensor loss = r.model.loss(r.model.forward(b[0]), b[1]);
  loss.backward();
  r.optimizer->step();
  return loss.detach();
}

at::Tensor compiled_step(Run& r, int64_t i, const Builder& builder) {
  if (!r.step) r.step = builder.compile_train_step(r.model.module, *r.optimizer, loss_of(r.model));
  return (*r.step)(batch(i, r.dtype));
}

void train(Run& r, How how, const Builder& builder, int64_t first, int64_t steps) {
  for (int64_t i = first; i < first + steps; ++i) how == How::Eager ? eager_step(r, i) : compiled_step(r, i, builder);
}

// A checkpoint as LibTorch programs write one: the module and the optimizer.
struct Checkpoint {
  std::string module, optimizer;
};

Checkpoint save(const Run& r) {
  std::ostringstream m, o;
  torch::save(r.model.module, m);
  torch::save(*r.optimizer, o);
  return {m.str(), o.str()};
}

void load(Run& r, const Checkpoint& c) {
  std::istringstream m(c.module), o(c.optimizer);
  torch::load(r.model.module, m);
  torch::load(*r.optimizer, o);
}

// The optimizer's state as eager's step reads it: each parameter's tensors
// and step count (-1 for SGD, which keeps none; absent parameters skipped).
struct TorchState {
  std::vector<at::Tensor> tensors;
  std::vector<int64_t> steps;
};

TorchState torch_state(const Run& r) {
  TorchState out;
  for (const at::Tensor& p : r.model.module->parameters()) {
    auto it = r.optimizer->state().find(p.unsafeGetTensorImpl());
    if (it == r.optimizer->state().end()) {
      out.steps.push_back(-2);
      continue;
    }
    if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
      out.tensors.push_back(s->momentum_buffer());
      out.steps.push_back(-1);
    } else if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
      out.tensors.insert(out.tensors.end(), {a->exp_avg(), a->exp_avg_sq()});
      if (a->max_exp_avg_sq().defined()) out.tensors.push_back(a->max_exp_avg_sq());
      out.steps.push_back(a->step());
    } else if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
      out.tensors.insert(out.tensors.end(), {w->exp_avg(), w->exp_avg_sq()});
      out.steps.push_back(w->step());
    }
  }
  return out;
}

// Parameters, buffers, the optimizer's tensors and step counts of two runs.
void require_same(const Run& compiled, const Run& eager, double rtol, double atol) {
  const auto pe = eager.model.module->named_parameters();
  for (const auto& p : compiled.model.module->named_parameters()) {
    INFO("parameter " << p.key());
    REQUIRE_CLOSE(p.value().detach(), pe[p.key()].detach(), rtol, atol);
  }
  const auto be = eager.model.module->named_buffers();
  for (const auto& b : compiled.model.module->named_buffers()) {
    INFO("buffer " << b.key());
    REQUIRE_CLOSE(b.value(), be[b.key()], rtol, atol);
  }
  const TorchState a = torch_state(compiled), e = torch_state(eager);
  REQUIRE(a.steps == e.steps);
  REQUIRE(a.tensors.size() == e.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    INFO("optimizer state tensor " << i);
    REQUIRE_CLOSE(a.tensors[i], e.tensors[i], rtol, atol);
  }
}

Builder inductor() {
  return std::move(Builder().decompositions(crucible::tracer::core_aten_decompositions()).backend("inductor"));
}

struct Tolerance {
  double rtol, atol;
};
constexpr Tolerance kBitwise{0, 0}, kFused{1e-7, 1e-9};

// The program of the issue: 6 steps, a checkpoint, 3 more steps the resume
// throws away, then the checkpoint loaded (into new objects, or into the
// same ones mid-run) and 8 more steps. Each part eager or compiled.
Run checkpoint_program(const std::function<Model()>& make_model, const MakeOptimizer& make_opt, How before, How after,
                       bool same_objects, const Builder& builder) {
  Run r = fresh_run(make_opt, 1, make_model);
  train(r, before, builder, 0, 6);
  const Checkpoint c = save(r);
  train(r, before, builder, 6, 3);
  if (same_objects) {
    load(r, c);
    train(r, after, builder, 6, 8);
    return r;
  }
  Run resumed = fresh_run(make_opt, 2, make_model);  // other initial weights: the load must replace them
  load(resumed, c);
  train(resumed, after, builder, 6, 8);
  return resumed;
}

const char* name(How h) { return h == How::Eager ? "eager" : "compiled"; }

}  // namespace

TEST_CASE("user state: checkpoints saved and loaded mid-run end where eager ends, for every optimizer",
          "[pipeline][user_state][programs]") {
  if (crucible::testing::compile_only()) CRUCIBLE_SKIP("CUDA asked for and no GPU here");
  const bool gpu = crucible::testing::test_device().is_cuda();
  struct Backend {
    std::string name;
    Builder builder;
    Tolerance tolerance;
  };
  std::vector<Backend> backends;
  // On a GPU cuBLAS and cuDNN may pick other algorithms per call: close, not bitwise.
  backends.push_back({"interpreter", Builder().backend("interpreter"), gpu ? kFused : kBitwise});
  backends.push_back({"inductor", inductor(), kFused});
  if (gpu) backends.push_back({"inductor-cudagraphs", std::move(inductor().backend("inductor-cudagraphs")), kFused});
  struct Program {
    std::string model;
    std::function<Model()> make;
    OptimizerCase optimizer;
  };
  std::vector<Program> programs;
  for (const OptimizerCase& opt : optimizer_cases()) programs.push_back({"MLP", mlp, opt});
  programs.push_back({"ResNet with batch norm", resnet, optimizer_cases().front()});
  for (const Program& program : programs)
    for (const bool same_objects : {false, true}) {
      const Run eager = checkpoint_program(program.make, program.optimizer.make, How::Eager, How::Eager, same_objects,
                                           Builder().backend("interpreter"));
      for (const Backend& backend : backends)
        for (const auto& [before, after] :
             {std::pair{How::Compiled, How::Compiled}, std::pair{How::Compiled, How::Eager},
              std::pair{How::Eager, How::Compiled}}) {
          INFO(program.model << ", " << program.optimizer.name << ", " << backend.name << ": " << name(before)
                             << " -> checkpoint -> " << name(after)
                             << (same_objects ? ", loaded into the same module and optimizer"
                                              : ", loaded into new ones"));
          const Run compiled =
              checkpoint_program(program.make, program.optimizer.make, before, after, same_objects, backend.builder);
          require_same(compiled, eager, backend.tolerance.rtol, backend.tolerance.atol);
        }
    }
}

TEST_CASE("user state: eager and compiled steps interleave on one optimizer, with two compiled steps over it",
          "[pipeline][user_state]") {
  for (const OptimizerCase& opt : optimizer_cases()) {
    INFO(opt.name);
    Run eager = fresh_run(opt.make, 3), mixed = fresh_run(opt.make, 3);
    // A second step over the same module and optimizer (another loss
    // scale), as a program that compiles a step per phase has.
    TrainStep other =
        Builder()
            .backend("interpreter")
            .compile_train_step(mixed.model.module, *mixed.optimizer,
                                [loss = loss_of(mixed.model)](torch::nn::Module& m, const std::vector<at::Tensor>& b) {
                                  return loss(m, b) * 2;
                                });
    for (int64_t i = 0; i < 9; ++i) {
      INFO("step " << i);
      const std::vector<at::Tensor> b = batch(i);
      if (i % 3 == 2) {
        eager.optimizer->zero_grad();
        (eager.model.loss(eager.model.forward(b[0]), b[1]) * 2).backward();
        eager.optimizer->step();
        other(b);
        continue;
      }
      const at::Tensor expected = eager_step(eager, i);
      REQUIRE_EQUAL_TENSORS(
          i % 3 == 0 ? compiled_step(mixed, i, Builder().backend("interpreter")) : eager_step(mixed, i), expected);
    }
    require_same(mixed, eager, 0, 0);
  }
}

TEST_CASE(
    "user state: after a compiled step the optimizer's state is eager's, and a fresh state is made as eager makes it",
    "[pipeline][user_state]") {
  // A parameter no gradient reaches gets no state, as in eager; the others
  // get theirs at the first step, with step counts that count.
  struct Net : torch::nn::Module {
    torch::nn::Linear used{nullptr}, unused{nullptr};
    Net() {
      used = register_module("used", torch::nn::Linear(784, 10));
      unused = register_module("unused", torch::nn::Linear(3, 3));
    }
  };
  auto make_pair = [] {
    torch::manual_seed(4);
    auto net = std::make_shared<Net>();
    net->to(crucible::testing::test_device(), at::kDouble);
    return net;
  };
  auto a = make_pair(), e = make_pair();
  torch::optim::Adam compiled_opt(a->parameters(), torch::optim::AdamOptions(1e-2));
  torch::optim::Adam eager_opt(e->parameters(), torch::optim::AdamOptions(1e-2));
  auto loss = [](const std::shared_ptr<Net>& net, const std::vector<at::Tensor>& b) {
    return at::cross_entropy_loss(net->used->forward(b[0].flatten(1)), b[1]);
  };
  TrainStep step = Builder()
                       .backend("interpreter")
                       .compile_train_step(a, compiled_opt, [&](torch::nn::Module&, const std::vector<at::Tensor>& b) {
                         return loss(a, b);
                       });
  REQUIRE(compiled_opt.state().empty());  // compile_train_step makes no state: torch::optim makes it at a step
  for (int64_t i = 0; i < 4; ++i) {
    step(batch(i));
    eager_opt.zero_grad();
    loss(e, batch(i)).backward();
    eager_opt.step();
  }
  REQUIRE(compiled_opt.state().size() == 2);
  REQUIRE(eager_opt.state().size() == 2);
  for (const auto& [name, p] : a->named_parameters().pairs()) {
    INFO(name);
    const auto it = compiled_opt.state().find(p.unsafeGetTensorImpl());
    const auto eit = eager_opt.state().find(e->named_parameters()[name].unsafeGetTensorImpl());
    REQUIRE((it == compiled_opt.state().end()) == (eit == eager_opt.state().end()));
    if (it == compiled_opt.state().end()) continue;
    const auto& s = static_cast<const torch::optim::AdamParamState&>(*it->second);
    const auto& es = static_cast<const torch::optim::AdamParamState&>(*eit->second);
    CHECK(s.step() == 4);
    REQUIRE_EQUAL_TENSORS(s.exp_avg(), es.exp_avg());
    REQUIRE_EQUAL_TENSORS(s.exp_avg_sq(), es.exp_avg_sq());
  }
  // The step reads the optimizer's tensors: the state it reports is theirs.
  const OptimizerState& bound = step.optimizer_state();
  const auto& first =
      static_cast<const torch::optim::AdamParamState&>(*compiled_opt.state().at(a->used->weight.unsafeGetTensorImpl()));
  CHECK(bound.params[0].exp_avg.is_same(first.exp_avg()));
  CHECK(bound.params[0].step.item<double>() == 4);
  // Erasing the state starts the parameter afresh, in both.
  compiled_opt.state().erase(a->used->weight.unsafeGetTensorImpl());
  eager_opt.state().erase(e->used->weight.unsafeGetTensorImpl());
  step(batch(5));
  eager_opt.zero_grad();
  loss(e, batch(5)).backward();
  eager_opt.step();
  REQUIRE_EQUAL_TENSORS(a->used->weight, e->used->weight);
  CHECK(
      static_cast<const torch::optim::AdamParamState&>(*compiled_opt.state().at(a->used->weight.unsafeGetTensorImpl()))
          .step() == 1);
}

TEST_CASE("user state: learning-rate schedulers set the compiled step's rate at every call", "[pipeline][user_state]") {
  for (const bool plateau : {false, true}) {
    INFO((plateau ? "ReduceLROnPlateauScheduler on the loss" : "StepLR"));
    auto make_opt = [](torch::nn::Module& m) -> std::unique_ptr<torch::optim::Optimizer> {
      return std::make_unique<torch::optim::Adam>(m.parameters(), torch::optim::AdamOptions(1e-2));
    };
    Run eager = fresh_run(make_opt, 5), compiled = fresh_run(make_opt, 5);
    auto scheduler_of = [&](torch::optim::Optimizer& o) {
      return std::make_pair(std::make_unique<torch::optim::StepLR>(o, 3, 0.5),
                            std::make_unique<torch::optim::ReduceLROnPlateauScheduler>(
                                o, torch::optim::ReduceLROnPlateauScheduler::SchedulerMode::min, 0.5f, 0, 1e-2));
    };
    auto [eager_step_lr, eager_plateau] = scheduler_of(*eager.optimizer);
    auto [compiled_step_lr, compiled_plateau] = scheduler_of(*compiled.optimizer);
    double last_lr = 0;
    for (int64_t i = 0; i < 12; ++i) {
      const at::Tensor expected = eager_step(eager, i),
                       loss = compiled_step(compiled, i, Builder().backend("interpreter"));
      INFO("step " << i);
      REQUIRE_EQUAL_TENSORS(loss, expected);
      if (plateau) {
        eager_plateau->step(expected.item<float>());
        compiled_plateau->step(loss.item<float>());
      } else {
        eager_step_lr->step();
        compiled_step_lr->step();
      }
      last_lr = compiled.optimizer->param_groups()[0].options().get_lr();
    }
    CHECK(last_lr < 1e-2);  // the schedule did change the rate
    require_same(compiled, eager, 0, 0);
  }
}

TEST_CASE("user state: gradient clipping by norm and by value compiled into the step, as clip_grad_norm_/value_",
          "[pipeline][user_state]") {
  struct Clip {
    std::string name;
    std::optional<double> value;
    std::optional<ClipGradNorm> norm;
  };
  const double inf = std::numeric_limits<double>::infinity();
  for (const Clip& clip : {Clip{"norm 2, max 0.5", std::nullopt, ClipGradNorm{0.5, 2}},
                           Clip{"norm inf, max 0.05", std::nullopt, ClipGradNorm{0.05, inf}},
                           Clip{"norm 1, max 100 (no clipping)", std::nullopt, ClipGradNorm{100, 1}},
                           Clip{"value 0.01", 0.01, std::nullopt}}) {
    INFO(clip.name);
    auto make_opt = [](torch::nn::Module& m) -> std::unique_ptr<torch::optim::Optimizer> {
      return std::make_unique<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    };
    Run eager = fresh_run(make_opt, 6), compiled = fresh_run(make_opt, 6);
    TrainStepOptions options;
    options.clip_grad_value = clip.value;
    options.clip_grad_norm = clip.norm;
    TrainStep step = compile_train_step(compiled.model.module, *compiled.optimizer, loss_of(compiled.model),
                                        Builder().backend("interpreter"), options);
    for (int64_t i = 0; i < 6; ++i) {
      const std::vector<at::Tensor> b = batch(i);
      eager.optimizer->zero_grad();
      const at::Tensor expected = eager.model.loss(eager.model.forward(b[0]), b[1]);
      expected.backward();
      double norm = 0;
      if (clip.norm)
        norm = torch::nn::utils::clip_grad_norm_(eager.model.module->parameters(), clip.norm->max_norm,
                                                 clip.norm->norm_type);
      if (clip.value) torch::nn::utils::clip_grad_value_(eager.model.module->parameters(), *clip.value);
      eager.optimizer->step();
      INFO("step " << i);
      REQUIRE_EQUAL_TENSORS(step(b), expected.detach());
      if (clip.norm) CHECK(step.grad_norm().item<double>() == norm);
    }
    require_same(compiled, eager, 0, 0);
  }
  // grad_norm() without a norm to report, and clip_grad_norm_ inside the step.
  Run r = fresh_run(
      [](torch::nn::Module& m) -> std::unique_ptr<torch::optim::Optimizer> {
        return std::make_unique<torch::optim::SGD>(m.parameters(), 0.1);
      },
      7);
  TrainStep plain = Builder().backend("interpreter").compile_train_step(r.model.module, *r.optimizer, loss_of(r.model));
  REQUIRE_THROWS_WITH(plain.grad_norm(), CRUCIBLE_HAS_SUBSTR("clip_grad_norm"));
  TrainStepOptions eager_clip;
  eager_clip.gradient_hook = [&](std::vector<at::Tensor> grads) {
    torch::nn::utils::clip_grad_norm_(r.model.module->parameters(), 1.0);
    return grads;
  };
  TrainStep hooked =
      compile_train_step(r.model.module, *r.optimizer, loss_of(r.model), Builder().backend("interpreter"), eager_clip);
  const auto before = r.model.module->parameters().front().clone();
  REQUIRE_THROWS_WITH(hooked(batch(0)), CRUCIBLE_HAS_SUBSTR("TrainStepOptions::clip_grad_norm"));
  REQUIRE_EQUAL_TENSORS(r.model.module->parameters().front(), before);
  TrainStepOptions nan_clip;
  nan_clip.clip_grad_value = std::numeric_limits<double>::quiet_NaN();
  REQUIRE_THROWS_AS(
      compile_train_step(r.model.module, *r.optimizer, loss_of(r.model), Builder().backend("interpreter"), nan_clip),
      PipelineError);
}

TEST_CASE("user state: .grad after a compiled step is eager's with keep_gradients, and unset without",
          "[pipeline][user_state]") {
  auto make_opt = [](torch::nn::Module& m) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::AdamW>(m.parameters(), torch::optim::AdamWOptions(1e-2));
  };
  for (const bool keep : {false, true}) {
    INFO("keep_gradients " << keep);
    Run eager = fresh_run(make_opt, 8), compiled = fresh_run(make_opt, 8);
    // The last layer's bias is frozen: no gradient, as in eager.
    for (Run* r : {&eager, &compiled}) r->model.module->parameters().back().requires_grad_(false);
    TrainStepOptions options;
    options.keep_gradients = keep;
    options.clip_grad_norm = ClipGradNorm{0.5, 2};
    TrainStep step = compile_train_step(compiled.model.module, *compiled.optimizer, loss_of(compiled.model),
                                        Builder().backend("interpreter"), options);
    for (int64_t i = 0; i < 3; ++i) {
      const std::vector<at::Tensor> b = batch(i);
      eager.optimizer->zero_grad();
      eager.model.loss(eager.model.forward(b[0]), b[1]).backward();
      torch::nn::utils::clip_grad_norm_(eager.model.module->parameters(), 0.5);
      eager.optimizer->step();
      step(b);
      const auto pe = eager.model.module->parameters(), pc = compiled.model.module->parameters();
      for (size_t k = 0; k < pe.size(); ++k) {
        INFO("parameter " << k);
        if (keep)
          REQUIRE_EQUAL_TENSORS(pc[k].grad(), pe[k].grad());  // undefined for the frozen one in both
        else
          REQUIRE(!pc[k].grad().defined());
      }
    }
    require_same(compiled, eager, 0, 0);
  }
}

TEST_CASE("user state: module changes after compiling recompile as eager's program runs, or are refused",
          "[pipeline][user_state][errors]") {
  auto adam = [](torch::nn::Module& m) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::Adam>(m.parameters(), torch::optim::AdamOptions(1e-2));
  };
  SECTION("converted to float64 after some steps (the optimizer's state stays float32, as in eager)") {
    Run eager = fresh_run(adam, 9, mlp, at::kFloat), compiled = fresh_run(adam, 9, mlp, at::kFloat);
    train(eager, How::Eager, Builder().backend("interpreter"), 0, 3);
    train(compiled, How::Compiled, Builder().backend("interpreter"), 0, 3);
    for (Run* r : {&eager, &compiled}) {
      r->model.module->to(at::kDouble);
      r->dtype = at::kDouble;
    }
    for (int64_t i = 3; i < 6; ++i) {
      INFO("step " << i);
      REQUIRE_EQUAL_TENSORS(compiled_step(compiled, i, Builder().backend("interpreter")), eager_step(eager, i));
    }
    CHECK(compiled.step->num_compilations() == 2);
    require_same(compiled, eager, 0, 0);
  }
  SECTION("a parameter frozen after some steps keeps its state and count, as in eager") {
    Run eager = fresh_run(adam, 10), compiled = fresh_run(adam, 10);
    train(eager, How::Eager, Builder().backend("interpreter"), 0, 2);
    train(compiled, How::Compiled, Builder().backend("interpreter"), 0, 2);
    eager.model.module->parameters().front().requires_grad_(false);
    compiled.model.module->parameters().front().requires_grad_(false);
    train(eager, How::Eager, Builder().backend("interpreter"), 2, 3);
    train(compiled, How::Compiled, Builder().backend("interpreter"), 2, 3);
    CHECK(compiled.step->num_compilations() == 2);
    require_same(compiled, eager, 0, 0);
  }
  SECTION("a parameter replaced in the module is refused, and nothing changes") {
    Run r = fresh_run(adam, 11);
    train(r, How::Compiled, Builder().backend("interpreter"), 0, 1);
    // A new head, as transfer learning puts one in.
    r.model.module->replace_module("fc2", torch::nn::Linear(24, 10));
    const auto before = r.model.module->parameters().front().clone();
    REQUIRE_THROWS_WITH((*r.step)(batch(1)), CRUCIBLE_HAS_SUBSTR("parameters changed since compile_train_step"));
    REQUIRE_EQUAL_TENSORS(r.model.module->parameters().front(), before);
  }
  SECTION("a state loaded for other options or another model is refused, naming the parameter") {
    Run r = fresh_run(adam, 12);
    train(r, How::Compiled, Builder().backend("interpreter"), 0, 1);
    auto& state = static_cast<torch::optim::AdamParamState&>(
        *r.optimizer->state().at(r.model.module->parameters().front().unsafeGetTensorImpl()));
    const at::Tensor kept = state.exp_avg_sq();
    state.exp_avg_sq(at::Tensor());
    REQUIRE_THROWS_WITH((*r.step)(batch(1)), CRUCIBLE_HAS_SUBSTR("has no exp_avg_sq"));
    state.exp_avg_sq(at::zeros({3}));
    REQUIRE_THROWS_WITH((*r.step)(batch(1)), CRUCIBLE_HAS_SUBSTR("has sizes [3]"));
    state.exp_avg_sq(kept);
    (*r.step)(batch(1));
    CHECK(state.step() == 2);
  }
}

TEST_CASE("user state: on a GPU a module moved after the optimizer stepped is refused where eager's step fails",
          "[pipeline][user_state][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  auto adam = [](torch::nn::Module& m) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::Adam>(m.parameters(), torch::optim::AdamOptions(1e-2));
  };
  torch::manual_seed(13);
  Run r{mlp(), nullptr, std::nullopt, at::kFloat};
  r.optimizer = adam(*r.model.module);
  r.step = Builder().backend("interpreter").compile_train_step(r.model.module, *r.optimizer, loss_of(r.model));
  const std::vector<at::Tensor> b = batch(0, r.dtype);
  (*r.step)({b[0].cpu(), b[1].cpu()});
  r.model.module->to(at::kCUDA);
  REQUIRE_THROWS_WITH((*r.step)({b[0].cuda(), b[1].cuda()}), CRUCIBLE_HAS_SUBSTR("move the state"));
}
