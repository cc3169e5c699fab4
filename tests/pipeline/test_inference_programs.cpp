// Inference programs as LibTorch users write them, compiled and compared with
// eager LibTorch on the same inputs: modules in eval() called under
// c10::InferenceMode (the idiomatic guard) and torch::NoGradGuard, with
// inputs made inside and outside the guard, compiled inside and outside it,
// then the same callable called outside with inputs that require grad;
// vision models written in C++ as torchvision writes them (a BasicBlock
// ResNet with a downsample path, MobileNet-style blocks with depthwise
// convolutions and squeeze-excitation, a U-Net-style decoder with
// ConvTranspose2d, interpolate and cat skips, dilated convolutions,
// channels-last inputs, batch size 1 and odd spatial sizes); and outputs of
// every kind (several, aliases of inputs, views of intermediates, integer
// indices, bool masks). Each program goes through every builder of
// builders() (Builder::compile on the module: aot_module), through
// inductor::compile_fx (also with the channels-last rewrite of
// convolutions forced, as a GPU runs it) and through autograd::aot_module,
// in float32, what users run, and in float64 where a tight check says more;
// every output has eager's values and eager's sizes, strides and offset.
#include <crucible/autograd/aot_module.h>
#include <crucible/inductor/compile_fx_aot.h>
#include <crucible/pipeline/builder.h>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/nn.h>
#include <torch/utils.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "catch.h"
#include "programs_testing.h"
#include "testing.h"

using namespace crucible::pipeline;
using namespace crucible::testing::programs;
namespace nn = torch::nn;
namespace F = torch::nn::functional;
namespace autograd = crucible::autograd;

namespace {

// Tolerances. float64: the compiled kernels compute what eager computes, in
// another order of summation at most (fused reductions, batch norm
// decomposed), ~1e-15 relative; a wrong op or a wrong statistic is off by
// the values' own scale. float32: the same reorderings at ~6e-8 per rounding,
// over reductions of a few hundred terms (convolutions' channels × taps,
// pooled means) on values of order 1: 1e-4 relative with 1e-5 absolute for
// values near zero is well above that noise and far below any real error.
constexpr double kF32Rtol = 1e-4, kF32Atol = 1e-5;

double rtol_for(const at::Tensor& t) { return t.scalar_type() == at::kDouble ? kRtol : kF32Rtol; }
double atol_for(const at::Tensor& t) { return t.scalar_type() == at::kDouble ? kAtol : kF32Atol; }

// Every output close to eager's, and laid out as eager's (sizes, strides,
// storage offset: Note [Eager's strides at the outputs] in
// inductor/src/fx_passes/layout_opt.cpp).
void require_outputs_like_eager(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& expected) {
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("output " << i);
    if (at::isFloatingType(expected[i].scalar_type()))
      REQUIRE_LIKE_EAGER(got[i], expected[i], rtol_for(expected[i]), atol_for(expected[i]));
    else
      REQUIRE_LIKE_EAGER(got[i], expected[i], 0.0, 0.0);
  }
}

// Gives a module's batch norms running statistics and affine parameters
// unlike their initial ones (mean 0, variance 1, weight 1, bias 0), so that
// eval mode's use of the running statistics shows in the outputs.
void randomize_batch_norms(nn::Module& m, int64_t seed) {
  torch::NoGradGuard no_grad;
  at::manual_seed(seed);
  for (auto& b : m.named_buffers()) {
    const std::string& name = b.key();
    if (name.size() >= 12 && name.compare(name.size() - 12, 12, "running_mean") == 0)
      b.value().copy_(at::randn_like(b.value()) * 0.5);
    else if (name.size() >= 11 && name.compare(name.size() - 11, 11, "running_var") == 0)
      b.value().copy_(at::rand_like(b.value()) + 0.5);
  }
  for (auto& p : m.named_parameters()) {
    const std::string& name = p.key();
    const bool bn_weight = name.find("bn") != std::string::npos || name.find("norm") != std::string::npos;
    if (bn_weight && p.value().dim() == 1) p.value().copy_(at::rand_like(p.value()) + 0.5);
  }
}

// An inference program: a module factory and how it is called.
using MakeModule = std::function<std::shared_ptr<nn::Module>()>;

// Every compiled form of `fn` over `module`: each builder's compile (as the
// caller's SECTION picks it), compile_fx for the inductor builder (also with
// the layout rewrite forced), and autograd::aot_module with the default
// config.
struct Compiled {
  std::string name;
  std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)> call;
};

