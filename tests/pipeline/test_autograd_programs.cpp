// Autograd semantics in user programs, compiled against eager LibTorch:
// custom torch::autograd::Function<T>s (a correct derivative; backwards that
// are deliberately not the forward's derivative: a straight-through
// estimator and a gradient reversal layer; mark_non_differentiable,
// needs_input_grad and an undefined input), tensor hooks on intermediates,
// retain_grad, detach and no-grad regions inside the forward,
// torch::autograd::grad for a subset of inputs, and state changed after
// compilation (a parameter frozen and unfrozen, train()/eval() switched).
// Each goes through compile_train_step with every builder of builders()
// (the pre-grad builder runs the loss's forward as a traced graph: Note
// [Pre-grad graphs that autograd cannot replay] in pipeline/src/builder.cpp)
// and, where it is a function, through Builder::compile (aot_function) and
// inductor::compile_fx; values, gradients and updated parameters must equal
// eager's in float64.
#include <crucible/autograd/aot_module.h>
#include <crucible/inductor/compile_fx_aot.h>
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/train_step.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "catch.h"
#include "programs_testing.h"
#include "testing.h"

using namespace crucible::pipeline;
using namespace crucible::testing::programs;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// --- custom autograd functions -------------------------------------------------

// LibTorch's autograd tutorial's LinearFunction: a correct derivative, its
// tensors saved with save_for_backward, each gradient computed only where
// needs_input_grad says so; `bias` may be None (std::nullopt: a C++ custom
// Function takes no undefined at::Tensor).
struct LinearFunction : torch::autograd::Function<LinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias) {
    ctx->save_for_backward({input, weight});
    ctx->saved_data["has_bias"] = bias.has_value();
    at::Tensor out = input.mm(weight.t());
    if (bias) out += bias->unsqueeze(0).expand_as(out);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &input = saved[0], &weight = saved[1];
    const at::Tensor& g = grad_outputs[0];
    at::Tensor grad_input, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) grad_input = g.mm(weight);
    if (ctx->needs_input_grad(1)) grad_weight = g.t().mm(input);
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) grad_bias = g.sum(0);
    return {grad_input, grad_weight, grad_bias};
  }
};

// The tutorial's MulConstant: a C++ number and a tensor in saved_data.
struct MulConstant : torch::autograd::Function<MulConstant> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, double constant) {
    ctx->saved_data["constant"] = constant;
    ctx->saved_data["x"] = x;
    return x * constant;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    // d(x * c)/dx = c; the saved x only checks it came back.
    TORCH_CHECK(ctx->saved_data["x"].toTensor().defined(), "MulConstant: saved x is gone");
    return {grad_outputs[0] * ctx->saved_data["constant"].toDouble(), at::Tensor()};
  }
};

// A straight-through estimator: forward rounds, backward passes the gradient
// through unchanged (round's own derivative is zero).
struct RoundSte : torch::autograd::Function<RoundSte> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x) { return at::round(x); }
  static variable_list backward(AutogradContext*, variable_list grad_outputs) { return {grad_outputs[0]}; }
};

// A gradient reversal layer (domain-adversarial training): forward is the
// identity (a view of its input), backward is -lambda * grad.
struct GradReverse : torch::autograd::Function<GradReverse> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, double lambda) {
    ctx->saved_data["lambda"] = lambda;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    return {grad_outputs[0] * -ctx->saved_data["lambda"].toDouble(), at::Tensor()};
  }
};

// Sorted values and their indices, the indices marked non-differentiable
// and saved for the backward's scatter.
struct SortValues : torch::autograd::Function<SortValues> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x) {
    auto [values, indices] = x.sort(1, /*descending=*/true);
    ctx->mark_non_differentiable({indices});
    ctx->save_for_backward({indices});
    return {values, indices};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor indices = ctx->get_saved_variables()[0];
    return {at::zeros_like(grad_outputs[0]).scatter(1, indices, grad_outputs[0])};
  }
};

// --- the programs -------------------------------------------------------------

