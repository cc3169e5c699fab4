// What a caller gets from a compiled function has eager's layout: every
// output, every gradient autograd::grad returns and every .grad a backward
// fills has the sizes, strides and storage offset eager gives it, besides
// eager's values — for the feature extractor a new user compiles first, the
// zoo's models in eval() and train(), and a training step, through
// inductor::compile_fx, autograd::aot_module, the Builder and
// compile_train_step. Inductor's channels-last rewrite of convolutions is
// on (forced on a CPU, as it runs on a GPU): inside the graph values live
// channels-last, at its outputs they do not (Note [Eager's strides at the
// outputs] in inductor/src/fx_passes/layout_opt.cpp). CRUCIBLE_TEST_DEVICE=cuda runs
// the same on the GPU.
#include <crucible/autograd/aot_module.h>
#include <crucible/inductor/compile_fx.h>
#include <crucible/inductor/compile_fx_aot.h>
#include <crucible/models/zoo.h>
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/train_step.h>
#include <crucible/runtime/instruments.h>
#include <crucible/tracer/decomposition.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/nn.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "catch.h"
#include "testing.h"

using namespace crucible;
namespace nn = torch::nn;

namespace {

// float32, what users run. The compiled kernels sum in other orders than
// eager's (fused reductions, batch norm decomposed, oneDNN's channels-last
// convolutions against its NCHW ones): ~1e-7 relative per rounding, over
// sums of up to ~1e5 terms (a weight's gradient over every position of a
// batch), so an element near zero of a tensor of large elements is off by
// about 1e-5 of the largest. The bound is 1e-4 relative, and 1e-4 of the
// tensor's largest element absolute; a wrong value is off by its own scale.
constexpr double kRtol = 1e-4, kAtol = 1e-5;

void require_like_eager(const at::Tensor& got, const at::Tensor& expected) {
  const double largest = expected.numel() ? expected.detach().abs().max().item<double>() : 0.0;
  REQUIRE_LIKE_EAGER(got.detach(), expected.detach(), kRtol, kAtol + kRtol * largest);
}

inductor::InductorOptions layout_rewrite_on() {
  inductor::InductorOptions o;
  o.force_layout_optimization = true;
  return o;
}

// One way a caller compiles a module's function.
struct Entry {
  std::string name;
  std::function<autograd::AotModule(std::shared_ptr<nn::Module>, tracer::ModuleFn, const std::vector<at::Tensor>&)>
      compile;
};

pipeline::Builder inductor_builder() {
  return std::move(
      pipeline::Builder()
          .backend("interpreter")
          .decompositions(tracer::core_aten_decompositions())
          .backend("inductor, layout rewrite forced", [](const ir::Graph& g, const std::vector<at::Tensor>& examples) {
            return inductor::compile_fx_inner(g, examples, layout_rewrite_on());
          }));
}

std::vector<Entry> entries() {
  return {
      {"compile_fx, layout rewrite forced",
       [](auto m, auto fn, const auto& examples) {
         return inductor::compile_fx(std::move(m), std::move(fn), examples, layout_rewrite_on());
       }},
      {"compile_fx", [](auto m, auto fn,
                        const auto& examples) { return inductor::compile_fx(std::move(m), std::move(fn), examples); }},
      {"aot_module with compile_fx_config, layout rewrite forced",
       [](auto m, auto fn, const auto&) {
         return autograd::aot_module(std::move(m), std::move(fn), inductor::compile_fx_config(layout_rewrite_on()));
       }},
      {"Builder, inductor with the layout rewrite forced",
       [](auto m, auto fn, const auto&) { return inductor_builder().compile(std::move(m), std::move(fn)); }},
      {"Builder, interpreter",
       [](auto m, auto fn, const auto&) {
         return pipeline::Builder().backend("interpreter").compile(std::move(m), std::move(fn));
       }},
  };
}

// A module and its function, which may call the module it holds itself
// rather than the one it is given (the zoo's forward functions do; the
// compiled function swaps the same module's tensors).
struct Program {
  std::shared_ptr<nn::Module> module;
  tracer::ModuleFn fn;
};
using MakeProgram = std::function<Program()>;
// The loss a train-mode check differentiates, from the function's outputs.
using LossOf = std::function<at::Tensor(const std::vector<at::Tensor>& outputs)>;

// Two programs of make() (on the test device, in train() or eval()), one
// compiled by every entry, one run eagerly, on `inputs`: the outputs, and
// the module's buffers after the call, are eager's. In train(), the loss of
// the outputs is differentiated both ways: the gradient of each
// floating-point input (by autograd::grad, which hands over what the
// compiled backward returned) and every parameter's .grad are eager's too.
void compare_with_eager(const MakeProgram& make, const std::vector<at::Tensor>& inputs, bool train,
                        const LossOf& loss_of) {
  for (const Entry& e : entries()) {
    INFO(e.name << (train ? ", train()" : ", eval()"));
    const Program compiled_program = make(), eager_program = make();
    nn::Module &compiled = *compiled_program.module, &eager = *eager_program.module;
    models::copy_state(eager, compiled);
    compiled.train(train);
    eager.train(train);
    std::vector<at::Tensor> in_compiled, in_eager, differentiated;
    for (const at::Tensor& t : inputs) {
      const bool grad = train && at::isFloatingType(t.scalar_type());
      in_compiled.push_back(t.detach().clone(at::MemoryFormat::Preserve).requires_grad_(grad));
      in_eager.push_back(t.detach().clone(at::MemoryFormat::Preserve).requires_grad_(grad));
      if (grad) differentiated.push_back(in_compiled.back());
    }
    const std::vector<at::Tensor> expected = eager_program.fn(eager, in_eager);
    const std::vector<at::Tensor> got =
        e.compile(compiled_program.module, compiled_program.fn, in_compiled)(in_compiled);
    REQUIRE(got.size() == expected.size());
    for (size_t i = 0; i < got.size(); ++i) {
      INFO("output " << i);
      require_like_eager(got[i], expected[i]);
    }
    auto eager_buffers = eager.named_buffers();
    for (const auto& b : compiled.named_buffers()) {
      INFO("buffer " << b.key());
      require_like_eager(b.value(), eager_buffers[b.key()]);
    }
    if (!train) continue;
    std::vector<at::Tensor> eager_differentiated;
    for (const at::Tensor& t : in_eager)
      if (t.requires_grad()) eager_differentiated.push_back(t);
    std::vector<at::Tensor> params, eager_params;
    auto eager_named = eager.named_parameters();
    for (const auto& p : compiled.named_parameters()) {
      params.push_back(p.value());
      eager_params.push_back(eager_named[p.key()]);
    }
    const at::Tensor loss = loss_of(got), eager_loss = loss_of(expected);
    // The inputs' gradients as autograd::grad returns them, then the
    // parameters' through backward() (AccumulateGrad).
    if (!differentiated.empty()) {
      const auto input_grads = torch::autograd::grad({loss}, differentiated, {}, /*retain_graph=*/true);
      const auto eager_input_grads = torch::autograd::grad({eager_loss}, eager_differentiated, {}, true);
      for (size_t i = 0; i < input_grads.size(); ++i) {
        INFO("gradient of input " << i);
        require_like_eager(input_grads[i], eager_input_grads[i]);
      }
    }
    loss.backward();
    eager_loss.backward();
    for (size_t i = 0; i < params.size(); ++i) {
      INFO("gradient of parameter " << i);
      require_like_eager(params[i].grad(), eager_params[i].grad());
    }
  }
}

// A new user's first feature extractor: Conv2d, BatchNorm2d, ReLU, Conv2d,
// from [4, 3, 32, 32] images to [4, 32, 32, 32] features. The first
// convolution has no bias, as before any batch norm (in train() its
// gradient would be zero up to rounding, which no tolerance compares).
struct FeaturesImpl : nn::Module {
  FeaturesImpl()
      : conv1(register_module("conv1", nn::Conv2d(nn::Conv2dOptions(3, 16, 3).padding(1).bias(false)))),
        bn(register_module("bn", nn::BatchNorm2d(16))),
        conv2(register_module("conv2", nn::Conv2d(nn::Conv2dOptions(16, 32, 3).padding(1)))) {}
  at::Tensor forward(const at::Tensor& x) { return conv2->forward(at::relu(bn->forward(conv1->forward(x)))); }
  nn::Conv2d conv1;
  nn::BatchNorm2d bn;
  nn::Conv2d conv2;
};
TORCH_MODULE(Features);

Program make_features() {
  torch::manual_seed(0);
  auto m = Features().ptr();
  m->to(crucible::testing::test_device());
  return {m, [](nn::Module& module, const std::vector<at::Tensor>& in) {
            return std::vector<at::Tensor>{dynamic_cast<FeaturesImpl&>(module).forward(in[0])};
          }};
}

at::Tensor weighted_sum(const std::vector<at::Tensor>& outputs) {
  at::manual_seed(7);
  const at::Tensor w = at::randn(outputs[0].sizes()).to(outputs[0].device());
  return (outputs[0] * w).sum();
}

}  // namespace