std::vector<Compiled> compile_all(const Builder& b, const std::shared_ptr<nn::Module>& module,
                                  const crucible::tracer::ModuleFn& fn, const std::vector<at::Tensor>& example) {
  std::vector<Compiled> out;
  autograd::AotModule m = b.compile(module, fn);
  out.push_back({"Builder::compile", [m](const std::vector<at::Tensor>& in) { return m(in); }});
  if (b.backend_name() == "inductor") {
    autograd::AotModule fx = crucible::inductor::compile_fx(module, fn, example);
    out.push_back({"compile_fx", [fx](const std::vector<at::Tensor>& in) { return fx(in); }});
    // The channels-last rewrite of convolutions, which a GPU runs, on any device.
    crucible::inductor::InductorOptions rewrite;
    rewrite.force_layout_optimization = true;
    autograd::AotModule forced = crucible::inductor::compile_fx(module, fn, example, rewrite);
    out.push_back(
        {"compile_fx, layout rewrite forced", [forced](const std::vector<at::Tensor>& in) { return forced(in); }});
    autograd::AotModule aot = crucible::autograd::aot_module(module, fn);
    out.push_back({"aot_module", [aot](const std::vector<at::Tensor>& in) { return aot(in); }});
  }
  return out;
}

// A small classifier: convolution, batch norm, ReLU, global average pool,
// flatten, linear.
struct SmallNetImpl : nn::Module {
  SmallNetImpl()
      : conv(register_module("conv", nn::Conv2d(nn::Conv2dOptions(3, 4, 3).padding(1).bias(false)))),
        bn(register_module("bn", nn::BatchNorm2d(4))),
        fc(register_module("fc", nn::Linear(4, 5))) {}
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = at::relu(bn->forward(conv->forward(x)));
    return fc->forward(at::adaptive_avg_pool2d(y, {1, 1}).flatten(1));
  }
  nn::Conv2d conv;
  nn::BatchNorm2d bn;
  nn::Linear fc;
};
TORCH_MODULE(SmallNet);

std::shared_ptr<SmallNetImpl> small_net(at::ScalarType dtype) {
  torch::manual_seed(0);
  auto m = SmallNet().ptr();
  randomize_batch_norms(*m, 1);
  m->to(crucible::testing::test_device(), dtype);
  m->eval();
  return m;
}

std::vector<at::Tensor> small_net_fn(nn::Module& m, const std::vector<at::Tensor>& in) {
  return {dynamic_cast<SmallNetImpl&>(m).forward(in[0])};
}

at::Tensor randn_on_device(at::IntArrayRef sizes, at::ScalarType dtype, int64_t seed) {
  at::manual_seed(seed);
  return at::randn(sizes, at::TensorOptions(dtype)).to(crucible::testing::test_device());
}

// `body` with every builder (for_each_backend), in float32 and in float64.
void for_each_backend_and_dtype(const std::function<void(const Builder&, at::ScalarType)>& body) {
  if (crucible::testing::compile_only()) CRUCIBLE_SKIP("CUDA asked for and no GPU here");
  for_each_backend([&body](const Builder& b) {
    for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {
      INFO("dtype " << dtype);
      body(b, dtype);
    }
  });
}

}  // namespace

TEST_CASE(
    "inference programs: an eval() module called under InferenceMode and NoGradGuard, inputs made inside "
    "and outside the guard",
    "[pipeline][programs]") {
  for_each_backend_and_dtype([](const Builder& b, at::ScalarType dtype) {
    auto m = small_net(dtype);
    const at::Tensor x = randn_on_device({2, 3, 5, 5}, dtype, 2);
    std::vector<at::Tensor> expected;
    {
      c10::InferenceMode guard;
      expected = small_net_fn(*m, {x});
    }
    for (const Compiled& c : compile_all(b, m, small_net_fn, {x})) {
      INFO(c.name);
      {
        c10::InferenceMode guard;
        // An inference tensor made inside the guard, and a normal one.
        const at::Tensor x_inference = x.clone();
        REQUIRE(x_inference.is_inference());
        require_outputs_like_eager(c.call({x_inference}), expected);
        require_outputs_like_eager(c.call({x}), expected);
      }
      {
        torch::NoGradGuard no_grad;
        const std::vector<at::Tensor> out = c.call({x});
        require_outputs_like_eager(out, expected);
        CHECK_FALSE(out[0].requires_grad());
      }
      // Outside any guard: as eager, the output requires grad (the
      // parameters do).
      const std::vector<at::Tensor> out = c.call({x});
      require_outputs_like_eager(out, expected);
      CHECK(out[0].requires_grad());
    }
  });
}