struct TwoLayerImpl : torch::nn::Module {
  TwoLayerImpl()
      : fc1(register_module("fc1", torch::nn::Linear(6, 8))), fc2(register_module("fc2", torch::nn::Linear(8, 3))) {}
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(TwoLayer);

TwoLayerImpl& two(torch::nn::Module& m) { return dynamic_cast<TwoLayerImpl&>(m); }

Batch regression_batch(int64_t i) { return Batch{f64_randn({5, 6}, i), f64_randn({5, 3}, 1000 + i)}; }

// A builder given pre-grad passes must say why it skipped them (Note
// [Pre-grad graphs that autograd cannot replay]); `skipped_for` names the
// custom Function or hook. Empty: it must not skip them. A backend's own
// passes (the inductor's) are skipped quietly.
void require_pre_grad_warning(const Builder& b, const crucible::testing::CollectWarnings& w,
                              const std::string& skipped_for) {
  bool warned = false;
  for (const std::string& m : w.messages)
    warned |= m.find("pre-grad passes skipped") != std::string::npos && m.find(skipped_for) != std::string::npos;
  INFO("expected a warning naming '" << skipped_for << "'");
  CHECK(warned == (b.pre_grad_passes_chosen() && !b.pre_grad_passes().empty() && !skipped_for.empty()));
}

void train_each(const LossFn& loss, const std::string& skipped_for = "") {
  for_each_backend([&](const Builder& b) {
    crucible::testing::CollectWarnings w;
    train_and_compare([] { return TwoLayer().ptr(); }, adam(1e-2), loss, regression_batch, 4, b);
    require_pre_grad_warning(b, w, skipped_for);
  });
}

// Runs `fn` compiled by `compile` and eagerly on copies of `inputs` (those
// that require grad still do), then backward of a weighted sum of the
// outputs that require grad; outputs and every input's gradient must agree.
void function_and_compare(const crucible::tracer::TensorFn& fn, const std::vector<at::Tensor>& inputs,
                          const std::function<crucible::tracer::TensorFn(crucible::tracer::TensorFn)>& compile) {
  auto copies = [&] {
    std::vector<at::Tensor> c;
    for (const at::Tensor& t : inputs) c.push_back(t.detach().clone().requires_grad_(t.requires_grad()));
    return c;
  };
  const std::vector<at::Tensor> ci = copies(), ei = copies();
  const std::vector<at::Tensor> co = compile(fn)(ci), eo = fn(ei);
  REQUIRE(co.size() == eo.size());
  at::Tensor cl = at::zeros({}, at::kDouble), el = at::zeros({}, at::kDouble);
  for (size_t k = 0; k < co.size(); ++k) {
    INFO("output " << k);
    REQUIRE_LIKE_EAGER(co[k].detach(), eo[k].detach(), kRtol, kAtol);
    REQUIRE(co[k].requires_grad() == eo[k].requires_grad());
    if (!eo[k].requires_grad()) continue;
    const at::Tensor w = at::linspace(0.5, 1.5, eo[k].numel(), at::kDouble).view(eo[k].sizes());
    cl = cl + (co[k] * w).sum();
    el = el + (eo[k] * w).sum();
  }
  cl.backward();
  el.backward();
  for (size_t k = 0; k < ei.size(); ++k) {
    INFO("gradient of input " << k);
    REQUIRE(ci[k].grad().defined() == ei[k].grad().defined());
    if (ei[k].grad().defined()) REQUIRE_LIKE_EAGER(ci[k].grad(), ei[k].grad(), kRtol, kAtol);
  }
}

// `fn` through Builder::compile with every builder and through compile_fx.
void function_each(const crucible::tracer::TensorFn& fn, const std::vector<at::Tensor>& inputs,
                   const std::string& skipped_for = "") {
  for (const auto& [name, builder] : builders()) SECTION("compile: " + name) {
      crucible::testing::CollectWarnings w;
      function_and_compare(fn, inputs, [&b = builder](crucible::tracer::TensorFn f) {
        return crucible::tracer::TensorFn(b.compile(std::move(f)));
      });
      require_pre_grad_warning(builder, w, skipped_for);
    }
  SECTION("compile_fx") {
    function_and_compare(fn, inputs, [&inputs](crucible::tracer::TensorFn f) {
      return crucible::tracer::TensorFn(crucible::inductor::compile_fx(std::move(f), inputs));
    });
  }
}

}  // namespace

// --- 1. custom autograd functions ---------------------------------------------

