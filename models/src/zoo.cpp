// The zoo's modules. They live here, not in the header, so that only this
// source parses torch::nn's module headers.
#include <crucible/data/synthetic_tokens.h>
#include <crucible/models/error.h>
#include <crucible/models/zoo.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/init.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace crucible::models {
namespace {

namespace nn = torch::nn;

at::Tensor maybe_dropout(const at::Tensor& x, double p, bool train) { return p > 0 ? at::dropout(x, p, train) : x; }

at::Tensor mean_cross_entropy(const at::Tensor& logits, const at::Tensor& targets) {
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

std::function<data::Batch(int64_t, uint64_t)> image_batches(int64_t channels, int64_t size, int64_t classes) {
  return [=](int64_t batch_size, uint64_t seed) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    at::Tensor x = at::randn({batch_size, channels, size, size}, gen);
    return data::Batch{x, at::randint(0, classes, {batch_size}, gen, at::kLong)};
  };
}

template <typename Impl>
Model wrap(std::string name, std::shared_ptr<Impl> impl, std::function<data::Batch(int64_t, uint64_t)> examples) {
  return Model{std::move(name), impl, [impl](const at::Tensor& x) { return impl->forward(x); }, mean_cross_entropy,
               std::move(examples)};
}

// --- MLP ----------------------------------------------------------------------

struct MlpImpl : nn::Module {
  explicit MlpImpl(const MlpConfig& c) {
    int64_t in = c.in_features;
    for (size_t i = 0; i <= c.hidden.size(); ++i) {
      const int64_t out = i < c.hidden.size() ? c.hidden[i] : c.num_classes;
      layers.push_back(register_module("fc" + std::to_string(i + 1), nn::Linear(in, out)));
      in = out;
    }
  }
  at::Tensor forward(const at::Tensor& input) {
    at::Tensor x = input.flatten(1);
    for (size_t i = 0; i < layers.size(); ++i) {
      x = layers[i]->forward(x);
      if (i + 1 < layers.size()) x = at::relu(x);
    }
    return x;
  }
  std::vector<nn::Linear> layers;
};

// --- ConvNet --------------------------------------------------------------------

struct ConvNetImpl : nn::Module {
  explicit ConvNetImpl(const ConvNetConfig& c)
      : p(c.dropout ? c.dropout_p : 0.0),
        conv1(register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, 10, 5)))),
        conv2(register_module("conv2", nn::Conv2d(nn::Conv2dOptions(10, 20, 5)))),
        fc1(register_module("fc1", nn::Linear(320, 50))),
        fc2(register_module("fc2", nn::Linear(50, c.num_classes))) {}
  at::Tensor forward(const at::Tensor& input) {
    at::Tensor x = at::relu(at::max_pool2d(conv1->forward(input), {2, 2}));
    x = conv2->forward(x);
    if (p > 0) x = at::feature_dropout(x, p, is_training());  // the example's Dropout2d
    x = at::relu(at::max_pool2d(x, {2, 2})).flatten(1);
    x = maybe_dropout(at::relu(fc1->forward(x)), p, is_training());
    return fc2->forward(x);
  }
  double p;
  nn::Conv2d conv1, conv2;
  nn::Linear fc1, fc2;
};

// --- GPT ------------------------------------------------------------------------

// nanoGPT's LayerNorm: an optional bias, which torch::nn::LayerNorm lacks.
struct LayerNormImpl : nn::Module {
  LayerNormImpl(int64_t n, bool bias) : weight(register_parameter("weight", at::ones({n}))) {
    if (bias) this->bias = register_parameter("bias", at::zeros({n}));
  }
  at::Tensor forward(const at::Tensor& x) { return at::layer_norm(x, {weight.size(0)}, weight, bias, 1e-5); }
  at::Tensor weight, bias;
};