TEST_CASE(
    "inference programs: a module compiled inside InferenceMode or NoGradGuard, then called outside the guard "
    "with inputs that require grad",
    "[pipeline][programs]") {
  if (crucible::testing::compile_only()) CRUCIBLE_SKIP("CUDA asked for and no GPU here");
  for_each_backend([](const Builder& b) {
    const at::ScalarType dtype = at::kDouble;
    auto m = small_net(dtype);
    const at::Tensor x = randn_on_device({2, 3, 5, 5}, dtype, 2);
    // Eager's values and gradients.
    const at::Tensor x_eager = x.clone().requires_grad_();
    const at::Tensor expected = m->forward(x_eager);
    (expected * expected).sum().backward();
    std::vector<at::Tensor> expected_grads{x_eager.grad().clone()};
    for (const at::Tensor& p : m->parameters()) expected_grads.push_back(p.grad().clone());
    for (const bool inference_mode : {true, false}) {
      INFO((inference_mode ? "compiled under InferenceMode" : "compiled under NoGradGuard"));
      std::vector<Compiled> compiled;
      {
        std::optional<c10::InferenceMode> inference;
        std::optional<torch::NoGradGuard> no_grad;
        if (inference_mode)
          inference.emplace();
        else
          no_grad.emplace();
        const at::Tensor example = x.clone();
        compiled = compile_all(b, m, small_net_fn, {example});
        // The first call compiles here, inside the guard, on an inference tensor.
        for (const Compiled& c : compiled) require_outputs_like_eager(c.call({example}), {expected.detach()});
      }
      for (const Compiled& c : compiled) {
        INFO(c.name);
        for (const at::Tensor& p : m->parameters()) p.mutable_grad() = at::Tensor();
        const at::Tensor xg = x.clone().requires_grad_();
        const std::vector<at::Tensor> out = c.call({xg});
        require_outputs_like_eager(out, {expected.detach()});
        REQUIRE(out[0].requires_grad());
        (out[0] * out[0]).sum().backward();
        REQUIRE(xg.grad().defined());
        REQUIRE_LIKE_EAGER(xg.grad(), expected_grads[0], kRtol, kAtol);
        size_t i = 1;
        for (const at::Tensor& p : m->parameters()) {
          REQUIRE(p.grad().defined());
          REQUIRE_LIKE_EAGER(p.grad(), expected_grads[i++], kRtol, kAtol);
        }
      }
    }
  });
}

namespace {

// --- vision models, written as torchvision writes them ----------------------------

nn::Conv2d conv(int64_t in, int64_t out, int64_t k, int64_t stride = 1, int64_t padding = 0, int64_t groups = 1,
                int64_t dilation = 1, bool bias = false) {
  return nn::Conv2d(
      nn::Conv2dOptions(in, out, k).stride(stride).padding(padding).groups(groups).dilation(dilation).bias(bias));
}

// torchvision's BasicBlock: two 3x3 convolutions with batch norms, the
// identity added in place, ReLU in place; a 1x1 convolution and batch norm
// on the identity path where the stride or the width changes.
struct BasicBlockImpl : nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1(register_module("conv1", conv(in, out, 3, stride, 1))),
        bn1(register_module("bn1", nn::BatchNorm2d(out))),
        conv2(register_module("conv2", conv(out, out, 3, 1, 1))),
        bn2(register_module("bn2", nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out)
      downsample = register_module("downsample", nn::Sequential(conv(in, out, 1, stride), nn::BatchNorm2d(out)));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor identity = x;
    at::Tensor out = bn1->forward(conv1->forward(x));
    out.relu_();
    out = bn2->forward(conv2->forward(out));
    if (downsample) identity = downsample->forward(x);
    out += identity;
    return out.relu_();
  }
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::Conv2d conv2;
  nn::BatchNorm2d bn2;
  nn::Sequential downsample{nullptr};
};
TORCH_MODULE(BasicBlock);

// A two-stage ResNet: stem (3x3 convolution, batch norm, ReLU, 3x3 max pool
// of stride 2), a block at one width, a downsampling block, global average
// pool, flatten, linear.
struct TinyResNetImpl : nn::Module {
  TinyResNetImpl()
      : conv1(register_module("conv1", conv(3, 8, 3, 1, 1))),
        bn1(register_module("bn1", nn::BatchNorm2d(8))),
        maxpool(register_module("maxpool", nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).padding(1)))),
        layer1(register_module("layer1", BasicBlock(8, 8, 1))),
        layer2(register_module("layer2", BasicBlock(8, 16, 2))),
        avgpool(register_module("avgpool", nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions({1, 1})))),
        flatten(register_module("flatten", nn::Flatten())),
        fc(register_module("fc", nn::Linear(16, 10))) {}
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = maxpool->forward(bn1->forward(conv1->forward(x)).relu());
    y = layer2->forward(layer1->forward(y));
    return fc->forward(flatten->forward(avgpool->forward(y)));
  }
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::MaxPool2d maxpool;
  BasicBlock layer1, layer2;
  nn::AdaptiveAvgPool2d avgpool;
  nn::Flatten flatten;
  nn::Linear fc;
};
TORCH_MODULE(TinyResNet);