TEST_CASE("output strides: the features of Conv2d, BatchNorm2d, ReLU, Conv2d come back as eager's, in eval and train",
          "[pipeline][programs][strides]") {
  if (crucible::testing::compile_only()) CRUCIBLE_SKIP("CUDA asked for and no GPU here");
  const crucible::testing::NoTf32Convolutions float32;
  at::manual_seed(1);
  const at::Tensor x = at::randn({4, 3, 32, 32}).to(crucible::testing::test_device());
  const int64_t rewrites = runtime::default_counters().get("inductor", "channels_last_rewrites");
  for (const bool train : {false, true}) compare_with_eager(make_features, {x}, train, weighted_sum);
  // The rewrite ran (forward, backward and inference graphs), or nothing was checked.
  CHECK(runtime::default_counters().get("inductor", "channels_last_rewrites") >= rewrites + 3);
  // What the user's next line does: flatten the features.
  for (const Entry& e : entries()) {
    INFO(e.name);
    const Program p = make_features();
    p.module->eval();
    const at::Tensor out = e.compile(p.module, p.fn, {x})({x}).at(0);
    REQUIRE(out.sizes() == at::IntArrayRef({4, 32, 32, 32}));
    REQUIRE_NOTHROW(out.view({4, -1}));
  }
}