struct CausalSelfAttentionImpl : nn::Module {
  explicit CausalSelfAttentionImpl(const GptConfig& c)
      : n_head(c.n_head),
        p(c.dropout),
        c_attn(register_module("c_attn", nn::Linear(nn::LinearOptions(c.n_embd, 3 * c.n_embd).bias(c.bias)))),
        c_proj(register_module("c_proj", nn::Linear(nn::LinearOptions(c.n_embd, c.n_embd).bias(c.bias)))),
        // The causal mask, a buffer as in nanoGPT: lower-triangular ones [1, 1, T, T].
        mask(register_buffer("bias",
                             at::ones({c.block_size, c.block_size}).tril().view({1, 1, c.block_size, c.block_size}))) {}
  at::Tensor forward(const at::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2), hs = c / n_head;
    std::vector<at::Tensor> qkv = c_attn->forward(x).split(c, 2);
    auto heads = [&](const at::Tensor& y) { return y.view({b, t, n_head, hs}).transpose(1, 2); };
    at::Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
    at::Tensor att = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hs)));
    att = att.masked_fill(mask.slice(2, 0, t).slice(3, 0, t) == 0, -std::numeric_limits<double>::infinity());
    att = maybe_dropout(at::softmax(att, -1), p, is_training());
    at::Tensor y = at::matmul(att, v).transpose(1, 2).contiguous().view({b, t, c});
    return maybe_dropout(c_proj->forward(y), p, is_training());
  }
  int64_t n_head;
  double p;
  nn::Linear c_attn, c_proj;
  at::Tensor mask;
};

struct GptMlpImpl : nn::Module {
  explicit GptMlpImpl(const GptConfig& c)
      : p(c.dropout),
        c_fc(register_module("c_fc", nn::Linear(nn::LinearOptions(c.n_embd, 4 * c.n_embd).bias(c.bias)))),
        c_proj(register_module("c_proj", nn::Linear(nn::LinearOptions(4 * c.n_embd, c.n_embd).bias(c.bias)))) {}
  at::Tensor forward(const at::Tensor& x) {
    return maybe_dropout(c_proj->forward(at::gelu(c_fc->forward(x))), p, is_training());
  }
  double p;
  nn::Linear c_fc, c_proj;
};

struct BlockImpl : nn::Module {
  explicit BlockImpl(const GptConfig& c)
      : ln_1(register_module("ln_1", std::make_shared<LayerNormImpl>(c.n_embd, c.bias))),
        attn(register_module("attn", std::make_shared<CausalSelfAttentionImpl>(c))),
        ln_2(register_module("ln_2", std::make_shared<LayerNormImpl>(c.n_embd, c.bias))),
        mlp(register_module("mlp", std::make_shared<GptMlpImpl>(c))) {}
  at::Tensor forward(at::Tensor x) {
    x = x + attn->forward(ln_1->forward(x));
    return x + mlp->forward(ln_2->forward(x));
  }
  std::shared_ptr<LayerNormImpl> ln_1;
  std::shared_ptr<CausalSelfAttentionImpl> attn;
  std::shared_ptr<LayerNormImpl> ln_2;
  std::shared_ptr<GptMlpImpl> mlp;
};

struct GptImpl : nn::Module {
  explicit GptImpl(const GptConfig& c)
      : config(c),
        wte(register_module("wte", nn::Embedding(c.vocab_size, c.n_embd))),
        wpe(register_module("wpe", nn::Embedding(c.block_size, c.n_embd))),
        h(register_module("h", nn::ModuleList())),
        ln_f(register_module("ln_f", std::make_shared<LayerNormImpl>(c.n_embd, c.bias))) {
    for (int64_t i = 0; i < c.n_layer; ++i) {
      blocks.push_back(std::make_shared<BlockImpl>(c));
      h->push_back(blocks.back());
    }
    // nanoGPT's _init_weights, then the scaled init of residual projections.
    at::NoGradGuard no_grad;
    for (auto& item : named_parameters()) {
      const std::string& name = item.key();
      at::Tensor& p = item.value();
      if (name.ends_with("c_proj.weight"))
        nn::init::normal_(p, 0.0, 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer)));
      else if (name.ends_with("bias"))
        nn::init::zeros_(p);
      else if (name.find("ln_") == std::string::npos)  // LayerNorm weights keep their ones
        nn::init::normal_(p, 0.0, 0.02);
    }
  }
  at::Tensor forward(const at::Tensor& idx) {
    const int64_t t = idx.size(1);
    if (t > config.block_size)
      throw ModelError("gpt: a sequence of length " + std::to_string(t) + " is longer than block_size " +
                       std::to_string(config.block_size) + "; cut it, or build the model with a larger block_size");
    at::Tensor pos = at::arange(t, idx.options().dtype(at::kLong));
    at::Tensor x = maybe_dropout(wte->forward(idx) + wpe->forward(pos), config.dropout, is_training());
    for (auto& block : blocks) x = block->forward(x);
    return at::linear(ln_f->forward(x), wte->weight);  // the head tied to the token embedding
  }
  GptConfig config;
  nn::Embedding wte, wpe;
  nn::ModuleList h;
  std::shared_ptr<LayerNormImpl> ln_f;
  std::vector<std::shared_ptr<BlockImpl>> blocks;
};