// Squeeze-excitation as MobileNetV3/EfficientNet write it: global average
// pool, 1x1 reduce, ReLU, 1x1 expand, a sigmoid (or hard sigmoid) gate
// multiplied into the input.
struct SqueezeExcitationImpl : nn::Module {
  SqueezeExcitationImpl(int64_t channels, int64_t squeeze, bool hard)
      : avgpool(register_module("avgpool", nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions(1)))),
        fc1(register_module("fc1", conv(channels, squeeze, 1, 1, 0, 1, 1, true))),
        fc2(register_module("fc2", conv(squeeze, channels, 1, 1, 0, 1, 1, true))),
        hard_(hard) {}
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor scale = fc2->forward(at::relu(fc1->forward(avgpool->forward(x))));
    scale = hard_ ? at::hardsigmoid(scale) : at::sigmoid(scale);
    return scale * x;
  }
  nn::AdaptiveAvgPool2d avgpool;
  nn::Conv2d fc1, fc2;
  bool hard_;
};
TORCH_MODULE(SqueezeExcitation);

enum class Act { Hardswish, SiLU, ReLU6 };

at::Tensor activate(Act act, const at::Tensor& x) {
  switch (act) {
    case Act::Hardswish:
      return at::hardswish(x);
    case Act::SiLU:
      return at::silu(x);
    case Act::ReLU6:
      return at::hardtanh(x, 0, 6);
  }
  return x;
}

// MobileNet's inverted residual: 1x1 expand, batch norm, activation; 3x3
// depthwise (groups = channels), batch norm, activation; squeeze-excitation;
// 1x1 project, batch norm; the input added where shapes allow.
struct InvertedResidualImpl : nn::Module {
  InvertedResidualImpl(int64_t in, int64_t hidden, int64_t out, int64_t stride, int64_t dilation, Act act, bool se,
                       bool hard_gate)
      : expand(register_module("expand", conv(in, hidden, 1))),
        expand_bn(register_module("expand_bn", nn::BatchNorm2d(hidden))),
        depthwise(register_module("depthwise", conv(hidden, hidden, 3, stride, dilation, hidden, dilation))),
        depthwise_bn(register_module("depthwise_bn", nn::BatchNorm2d(hidden))),
        project(register_module("project", conv(hidden, out, 1))),
        project_bn(register_module("project_bn", nn::BatchNorm2d(out))),
        act_(act),
        residual_(stride == 1 && in == out) {
    if (se) squeeze = register_module("se", SqueezeExcitation(hidden, hidden / 4, hard_gate));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = activate(act_, expand_bn->forward(expand->forward(x)));
    y = activate(act_, depthwise_bn->forward(depthwise->forward(y)));
    if (squeeze) y = squeeze->forward(y);
    y = project_bn->forward(project->forward(y));
    return residual_ ? y + x : y;
  }
  nn::Conv2d expand;
  nn::BatchNorm2d expand_bn;
  nn::Conv2d depthwise;
  nn::BatchNorm2d depthwise_bn;
  nn::Conv2d project;
  nn::BatchNorm2d project_bn;
  SqueezeExcitation squeeze{nullptr};
  Act act_;
  bool residual_;
};
TORCH_MODULE(InvertedResidual);

// A MobileNet-style network: a strided stem with Hardswish, blocks with
// each activation (one with a dilated depthwise convolution), a classifier
// of Flatten, Linear, Hardswish (nn::Functional: LibTorch has no
// nn::Hardswish), Dropout (identity in eval) and Linear.
struct TinyMobileNetImpl : nn::Module {
  TinyMobileNetImpl()
      : stem(register_module("stem", conv(3, 8, 3, 2, 1))),
        stem_bn(register_module("stem_bn", nn::BatchNorm2d(8))),
        blocks(register_module("blocks", nn::Sequential(InvertedResidual(8, 16, 8, 1, 1, Act::Hardswish, true, true),
                                                        InvertedResidual(8, 24, 12, 2, 1, Act::SiLU, true, false),
                                                        InvertedResidual(12, 24, 12, 1, 2, Act::ReLU6, false, false)))),
        pool(register_module("pool", nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions(1)))),
        classifier(register_module("classifier",
                                   nn::Sequential(nn::Flatten(), nn::Linear(12, 16),
                                                  nn::Functional([](const at::Tensor& t) { return at::hardswish(t); }),
                                                  nn::Dropout(0.2), nn::Linear(16, 7)))) {}
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = at::hardswish(stem_bn->forward(stem->forward(x)));
    return classifier->forward(pool->forward(blocks->forward(y)));
  }
  nn::Conv2d stem;
  nn::BatchNorm2d stem_bn;
  nn::Sequential blocks;
  nn::AdaptiveAvgPool2d pool;
  nn::Sequential classifier;
};
TORCH_MODULE(TinyMobileNet);