TEST_CASE("autograd programs: a custom Function with its own correct derivative (save_for_backward, saved_data)",
          "[pipeline][programs]") {
  SECTION("in a training step") {
    train_each(
        [](torch::nn::Module& m, const Batch& b) {
          TwoLayerImpl& n = two(m);
          at::Tensor h = LinearFunction::apply(b[0], n.fc1->weight, n.fc1->bias);
          h = MulConstant::apply(at::tanh(h), 1.5);
          return (LinearFunction::apply(h, n.fc2->weight, n.fc2->bias) - b[1]).pow(2).mean();
        },
        "LinearFunction has a backward of its own");
  }
  SECTION("in a function") {
    crucible::tracer::TensorFn fn = [](const std::vector<at::Tensor>& in) {
      return std::vector<at::Tensor>{MulConstant::apply(at::tanh(LinearFunction::apply(in[0], in[1], in[2])), -2.0)};
    };
    function_each(fn,
                  {f64_randn({4, 6}, 1).requires_grad_(), f64_randn({3, 6}, 2).requires_grad_(),
                   f64_randn({3}, 3).requires_grad_()},
                  "MulConstant has a backward of its own");
  }
}

TEST_CASE("autograd programs: custom backwards that are not the forward's derivative (straight-through, reversal)",
          "[pipeline][programs]") {
  SECTION("straight-through estimator in a training step") {
    train_each(
        [](torch::nn::Module& m, const Batch& b) {
          TwoLayerImpl& n = two(m);
          const at::Tensor q = RoundSte::apply(at::tanh(n.fc1->forward(b[0])) * 4) / 4;  // 2-bit-ish activations
          return (n.fc2->forward(q) - b[1]).pow(2).mean();
        },
        "RoundSte has a backward of its own");
  }
  SECTION("gradient reversal in a training step") {
    train_each(
        [](torch::nn::Module& m, const Batch& b) {
          TwoLayerImpl& n = two(m);
          const at::Tensor features = at::tanh(n.fc1->forward(b[0]));
          const at::Tensor domain = n.fc2->forward(GradReverse::apply(features, 0.7));
          return (domain - b[1]).pow(2).mean() + 0.1 * features.pow(2).mean();
        },
        "GradReverse has a backward of its own");
  }
  SECTION("both in a function") {
    crucible::tracer::TensorFn fn = [](const std::vector<at::Tensor>& in) {
      const at::Tensor h = at::tanh(in[0].mm(in[1]));
      return std::vector<at::Tensor>{RoundSte::apply(h * 3), GradReverse::apply(h, 0.5) * in[0].sum(1, true)};
    };
    function_each(fn, {f64_randn({4, 5}, 1).requires_grad_(), f64_randn({5, 3}, 2).requires_grad_()},
                  "has a backward of its own");
  }
}

TEST_CASE("autograd programs: mark_non_differentiable, needs_input_grad and an undefined input of a custom Function",
          "[pipeline][programs]") {
  SECTION("in a training step") {
    train_each(
        [](torch::nn::Module& m, const Batch& b) {
          TwoLayerImpl& n = two(m);
          // The batch does not require grad (needs_input_grad(0) is false); the
          // second layer's bias is passed as None and added outside.
          const variable_list sorted =
              SortValues::apply(at::tanh(LinearFunction::apply(b[0], n.fc1->weight, n.fc1->bias)));
          REQUIRE_FALSE(sorted[1].requires_grad());
          const at::Tensor out = LinearFunction::apply(sorted[0], n.fc2->weight, std::nullopt) + n.fc2->bias;
          return (out - b[1]).pow(2).mean() + 0.01 * sorted[1].select(1, 0).to(at::kDouble).mean();
        },
        "LinearFunction has a backward of its own");
  }
  SECTION("in a function") {
    crucible::tracer::TensorFn fn = [](const std::vector<at::Tensor>& in) {
      const variable_list sorted = SortValues::apply(LinearFunction::apply(in[0], in[1], std::nullopt));
      return std::vector<at::Tensor>{sorted[0].pow(2), sorted[1]};
    };
    function_each(fn, {f64_randn({4, 6}, 1), f64_randn({5, 6}, 2).requires_grad_()},
                  "SortValues has a backward of its own");
  }
}

// --- 2. hooks, retain_grad, detach, no-grad regions, grad of a subset ---------------