TEST_CASE("output strides: every zoo model's logits and gradients are eager's, in eval and train",
          "[pipeline][programs][strides][zoo]") {
  if (crucible::testing::compile_only()) CRUCIBLE_SKIP("CUDA asked for and no GPU here");
  const crucible::testing::NoTf32Convolutions float32;
  const at::Device device = crucible::testing::test_device();
  for (const std::string& name : models::model_names()) {
    INFO(name);
    const MakeProgram make = [&name, device] {
      torch::manual_seed(0);
      models::Model m = models::make_model(name);
      m.module->to(device);
      return Program{m.module, [forward = m.forward](nn::Module&, const std::vector<at::Tensor>& in) {
                       return std::vector<at::Tensor>{forward(in[0])};
                     }};
    };
    const models::Model reference = models::make_model(name);
    const data::Batch b = reference.example_batch(4, 3);
    const LossOf loss = [&reference, targets = b.targets.to(device)](const std::vector<at::Tensor>& out) {
      return reference.loss(out[0], targets);
    };
    const int64_t rewrites = runtime::default_counters().get("inductor", "channels_last_rewrites");
    for (const bool train : {false, true}) compare_with_eager(make, {b.inputs.to(device)}, train, loss);
    const bool convolutions = name == "convnet" || name == "resnet18";
    CHECK((runtime::default_counters().get("inductor", "channels_last_rewrites") > rewrites) == convolutions);
  }
}