// A U-Net-style encoder-decoder: a dilated convolution, max pools down, a
// ConvTranspose2d up, skips joined by cat after resizing to the skip's size
// (odd sizes: the pools floor), bilinear interpolation with and without
// align_corners, nearest by a scale factor, and a sigmoid mask beside the
// logits.
struct TinyUNetImpl : nn::Module {
  TinyUNetImpl()
      : enc1(register_module("enc1", conv(3, 8, 3, 1, 2, 1, 2, true))),
        enc2(register_module("enc2", conv(8, 16, 3, 1, 1, 1, 1, true))),
        bottleneck(register_module("bottleneck", conv(16, 16, 3, 1, 1, 1, 1, true))),
        up2(register_module("up2", nn::ConvTranspose2d(nn::ConvTranspose2dOptions(16, 16, 2).stride(2)))),
        dec2(register_module("dec2", conv(32, 8, 3, 1, 1, 1, 1, true))),
        dec1(register_module("dec1", conv(16, 8, 3, 1, 1, 1, 1, true))),
        head(register_module("head", conv(8, 2, 1, 1, 0, 1, 1, true))) {}
  std::vector<at::Tensor> forward(const at::Tensor& x) {
    const at::Tensor s1 = at::relu(enc1->forward(x));                      // [N, 8, H, W]
    const at::Tensor s2 = at::relu(enc2->forward(at::max_pool2d(s1, 2)));  // [N, 16, H/2, W/2]
    at::Tensor y = at::relu(bottleneck->forward(at::max_pool2d(s2, 2)));   // [N, 16, H/4, W/4]
    y = up2->forward(y);                                                   // [N, 16, 2(H/4), 2(W/4)]
    y = F::interpolate(y, F::InterpolateFuncOptions()
                              .size(std::vector<int64_t>{s2.size(2), s2.size(3)})
                              .mode(torch::kBilinear)
                              .align_corners(false));
    y = at::relu(dec2->forward(at::cat({y, s2}, 1)));  // [N, 8, H/2, W/2]
    y = F::interpolate(y, F::InterpolateFuncOptions()
                              .size(std::vector<int64_t>{s1.size(2), s1.size(3)})
                              .mode(torch::kBilinear)
                              .align_corners(true));
    y = at::relu(dec1->forward(at::cat({y, s1}, 1)));  // [N, 8, H, W]
    const at::Tensor logits = head->forward(y);
    const at::Tensor big = F::interpolate(
        logits, F::InterpolateFuncOptions().scale_factor(std::vector<double>{2, 2}).mode(torch::kNearest));
    return {logits, at::sigmoid(logits), big};
  }
  nn::Conv2d enc1, enc2, bottleneck;
  nn::ConvTranspose2d up2;
  nn::Conv2d dec2, dec1, head;
};
TORCH_MODULE(TinyUNet);

template <class M>
crucible::tracer::ModuleFn forward_of() {
  return [](nn::Module& m, const std::vector<at::Tensor>& in) -> std::vector<at::Tensor> {
    auto out = dynamic_cast<M&>(m).forward(in[0]);
    if constexpr (std::is_same_v<decltype(out), at::Tensor>)
      return {out};
    else
      return out;
  };
}

// Compiles `fn` over a module in eval mode with every form of compile_all,
// and compares with eager on each input of `inputs` (one compilation for
// each input shape and memory format), under InferenceMode and under
// NoGradGuard.
void compare_in_eval(const Builder& b, const std::shared_ptr<nn::Module>& m, const crucible::tracer::ModuleFn& fn,
                     const std::vector<at::Tensor>& inputs) {
  m->eval();
  for (const Compiled& c : compile_all(b, m, fn, {inputs.at(0)})) {
    INFO(c.name);
    for (size_t i = 0; i < inputs.size(); ++i) {
      INFO("input " << i << " " << inputs[i].sizes() << " strides " << inputs[i].strides());
      std::vector<at::Tensor> expected;
      {
        c10::InferenceMode guard;
        expected = fn(*m, {inputs[i]});
        require_outputs_like_eager(c.call({inputs[i]}), expected);
      }
      torch::NoGradGuard no_grad;
      require_outputs_like_eager(c.call({inputs[i]}), expected);
    }
  }
}