TEST_CASE("autograd programs: tensor hooks on intermediates (scaling, clipping) and retain_grad inside the loss",
          "[pipeline][programs]") {
  SECTION("in a training step") {
    train_each(
        [](torch::nn::Module& m, const Batch& b) {
          TwoLayerImpl& n = two(m);
          at::Tensor h = n.fc1->forward(b[0]);
          h.register_hook([](const at::Tensor& g) { return g.clamp(-0.01, 0.01); });
          at::Tensor a = at::tanh(h);
          a.retain_grad();
          a.register_hook([](const at::Tensor& g) { return g * 3; });
          return (n.fc2->forward(a) - b[1]).pow(2).mean();
        },
        "a hook is registered on an intermediate tensor (the output of TanhBackward0)");
  }
  SECTION("in a function") {
    crucible::tracer::TensorFn fn = [](const std::vector<at::Tensor>& in) {
      at::Tensor h = in[0].mm(in[1]);
      h.register_hook([](const at::Tensor& g) { return g * -2; });
      return std::vector<at::Tensor>{at::sigmoid(h)};
    };
    function_each(fn, {f64_randn({4, 5}, 1).requires_grad_(), f64_randn({5, 3}, 2).requires_grad_()},
                  "a hook is registered on an intermediate tensor (the output of MmBackward0)");
  }
}

TEST_CASE("autograd programs: detach, NoGradGuard and AutoGradMode(false) regions inside the loss",
          "[pipeline][programs]") {
  train_each([](torch::nn::Module& m, const Batch& b) {
    TwoLayerImpl& n = two(m);
    const at::Tensor h = at::tanh(n.fc1->forward(b[0]));
    at::Tensor scale, shift;
    {
      torch::NoGradGuard no_grad;
      scale = n.fc1->forward(b[0]).abs().mean();  // a constant of the step's gradient
    }
    {
      at::AutoGradMode off(false);
      shift = n.fc2->forward(h).mean(0);
    }
    const at::Tensor out = n.fc2->forward(h / (1 + scale)) - shift + 0.5 * n.fc2->forward(h.detach());
    return (out - b[1]).pow(2).mean();
  });
}

TEST_CASE("autograd programs: torch::autograd::grad of a subset of the inputs", "[pipeline][programs]") {
  SECTION("inside the loss: a penalty on the gradient of the first layer's weight only") {
    train_each([](torch::nn::Module& m, const Batch& b) {
      TwoLayerImpl& n = two(m);
      const at::Tensor fit = (n.fc2->forward(at::tanh(n.fc1->forward(b[0]))) - b[1]).pow(2).mean();
      const at::Tensor g = torch::autograd::grad({fit}, {n.fc1->weight}, {}, /*retain_graph=*/true,
                                                 /*create_graph=*/true)[0];
      return fit + 0.1 * g.pow(2).sum();
    });
  }
  SECTION("of a compiled function's output, for one of its two inputs") {
    crucible::tracer::TensorFn fn = [](const std::vector<at::Tensor>& in) {
      return std::vector<at::Tensor>{at::tanh(in[0].mm(in[1])).sum()};
    };
    for (const auto& [name, builder] : builders()) SECTION(name) {
        const at::Tensor x = f64_randn({4, 5}, 1).requires_grad_(), w = f64_randn({5, 3}, 2).requires_grad_();
        const at::Tensor out = builder.compile(fn)({x, w})[0];
        const at::Tensor gw = torch::autograd::grad({out}, {w})[0];
        const at::Tensor xe = x.detach().clone().requires_grad_(), we = w.detach().clone().requires_grad_();
        const at::Tensor ge = torch::autograd::grad(fn({xe, we}), {we})[0];
        REQUIRE_LIKE_EAGER(gw, ge, kRtol, kAtol);
        REQUIRE_FALSE(x.grad().defined());
        REQUIRE_FALSE(w.grad().defined());
      }
  }
}

// --- 3. state changed after compilation ------------------------------------------

TEST_CASE("autograd programs: a parameter frozen after the step compiled, then unfrozen", "[pipeline][programs]") {
  // Eager's frozen parameter gets no gradient, so torch::optim skips it
  // (Adam's moments too); the step must see requires_grad_(false) and
  // compile again, and go back to its first compilation once unfrozen.
  auto toggle = [](int64_t step, torch::optim::Optimizer& opt) {
    const at::Tensor& w = opt.param_groups()[0].params()[0];  // fc1.weight
    if (step == 2) w.requires_grad_(false);
    if (step == 4) w.requires_grad_(true);
  };
  for (const auto& [opt_name, opt] :
       std::vector<std::pair<std::string, MakeOptimizer>>{{"adam", adam(1e-2)}, {"sgd", sgd(0.1, 0.9)}})
    SECTION(opt_name) {
      for_each_backend([&](const Builder& b) {
        auto loss = [](torch::nn::Module& m, const Batch& batch) {
          TwoLayerImpl& n = two(m);
          return (n.fc2->forward(at::tanh(n.fc1->forward(batch[0]))) - batch[1]).pow(2).mean();
        };
        train_and_compare([] { return TwoLayer().ptr(); }, opt, loss, regression_batch, 6, b, 2, toggle);
      });
    }
}

