// The model zoo: every model builds by name, runs forward on its example
// batch with the documented shapes, trains (finite loss, gradients for every
// parameter), and the GPT is causal with its head tied to the embedding.
#include <crucible/models/error.h>
#include <crucible/models/zoo.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "catch.h"
#include "testing.h"

using namespace crucible::models;
using namespace crucible::data;

TEST_CASE("every zoo model runs forward and backward on its example batch", "[pipeline][zoo]") {
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"mlp", {4, 10}}, {"convnet", {4, 10}}, {"gpt", {4, 32, 64}}, {"resnet18", {4, 10}}};
  REQUIRE(model_names().size() == expected.size());
  for (const auto& [name, shape] : expected) {
    INFO(name);
    at::manual_seed(0);
    Model m = make_model(name);
    REQUIRE(m.name == name);
    Batch b = m.example_batch(4, 1);
    at::Tensor logits = m.forward(b.inputs);
    REQUIRE(logits.sizes() == at::IntArrayRef(shape));
    at::Tensor loss = m.loss(logits, b.targets);
    REQUIRE(loss.dim() == 0);
    // Untrained logits are near uniform: the loss is about log(classes).
    const double uniform = std::log(static_cast<double>(shape.back()));
    REQUIRE(std::abs(loss.item<double>() - uniform) < 0.5 * uniform);
    loss.backward();
    for (const auto& p : m.module->named_parameters()) {
      INFO(p.key());
      REQUIRE(p.value().grad().defined());
      REQUIRE(p.value().grad().isfinite().all().item<bool>());
    }
    // The example batch is seeded: the same seed, the same batch.
    REQUIRE_EQUAL_TENSORS(m.example_batch(4, 1).inputs, b.inputs);
  }
  REQUIRE_THROWS_WITH(make_model("vgg"), CRUCIBLE_HAS_SUBSTR("mlp, convnet, gpt, resnet18"));
}

TEST_CASE("the zoo models compute what their layers compute", "[pipeline][zoo]") {
  SECTION("mlp is Linear-ReLU-Linear-ReLU-Linear on the flattened image") {
    at::manual_seed(0);
    Model m = make_mlp({.hidden = {32, 16}});
    auto p = m.module->named_parameters();
    at::Tensor x = m.example_batch(3, 2).inputs;
    at::Tensor h = at::relu(at::linear(x.view({3, 784}), p["fc1.weight"], p["fc1.bias"]));
    h = at::relu(at::linear(h, p["fc2.weight"], p["fc2.bias"]));
    // Same ops on the same operands: bitwise.
    REQUIRE_EQUAL_TENSORS(m.forward(x), at::linear(h, p["fc3.weight"], p["fc3.bias"]));
  }
  SECTION("convnet follows LibTorch's MNIST example, deterministic without dropout") {
    at::manual_seed(0);
    Model m = make_convnet();
    auto p = m.module->named_parameters();
    REQUIRE(p.size() == 8);  // conv1, conv2, fc1, fc2: weight and bias each
    at::Tensor x = m.example_batch(2, 3).inputs;
    at::Tensor y = at::relu(at::max_pool2d(at::conv2d(x, p["conv1.weight"], p["conv1.bias"]), {2, 2}));
    y = at::relu(at::max_pool2d(at::conv2d(y, p["conv2.weight"], p["conv2.bias"]), {2, 2})).view({2, 320});
    y = at::linear(at::relu(at::linear(y, p["fc1.weight"], p["fc1.bias"])), p["fc2.weight"], p["fc2.bias"]);
    m.module->train();  // no dropout by default, so train mode is deterministic too
    REQUIRE_EQUAL_TENSORS(m.forward(x), y);
    REQUIRE_EQUAL_TENSORS(m.forward(x), m.forward(x));
  }
  SECTION("gpt is causal, ties its head, and refuses over-long sequences") {
    at::manual_seed(0);
    Model m = make_gpt();
    auto p = m.module->named_parameters();
    REQUIRE(p.contains("wte.weight"));
    for (const auto& item : p) REQUIRE(item.key().find("lm_head") == std::string::npos);
    REQUIRE(m.module->named_buffers().contains("h.0.attn.bias"));
    // nanoGPT's init: N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 * 2 layers)),
    // zero biases, LayerNorm weights one (std margins: ~4000+ samples each).
    REQUIRE(std::abs(p["wte.weight"].std().item<double>() - 0.02) < 2e-3);
    REQUIRE(std::abs(p["h.1.mlp.c_proj.weight"].std().item<double>() - 0.01) < 1e-3);
    REQUIRE(p["h.0.attn.c_attn.bias"].abs().max().item<double>() == 0);
    REQUIRE_EQUAL_TENSORS(p["ln_f.weight"].detach(), at::ones({64}));
    // Tokens after position 9 cannot change the logits at positions <= 9.
    at::Tensor a = m.example_batch(2, 5).inputs;
    at::Tensor b = a.clone();
    b.slice(1, 10).random_(0, 64);
    at::Tensor la = m.forward(a), lb = m.forward(b);
    REQUIRE_EQUAL_TENSORS(la.slice(1, 0, 10), lb.slice(1, 0, 10));
    REQUIRE_FALSE(at::equal(la.slice(1, 10), lb.slice(1, 10)));
    // Shorter sequences work; longer than block_size do not.
    REQUIRE(m.forward(a.slice(1, 0, 7)).sizes() == at::IntArrayRef{2, 7, 64});
    REQUIRE_THROWS_WITH(m.forward(at::zeros({1, 33}, at::kLong)), CRUCIBLE_HAS_SUBSTR("block_size 32"));
    REQUIRE_THROWS_AS(make_gpt({.n_head = 3}), crucible::models::ModelError);
  }
  SECTION("resnet18 has 4 stages of 2 BasicBlocks and BatchNorm buffers that train mode updates") {
    at::manual_seed(0);
    Model m = make_resnet({.in_channels = 3, .image_size = 20, .width = 8});
    REQUIRE(m.example_batch(2, 0).inputs.sizes() == at::IntArrayRef{2, 3, 20, 20});
    auto buffers = m.module->named_buffers();
    REQUIRE(buffers.contains("layers.7.bn2.running_mean"));
    REQUIRE(buffers.contains("layers.2.downsample_bn.running_var"));
    REQUIRE_FALSE(buffers.contains("layers.1.downsample_bn.running_var"));  // stage 1 keeps its shape
    // 1 stem conv + 16 block convs + 3 downsample convs + fc = 21 weights.
    int64_t weights = 0;
    for (const auto& item : m.module->named_parameters())
      weights += item.key().ends_with("conv1.weight") || item.key().ends_with("conv2.weight") ||
                 item.key().ends_with("downsample_conv.weight") || item.key() == "fc.weight";
    REQUIRE(weights == 21);
    at::Tensor before = buffers["bn1.running_mean"].clone();
    m.forward(m.example_batch(2, 0).inputs);
    REQUIRE_FALSE(at::equal(before, m.module->named_buffers()["bn1.running_mean"]));
    m.module->eval();
    at::Tensor x = m.example_batch(2, 1).inputs;
    REQUIRE_EQUAL_TENSORS(m.forward(x), m.forward(x));
  }
}