// The inputs each vision model is run on: in float32, batch 2 at an even
// size, batch 1 at odd sizes, and a channels-last batch; in float64 (the
// tight check; each input is a compilation of its own, whose kernels the
// C++ compiler builds cold in seconds) the odd sizes alone.
std::vector<at::Tensor> vision_inputs(at::ScalarType dtype) {
  if (dtype == at::kDouble) return {randn_on_device({1, 3, 13, 11}, dtype, 4)};
  return {randn_on_device({2, 3, 16, 16}, dtype, 3), randn_on_device({1, 3, 13, 11}, dtype, 4),
          randn_on_device({2, 3, 15, 17}, dtype, 5).contiguous(at::MemoryFormat::ChannelsLast)};
}

template <class M>
std::shared_ptr<nn::Module> make_model(at::ScalarType dtype) {
  torch::manual_seed(0);
  std::shared_ptr<nn::Module> m = std::make_shared<M>();
  randomize_batch_norms(*m, 1);
  m->to(crucible::testing::test_device(), dtype);
  return m;
}

// Module M in eval() through every builder, in float32 and float64, on
// the vision inputs.
template <typename M>
void compare_vision_model() {
  for_each_backend_and_dtype([](const Builder& b, at::ScalarType dtype) {
    compare_in_eval(b, make_model<M>(dtype), forward_of<M>(), vision_inputs(dtype));
  });
}

}  // namespace

TEST_CASE("inference programs: a BasicBlock ResNet with a downsample path, in eval", "[pipeline][programs]") {
  compare_vision_model<TinyResNetImpl>();
}

TEST_CASE(
    "inference programs: MobileNet-style blocks (depthwise and dilated convolutions, Hardswish, SiLU, ReLU6, "
    "squeeze-excitation), in eval",
    "[pipeline][programs]") {
  compare_vision_model<TinyMobileNetImpl>();
}

TEST_CASE(
    "inference programs: a U-Net-style decoder (ConvTranspose2d, bilinear and nearest interpolation, cat skips), "
    "in eval",
    "[pipeline][programs]") {
  compare_vision_model<TinyUNetImpl>();
}

namespace {

// --- outputs of every kind --------------------------------------------------------

// Every compiled form of a function of tensors: the builder's compile
// (aot_function), and compile_fx for the inductor builder.
std::vector<Compiled> compile_fn_all(const Builder& b, const crucible::tracer::TensorFn& fn,
                                     const std::vector<at::Tensor>& example) {
  std::vector<Compiled> out;
  autograd::AotFunction f = b.compile(fn);
  out.push_back({"Builder::compile(fn)", [f](const std::vector<at::Tensor>& in) { return f(in); }});
  if (b.backend_name() == "inductor") {
    autograd::AotFunction fx = crucible::inductor::compile_fx(fn, example);
    out.push_back({"compile_fx(fn)", [fx](const std::vector<at::Tensor>& in) { return fx(in); }});
  }
  return out;
}

// Which outputs alias which inputs and each other, as eager's do: a caller
// writing through an output that is (a view of) an input sees the write in
// the input, and one writing into a view of another output sees it there.
void require_same_aliasing(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& expected,
                           const std::vector<at::Tensor>& inputs) {
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("output " << i);
    for (size_t k = 0; k < inputs.size(); ++k) {
      INFO("input " << k);
      REQUIRE(got[i].is_alias_of(inputs[k]) == expected[i].is_alias_of(inputs[k]));
      if (expected[i].is_alias_of(inputs[k])) {
        CHECK(got[i].strides() == expected[i].strides());
        CHECK(got[i].storage_offset() == expected[i].storage_offset());
      }
    }
    for (size_t j = 0; j < i; ++j) {
      INFO("and output " << j);
      REQUIRE(got[i].is_alias_of(got[j]) == expected[i].is_alias_of(expected[j]));
    }
  }
}

// The inputs followed by the module's parameters and buffers: what outputs
// may alias.
std::vector<at::Tensor> with_state(const nn::Module& m, std::vector<at::Tensor> inputs) {
  for (const at::Tensor& t : crucible::autograd::module_state(m)) inputs.push_back(t);
  return inputs;
}

// A classifier's head whose forward returns everything a caller might
// want: its input itself and a view of it, the logits and their transpose
// (a view of another output), a slice of a hidden intermediate (a view of
// a tensor not returned), argmax, topk values and indices, a bool mask, the
// input again through the calls that return it itself or a view of it
// (detach, contiguous, a `to` that changes nothing, reshape), the logits
// twice and detached, and views of a parameter.
struct HeadImpl : nn::Module {
  HeadImpl() : fc1(register_module("fc1", nn::Linear(6, 8))), fc2(register_module("fc2", nn::Linear(8, 5))) {}
  std::vector<at::Tensor> forward(const at::Tensor& x) {
    const at::Tensor hidden = at::gelu(fc1->forward(x));
    const at::Tensor logits = fc2->forward(hidden);
    auto [values, indices] = logits.topk(3, /*dim=*/1);
    return {x,
            x.view({-1}),
            logits,
            logits.t(),
            hidden.narrow(1, 2, 3),
            logits.argmax(1),
            values,
            indices,
            logits > 0,
            x[0],
            x.detach(),
            x.contiguous(),
            x.to(x.scalar_type()),
            x.reshape({2, -1}),
            logits,
            logits.detach(),
            fc2->weight.t(),
            fc1->bias};
  }
  nn::Linear fc1, fc2;
};
TORCH_MODULE(Head);

}  // namespace