namespace {

// fc1 has no bias: batch norm subtracts the batch mean right after it, so
// in training mode a bias's exact gradient is zero, and Adam would scale
// the rounding noise left in its place up to steps of the learning rate
// (seen on a GPU, whose kernels round otherwise than eager's).
struct DropNormImpl : torch::nn::Module {
  DropNormImpl()
      : fc1(register_module("fc1", torch::nn::Linear(torch::nn::LinearOptions(6, 8).bias(false)))),
        bn(register_module("bn", torch::nn::BatchNorm1d(8))),
        drop(register_module("drop", torch::nn::Dropout(0.3))),
        fc2(register_module("fc2", torch::nn::Linear(8, 3))) {}
  at::Tensor forward(const at::Tensor& x) {
    return fc2->forward(drop->forward(at::relu(bn->forward(fc1->forward(x)))));
  }
  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d bn;
  torch::nn::Dropout drop;
  torch::nn::Linear fc2;
};
TORCH_MODULE(DropNorm);

}  // namespace

TEST_CASE("autograd programs: train()/eval() switched after the step compiled (dropout, batch norm)",
          "[pipeline][programs]") {
  // Both modules are switched before steps 2 (eval) and 4 (train again).
  for_each_backend([](const Builder& b) {
    auto made = std::make_shared<std::vector<std::shared_ptr<torch::nn::Module>>>();
    MakeModule make = [made] {
      auto m = DropNorm().ptr();
      made->push_back(m);
      return m;
    };
    auto mode = [made](int64_t step, torch::optim::Optimizer&) {
      for (const auto& m : *made) {
        if (step == 2) m->eval();
        if (step == 4) m->train();
      }
    };
    LossFn loss = [](torch::nn::Module& m, const Batch& batch) {
      return (dynamic_cast<DropNormImpl&>(m).forward(batch[0]) - batch[1]).pow(2).mean();
    };
    train_and_compare(make, adam(1e-2), loss, regression_batch, 6, b, 2, mode);
  });
}

TEST_CASE("autograd programs: train()/eval() and requires_grad switched after aot_module and compile_fx compiled",
          "[pipeline][programs]") {
  using Compile = std::function<crucible::autograd::AotModule(
      std::shared_ptr<torch::nn::Module>, crucible::tracer::ModuleFn, const std::vector<at::Tensor>&)>;
  std::vector<std::pair<std::string, Compile>> compilers;
  for (const auto& [name, builder] : builders())
    compilers.emplace_back("compile(module): " + name, [b = builder](auto m, auto fn, const auto&) {
      return b.compile(std::move(m), std::move(fn));
    });
  compilers.emplace_back("compile_fx", [](auto m, auto fn, const auto& examples) {
    return crucible::inductor::compile_fx(std::move(m), std::move(fn), examples);
  });
  for (const auto& [name, compile] : compilers) SECTION(name) {
      torch::manual_seed(0);
      auto compiled = DropNorm().ptr(), eager = DropNorm().ptr();
      compiled->to(at::kDouble);
      eager->to(at::kDouble);
      copy_all(*compiled, *eager);
      crucible::tracer::ModuleFn fn = [](torch::nn::Module& m, const std::vector<at::Tensor>& in) {
        return std::vector<at::Tensor>{dynamic_cast<DropNormImpl&>(m).forward(in[0]).pow(2).mean()};
      };
      const at::Tensor x = f64_randn({5, 6}, 7);
      crucible::autograd::AotModule step = compile(compiled, fn, {x});
      // Each call: the loss and the gradients it accumulates, as eager's.
      auto call = [&](const std::string& what) {
        INFO(what);
        torch::manual_seed(3);
        const at::Tensor lc = step({x})[0];
        torch::manual_seed(3);
        const at::Tensor le = fn(*eager, {x})[0];
        REQUIRE_LIKE_EAGER(lc.detach(), le.detach(), kRtol, kAtol);
        lc.backward();
        le.backward();
        require_same_state(*compiled, *eager);
        auto pe = eager->named_parameters();
        for (const auto& p : compiled->named_parameters()) {
          INFO("gradient of " << p.key());
          REQUIRE(p.value().grad().defined() == pe[p.key()].grad().defined());
          if (p.value().grad().defined()) REQUIRE_LIKE_EAGER(p.value().grad(), pe[p.key()].grad(), kRtol, kAtol);
        }
      };
      call("train");
      compiled->eval();
      eager->eval();
      call("eval");
      compiled->train();
      eager->train();
      call("train again");
      for (auto* m : {compiled.get(), eager.get()}) dynamic_cast<DropNormImpl&>(*m).fc1->weight.requires_grad_(false);
      call("fc1.weight frozen");
      for (auto* m : {compiled.get(), eager.get()}) dynamic_cast<DropNormImpl&>(*m).fc1->weight.requires_grad_(true);
      call("fc1.weight unfrozen");
    }
}