// --- ResNet-18 ------------------------------------------------------------------

nn::Conv2d conv(int64_t in, int64_t out, int64_t k, int64_t stride) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, k).stride(stride).padding(k / 2).bias(false));
}

struct BasicBlockImpl : nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1(register_module("conv1", conv(in, out, 3, stride))),
        bn1(register_module("bn1", nn::BatchNorm2d(out))),
        conv2(register_module("conv2", conv(out, out, 3, 1))),
        bn2(register_module("bn2", nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out) {
      down_conv = register_module("downsample_conv", conv(in, out, 1, stride));
      down_bn = register_module("downsample_bn", nn::BatchNorm2d(out));
    }
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor out = at::relu(bn1->forward(conv1->forward(x)));
    out = bn2->forward(conv2->forward(out));
    return at::relu(out + (down_conv ? down_bn->forward(down_conv->forward(x)) : x));
  }
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::Conv2d conv2;
  nn::BatchNorm2d bn2;
  nn::Conv2d down_conv{nullptr};
  nn::BatchNorm2d down_bn{nullptr};
};

struct ResNetImpl : nn::Module {
  explicit ResNetImpl(const ResNetConfig& c)
      : conv1(register_module("conv1", conv(c.in_channels, c.width, c.imagenet_stem ? 7 : 3, c.imagenet_stem ? 2 : 1))),
        bn1(register_module("bn1", nn::BatchNorm2d(c.width))),
        max_pool(c.imagenet_stem),
        layers(register_module("layers", nn::ModuleList())),
        fc(register_module("fc", nn::Linear(8 * c.width, c.num_classes))) {
    int64_t in = c.width;
    for (int64_t stage = 0; stage < 4; ++stage) {
      const int64_t out = c.width << stage;
      for (int64_t i = 0; i < c.blocks[stage]; ++i) {
        blocks.push_back(std::make_shared<BasicBlockImpl>(in, out, i == 0 && stage > 0 ? 2 : 1));
        layers->push_back(blocks.back());
        in = out;
      }
    }
    // torchvision's init: He-normal (fan_out) convolutions; BatchNorm's defaults (1, 0).
    at::NoGradGuard no_grad;
    for (auto& m : modules(/*include_self=*/false))
      if (auto* cv = m->as<nn::Conv2d>()) nn::init::kaiming_normal_(cv->weight, 0, torch::kFanOut, torch::kReLU);
  }
  at::Tensor forward(const at::Tensor& input) {
    at::Tensor x = at::relu(bn1->forward(conv1->forward(input)));
    if (max_pool) x = at::max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
    for (auto& block : blocks) x = block->forward(x);
    return fc->forward(at::adaptive_avg_pool2d(x, {1, 1}).flatten(1));
  }
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  bool max_pool;
  nn::ModuleList layers;
  nn::Linear fc;
  std::vector<std::shared_ptr<BasicBlockImpl>> blocks;
};

}  // namespace

Model make_mlp(const MlpConfig& c) {
  return wrap("mlp", std::make_shared<MlpImpl>(c), image_batches(1, 28, c.num_classes));
}