TEST_CASE(
    "inference programs: outputs that are the input, views of it, views of intermediates, argmax and topk indices, "
    "bool masks",
    "[pipeline][programs]") {
  for_each_backend_and_dtype([](const Builder& b, at::ScalarType dtype) {
    torch::manual_seed(0);
    auto m = Head().ptr();
    m->to(crucible::testing::test_device(), dtype);
    m->eval();
    const crucible::tracer::ModuleFn fn = forward_of<HeadImpl>();
    const at::Tensor x = randn_on_device({4, 6}, dtype, 7);
    for (const Compiled& c : compile_all(b, m, fn, {x})) {
      INFO(c.name);
      {
        c10::InferenceMode guard;
        const at::Tensor xi = x.clone();
        const std::vector<at::Tensor> expected = fn(*m, {xi});
        const std::vector<at::Tensor> got = c.call({xi});
        require_outputs_like_eager(got, expected);
        require_same_aliasing(got, expected, with_state(*m, {xi}));
      }
      {
        torch::NoGradGuard no_grad;
        const std::vector<at::Tensor> expected = fn(*m, {x});
        const std::vector<at::Tensor> got = c.call({x});
        require_outputs_like_eager(got, expected);
        require_same_aliasing(got, expected, with_state(*m, {x}));
      }
      const std::vector<at::Tensor> expected = fn(*m, {x});
      const std::vector<at::Tensor> got = c.call({x});
      require_outputs_like_eager(got, expected);
      require_same_aliasing(got, expected, with_state(*m, {x}));
      for (size_t i = 0; i < got.size(); ++i) {
        INFO("output " << i);
        CHECK(got[i].requires_grad() == expected[i].requires_grad());
      }
    }
    // The same as a function of tensors, the weights passed in.
    const crucible::tracer::TensorFn tfn = [](const std::vector<at::Tensor>& in) -> std::vector<at::Tensor> {
      const at::Tensor hidden = at::gelu(at::linear(in[0], in[1]));
      const at::Tensor logits = at::mm(hidden, in[2]);
      auto [values, indices] = logits.topk(2, /*dim=*/0);
      return {in[0],  in[0].t(), logits,         logits.t(), hidden.narrow(1, 1, 2), logits.argmax(1),
              values, indices,   logits.ge(0.5), in[2][1]};
    };
    const std::vector<at::Tensor> in{x, randn_on_device({8, 6}, dtype, 8), randn_on_device({8, 5}, dtype, 9)};
    for (const Compiled& c : compile_fn_all(b, tfn, in)) {
      INFO(c.name);
      c10::InferenceMode guard;
      const std::vector<at::Tensor> expected = tfn(in);
      const std::vector<at::Tensor> got = c.call(in);
      require_outputs_like_eager(got, expected);
      require_same_aliasing(got, expected, in);
    }
  });
}

namespace {

// torchvision's preprocessing done in place on the batch (x.sub_(mean).div_(std)),
// then a classifier head: the input is written by the compiled call.
std::vector<at::Tensor> normalize_in_place(const std::vector<at::Tensor>& in) {
  in[0].sub_(in[1]).div_(in[2]);
  return {at::softmax(at::mm(in[0].flatten(1), in[3]), 1)};
}

}  // namespace