TEST_CASE("autograd programs: a module the loss reads from outside (name_module) switched to eval after compiling",
          "[pipeline][programs]") {
  // A GAN's generator step reads the discriminator, named to the builder;
  // its batch norm switched to eval (running statistics, no update) after
  // two steps must reach the compiled step as it reaches eager's.
  for_each_backend([](const Builder& b) {
    auto make_disc = [] {
      return torch::nn::Sequential(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4), torch::nn::Tanh(),
                                   torch::nn::Linear(4, 1));
    };
    torch::manual_seed(1);
    const std::shared_ptr<torch::nn::SequentialImpl> dc = make_disc().ptr(), de = make_disc().ptr();
    // On the device train_and_compare trains on (CRUCIBLE_TEST_DEVICE).
    dc->to(crucible::testing::test_device(), at::kDouble);
    de->to(crucible::testing::test_device(), at::kDouble);
    copy_all(*dc, *de);
    // The generator made first is the compiled one (train_and_compare).
    auto made = std::make_shared<std::vector<std::shared_ptr<torch::nn::Module>>>();
    MakeModule make = [made] {
      auto m = torch::nn::Sequential(torch::nn::Linear(6, 3)).ptr();
      made->push_back(m);
      return m;
    };
    LossFn loss = [made, dc, de](torch::nn::Module& m, const Batch& batch) {
      torch::nn::SequentialImpl& d = &m == made->at(0).get() ? *dc : *de;
      return d.forward(dynamic_cast<torch::nn::SequentialImpl&>(m).forward(batch[0])).mean();
    };
    auto mode = [dc, de](int64_t step, torch::optim::Optimizer&) {
      if (step == 2) {
        dc->eval();
        de->eval();
      }
    };
    Builder named = b;
    named.name_module("disc", dc);
    train_and_compare(make, sgd(0.1), loss, regression_batch, 4, named, 2, mode);
    require_same_state(*dc, *de);
  });
}

TEST_CASE("autograd programs: aot_module_simplified refuses a call after a module it reads was switched to eval",
          "[pipeline][programs]") {
  // One compilation, kept: the switch cannot compile again, so it is refused
  // rather than run with the training-mode batch norm.
  torch::manual_seed(2);
  auto gen = torch::nn::Linear(6, 3).ptr();
  auto disc = torch::nn::Sequential(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4), torch::nn::Linear(4, 1)).ptr();
  auto disc_eager = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(disc->clone());
  gen->to(at::kDouble);
  disc->to(at::kDouble);
  disc_eager->to(at::kDouble);
  auto fn_over = [](std::shared_ptr<torch::nn::SequentialImpl> d) {
    return [d](torch::nn::Module& m, const std::vector<at::Tensor>& in) {
      return std::vector<at::Tensor>{d->forward(dynamic_cast<torch::nn::LinearImpl&>(m).forward(in[0])).mean()};
    };
  };
  Builder b = Builder().backend("interpreter");
  b.name_module("disc", disc);
  const at::Tensor x = f64_randn({5, 6}, 4);
  auto compiled = crucible::autograd::aot_module_simplified(gen, fn_over(disc), {x}, b.aot_config());
  REQUIRE_LIKE_EAGER(compiled({x})[0].detach(), fn_over(disc_eager)(*gen, {x})[0].detach(), kRtol, kAtol);
  require_same_state(*disc, *disc_eager);  // the running statistics, updated once each
  disc->eval();
  REQUIRE_THROWS_WITH(compiled({x}), CRUCIBLE_HAS_SUBSTR("train()/eval()"));
}