Model make_convnet(const ConvNetConfig& c) {
  return wrap("convnet", std::make_shared<ConvNetImpl>(c), image_batches(1, 28, c.num_classes));
}

Model make_gpt(const GptConfig& c) {
  if (c.n_head < 1 || c.n_embd % c.n_head != 0)
    throw ModelError("make_gpt: n_embd (" + std::to_string(c.n_embd) + ") must be a multiple of n_head (" +
                     std::to_string(c.n_head) + ")");
  return wrap("gpt", std::make_shared<GptImpl>(c), [c](int64_t batch_size, uint64_t seed) {
    return data::synthetic_token_batch({c.vocab_size, c.block_size, batch_size, seed}, 0);
  });
}

Model make_resnet(const ResNetConfig& c) {
  return wrap("resnet18", std::make_shared<ResNetImpl>(c), image_batches(c.in_channels, c.image_size, c.num_classes));
}

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names = {"mlp", "convnet", "gpt", "resnet18"};
  return names;
}

const std::vector<std::string>& model_sizes() {
  static const std::vector<std::string> sizes = {"small", "full"};
  return sizes;
}

Model make_model(std::string_view name, std::string_view size) {
  auto list = [](const std::vector<std::string>& names) {
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
    return known;
  };
  if (size != "small" && size != "full")
    throw ModelError("unknown model size '" + std::string(size) + "'; the zoo has " + list(model_sizes()));
  const bool full = size == "full";
  if (name == "mlp")
    return full ? make_mlp({.in_features = 784, .hidden = {1024, 1024}, .num_classes = 10}) : make_mlp();
  if (name == "convnet") return make_convnet();
  if (name == "gpt")
    return full ? make_gpt({.vocab_size = 50257, .block_size = 1024, .n_layer = 12, .n_head = 12, .n_embd = 768})
                : make_gpt();
  if (name == "resnet18")
    return full ? make_resnet({.in_channels = 3,
                               .image_size = 224,
                               .width = 64,
                               .blocks = {2, 2, 2, 2},
                               .num_classes = 1000,
                               .imagenet_stem = true})
                : make_resnet();
  throw ModelError("unknown model '" + std::string(name) + "'; the zoo has " + list(model_names()));
}

void copy_state(const torch::nn::Module& from, torch::nn::Module& to) {
  at::NoGradGuard no_grad;
  auto copy = [](const auto& source, auto target, const char* what) {
    for (const auto& item : source) {
      at::Tensor* t = target.find(item.key());
      if (!t || t->sizes() != item.value().sizes())
        throw ModelError(std::string("copy_state: the target module ") +
                         (t ? "has sizes " + c10::str(t->sizes()) + " for" : "has no") + " " + what + " '" +
                         item.key() + "' (" + c10::str(item.value().sizes()) +
                         " in the source); copy between instances of the same model");
      t->copy_(item.value());
    }
  };
  copy(from.named_parameters(), to.named_parameters(), "parameter");
  copy(from.named_buffers(), to.named_buffers(), "buffer");
}

at::Tensor eager_train_step(const Model& model, torch::optim::Optimizer& optimizer, const data::Batch& batch) {
  optimizer.zero_grad();
  at::Tensor loss = model.loss(model.forward(batch.inputs), batch.targets);
  loss.backward();
  optimizer.step();
  return loss.detach();
}

double max_param_diff(const torch::nn::Module& a, const torch::nn::Module& b) {
  double diff = 0;
  const auto pb = b.named_parameters();
  for (const auto& p : a.named_parameters())
    diff = std::max(diff, (p.value() - pb[p.key()]).abs().max().item<double>());
  return diff;
}

std::function<at::Tensor(torch::nn::Module&, const std::vector<at::Tensor>&)> loss_of(const Model& model) {
  return [forward = model.forward, loss = model.loss](torch::nn::Module&, const std::vector<at::Tensor>& batch) {
    return loss(forward(batch.at(0)), batch.at(1));
  };
}

}  // namespace crucible::models