TEST_CASE(
    "output strides: a training step's loss, the module's state and the .grad of tensors the loss reads from outside "
    "are eager's",
    "[pipeline][programs][strides][train_step]") {
  if (crucible::testing::compile_only()) CRUCIBLE_SKIP("CUDA asked for and no GPU here");
  const crucible::testing::NoTf32Convolutions float32;
  const at::Device device = crucible::testing::test_device();
  for (const auto& [builder_name, builder] : {std::pair{"inductor, layout rewrite forced", inductor_builder()},
                                              std::pair{"interpreter", pipeline::Builder().backend("interpreter")}})
    for (const std::string name : {"convnet", "resnet18"}) {
      INFO(name << " through " << builder_name);
      torch::manual_seed(0);
      models::Model compiled = models::make_model(name), eager = models::make_model(name);
      compiled.module->to(device);
      eager.module->to(device);
      models::copy_state(*eager.module, *compiled.module);
      // Tensors the loss reads from outside the module (lifted), whose
      // gradients the step accumulates into their .grad: a class-mixing
      // matrix stored transposed (its .grad is laid out as it is, as
      // AccumulateGrad lays it out), and the weight of a convolution over
      // the images and their squares (whose gradient the rewrite computes
      // channels-last; its .grad is contiguous, as eager's).
      at::manual_seed(2);
      const at::Tensor mix = at::randn({10, 10}).to(device).t().requires_grad_();
      const at::Tensor probe = at::randn({4, 2, 3, 3}).to(device).requires_grad_();
      const at::Tensor eager_mix = mix.detach().clone(at::MemoryFormat::Preserve).requires_grad_();
      const at::Tensor eager_probe = probe.detach().clone().requires_grad_();
      REQUIRE(mix.strides() == at::IntArrayRef({1, 10}));
      const auto loss_fn = [](const models::Model& m, const at::Tensor& w, const at::Tensor& p) {
        return [&m, w, p](nn::Module&, const std::vector<at::Tensor>& batch) {
          const at::Tensor& x = batch.at(0);
          return m.loss(m.forward(x).mm(w), batch.at(1)) + at::conv2d(at::cat({x, x * x}, 1), p).pow(2).mean();
        };
      };
      torch::optim::SGD compiled_opt(compiled.module->parameters(), torch::optim::SGDOptions(0.05));
      torch::optim::SGD eager_opt(eager.module->parameters(), torch::optim::SGDOptions(0.05));
      pipeline::TrainStep step =
          builder.compile_train_step(compiled.module, compiled_opt, loss_fn(compiled, mix, probe));
      const int64_t rewrites = runtime::default_counters().get("inductor", "channels_last_rewrites");
      for (int64_t i = 0; i < 2; ++i) {
        INFO("step " << i);
        const data::Batch b = compiled.example_batch(4, static_cast<uint64_t>(i));
        const at::Tensor x = b.inputs.to(device), y = b.targets.to(device);
        const at::Tensor loss = step({x, y});
        eager_opt.zero_grad();
        const at::Tensor eager_loss = loss_fn(eager, eager_mix, eager_probe)(*eager.module, {x, y});
        eager_loss.backward();
        eager_opt.step();
        require_like_eager(loss, eager_loss);
        require_like_eager(mix.grad(), eager_mix.grad());
        require_like_eager(probe.grad(), eager_probe.grad());
      }
      const bool inductor = builder.backend_name() != "interpreter";
      CHECK((runtime::default_counters().get("inductor", "channels_last_rewrites") > rewrites) == inductor);
      auto eager_params = eager.module->named_parameters();
      for (const auto& p : compiled.module->named_parameters()) {
        INFO("parameter " << p.key());
        require_like_eager(p.value(), eager_params[p.key()]);
      }
      auto eager_buffers = eager.module->named_buffers();
      for (const auto& b : compiled.module->named_buffers()) {
        INFO("buffer " << b.key());
        require_like_eager(b.value(), eager_buffers[b.key()]);
      }
    }
}