TEST_CASE(
    "inference programs: a function normalizing its input in place, under InferenceMode and NoGradGuard: the input "
    "written as eager writes it, its version bumped, an inference tensor refused outside the guard",
    "[pipeline][programs]") {
  if (crucible::testing::compile_only()) CRUCIBLE_SKIP("CUDA asked for and no GPU here");
  for_each_backend([](const Builder& b) {
    const at::ScalarType dtype = at::kDouble;
    const at::Tensor batch = randn_on_device({2, 3, 4, 4}, dtype, 10);
    const at::Tensor mean = randn_on_device({1, 3, 1, 1}, dtype, 11);
    const at::Tensor std = randn_on_device({1, 3, 1, 1}, dtype, 12).abs() + 0.5;
    const at::Tensor w = randn_on_device({48, 5}, dtype, 13);
    // compile_fx keeps the write in the inference graph, where a loop
    // kernel writes the input's memory (Note [In-place write-backs]).
    for (const Compiled& c : compile_fn_all(b, normalize_in_place, {batch.clone(), mean, std, w})) {
      INFO(c.name);
      for (const bool inference_mode : {true, false}) {
        INFO((inference_mode ? "InferenceMode" : "NoGradGuard"));
        const at::Tensor x_eager = batch.clone(), x = batch.clone();
        std::vector<at::Tensor> expected, got;
        {
          std::optional<c10::InferenceMode> inference;
          std::optional<torch::NoGradGuard> no_grad;
          if (inference_mode)
            inference.emplace();
          else
            no_grad.emplace();
          expected = normalize_in_place({x_eager, mean, std, w});
          got = c.call({x, mean, std, w});
        }
        require_outputs_like_eager(got, expected);
        REQUIRE_CLOSE(x, x_eager, kRtol, kAtol);
      }
      // A tensor autograd saved before the call and written by it: eager's
      // backward refuses to read it changed; so must the compiled call's.
      const at::Tensor scale = randn_on_device({2, 3, 4, 4}, dtype, 14).requires_grad_();
      const at::Tensor saved = batch.clone();
      const at::Tensor loss = (scale * saved).sum();  // saves `saved` for scale's gradient
      const int64_t version = saved._version();
      {
        torch::NoGradGuard no_grad;
        c.call({saved, mean, std, w});
      }
      CHECK(saved._version() > version);
      REQUIRE_THROWS_WITH(loss.backward(), CRUCIBLE_HAS_SUBSTR("modified by an inplace operation"));
      // An inference tensor written outside InferenceMode: refused as eager
      // refuses it.
      at::Tensor inference;
      {
        c10::InferenceMode guard;
        inference = batch.clone();
      }
      torch::NoGradGuard no_grad;
      REQUIRE_THROWS_WITH(normalize_in_place({inference, mean, std, w}),
                          CRUCIBLE_HAS_SUBSTR("Inplace update to inference tensor outside InferenceMode"));
      REQUIRE_THROWS_WITH(c.call({inference, mean, std, w}),
                          CRUCIBLE_HAS_SUBSTR("Inplace update to inference tensor outside InferenceMode"));
    }
  });
}

TEST_CASE(
    "inference programs: batch norm statistics recalibrated in train() under InferenceMode and NoGradGuard, "
    "Monte Carlo dropout under InferenceMode",
    "[pipeline][programs]") {
  if (crucible::testing::compile_only()) CRUCIBLE_SKIP("CUDA asked for and no GPU here");
  for_each_backend([](const Builder& b) {
    const at::ScalarType dtype = at::kDouble;
    // Recalibration: the module in train() under a no-grad guard; batch
    // statistics normalize, the running ones are updated in the module.
    for (const bool inference_mode : {true, false}) {
      INFO((inference_mode ? "InferenceMode" : "NoGradGuard"));
      auto compiled = small_net(dtype), eager = small_net(dtype);
      compiled->train();
      eager->train();
      const at::Tensor x = randn_on_device({3, 3, 5, 5}, dtype, 15);
      for (const Compiled& c : compile_all(b, compiled, small_net_fn, {x})) {
        INFO(c.name);
        std::optional<c10::InferenceMode> inference;
        std::optional<torch::NoGradGuard> no_grad;
        if (inference_mode)
          inference.emplace();
        else
          no_grad.emplace();
        const at::Tensor xi = x.clone();
        require_outputs_like_eager(c.call({xi}), small_net_fn(*eager, {xi}));
        require_same_state(*compiled, *eager);
      }
    }
    // Monte Carlo dropout: dropout left on at inference, each call drawing
    // from the generator as eager draws.
    crucible::tracer::ModuleFn mc = [](nn::Module& m, const std::vector<at::Tensor>& in) {
      const at::Tensor h = at::dropout(dynamic_cast<SmallNetImpl&>(m).forward(in[0]), 0.5, /*train=*/true);
      return std::vector<at::Tensor>{h, at::softmax(h, 1)};
    };
    auto m = small_net(dtype);
    const at::Tensor x = randn_on_device({4, 3, 5, 5}, dtype, 16);
    for (const Compiled& c : compile_all(b, m, mc, {x})) {
      INFO(c.name);
      c10::InferenceMode guard;
      for (int64_t i = 0; i < 2; ++i) {
        torch::manual_seed(20 + i);
        const std::vector<at::Tensor> expected = mc(*m, {x});
        const at::Tensor next_expected = at::rand({4}, x.options());
        torch::manual_seed(20 + i);
        require_outputs_like_eager(c.call({x}), expected);
        REQUIRE_EQUAL_TENSORS(at::rand({4}, x.options()), next_expected);  // the generator left as eager left it
      }
    }
  });
}
