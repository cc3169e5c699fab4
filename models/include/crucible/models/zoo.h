// The model zoo: the networks Crucible trains, compiles and benchmarks, all
// torch::nn modules, built by name for the CLI and the benchmarks.
//
// Every model maps its inputs to logits and trains with mean cross-entropy.
// Weights are drawn from LibTorch's global generator (torch::manual_seed
// before make_* for reproducible weights); no model uses randomness in its
// forward unless its config turns dropout on (off by default, so compiled and
// eager runs compute the same thing).
#pragma once

#include <crucible/data/batcher.h>

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace crucible::models {

/// A built model. Include <torch/nn/module.h> to use `module` (parameters(),
/// named_buffers(), train()/eval(), to()).
struct Model {
  std::string name;
  std::shared_ptr<torch::nn::Module> module;
  /// The module's forward: inputs -> logits (shapes per make_* below).
  std::function<at::Tensor(const at::Tensor& inputs)> forward;
  /// Mean cross-entropy of logits against int64 class targets (for the GPT,
  /// over every position: logits [B, T, V] flattened against targets [B, T]).
  std::function<at::Tensor(const at::Tensor& logits, const at::Tensor& targets)> loss;
  /// A seeded batch of the model's input and target shapes (random images in
  /// N(0, 1) with uniform labels; synthetic_token_batch for the GPT), for
  /// tracing and benchmarks. Independent of the global generator.
  std::function<data::Batch(int64_t batch_size, uint64_t seed)> example_batch;
};

/// Multi-layer perceptron: flatten, then Linear+ReLU per hidden size, then a
/// Linear to the classes. inputs float [B, 1, 28, 28] (any [B, ...] with
/// in_features elements per example) -> logits [B, num_classes].
struct MlpConfig {
  int64_t in_features = 28 * 28;
  std::vector<int64_t> hidden = {256, 128};
  int64_t num_classes = 10;
};
Model make_mlp(const MlpConfig& config = {});

/// LeNet-style network of LibTorch's MNIST example: conv 5x5 (1->10), max-pool
/// 2, ReLU, conv 5x5 (10->20), [Dropout2d], max-pool 2, ReLU, Linear 320->50,
/// ReLU, [dropout], Linear 50->classes. Returns logits, not the example's
/// log_softmax: the loss applies it. inputs float [B, 1, 28, 28] -> [B, classes].
struct ConvNetConfig {
  bool dropout = false;  ///< the example's two dropouts, p = dropout_p, active in train mode only
  double dropout_p = 0.5;
  int64_t num_classes = 10;
};
Model make_convnet(const ConvNetConfig& config = {});

/// nanoGPT's GPT-2 layout: token + position embedding, n_layer pre-LayerNorm
/// blocks (x + attn(ln_1(x)), then x + mlp(ln_2(x))) of causal multi-head
/// self-attention (written out: QK^T/sqrt(d), causal mask, softmax, @V) and a
/// 4x GELU MLP, a final LayerNorm, and a head tied to the token embedding
/// (logits = x @ wte^T; one parameter, listed once). Initialized as nanoGPT:
/// N(0, 0.02), residual projections N(0, 0.02/sqrt(2 n_layer)), zero biases.
/// inputs int64 tokens [B, T], T <= block_size -> logits [B, T, vocab_size].
/// Forward throws ModelError for T > block_size.
struct GptConfig {
  int64_t vocab_size = 64;
  int64_t block_size = 32;
  int64_t n_layer = 2;
  int64_t n_head = 2;
  int64_t n_embd = 64;  ///< must divide by n_head
  double dropout = 0.0;
  bool bias = true;  ///< biases in the Linears and LayerNorms
};
Model make_gpt(const GptConfig& config = {});

/// ResNet-18 layout (torchvision's BasicBlock network) for small images: a
/// 3x3 stem conv (stride 1, no max-pool, as is usual below ImageNet sizes),
/// four stages of `blocks` BasicBlocks (conv3x3-BN-ReLU-conv3x3-BN plus the
/// identity, or a 1x1 conv + BN where the shape changes) with width, 2, 4 and 8
/// times width channels and strides 1, 2, 2, 2, global average pooling and a
/// Linear to the classes. BatchNorm's running statistics are buffers that
/// train mode updates. inputs float [B, in_channels, image_size, image_size]
/// -> logits [B, num_classes].
struct ResNetConfig {
  int64_t in_channels = 1;
  int64_t image_size = 28;  ///< for example_batch; the network takes any size >= 8
  int64_t width = 16;       ///< torchvision's is 64; 16 keeps it quick on a CPU
  std::array<int64_t, 4> blocks = {2, 2, 2, 2};
  int64_t num_classes = 10;
  /// torchvision's ImageNet stem instead of the 3x3 one: a 7x7 stride-2
  /// convolution, BatchNorm, ReLU and a 3x3 stride-2 max-pool.
  bool imagenet_stem = false;
};
Model make_resnet(const ResNetConfig& config = {});

/// The zoo's names: "mlp", "convnet", "gpt", "resnet18".
const std::vector<std::string>& model_names();

/// The zoo's sizes: "small" (the default configs above: quick on a CPU) and
/// "full", the models at the size PyTorch's compiler is measured on:
/// MLP 784-1024-1024-10; the LeNet-style ConvNet; ResNet-18 as torchvision's
/// (ImageNet stem, width 64, 3x224x224 images, 1000 classes); GPT-2 small
/// (12 layers, 768 wide, 12 heads, vocabulary 50257, T = 1024).
const std::vector<std::string>& model_sizes();

/// A zoo model by name, at a size of model_sizes(). Throws ModelError for
/// an unknown name or size, listing the known ones.
Model make_model(std::string_view name, std::string_view size = "small");

/// Copies every parameter and buffer of `from` into the one of the same name
/// in `to` (under no-grad), so two instances of a model start from the same
/// weights (an eager reference and a compiled copy). Throws ModelError
/// naming a tensor that `to` lacks or whose sizes differ.
void copy_state(const torch::nn::Module& from, torch::nn::Module& to);

/// One eager training step, the reference a compiled TrainStep is compared
/// with: optimizer.zero_grad(), loss of model.forward(batch.inputs) against
/// batch.targets, backward(), optimizer.step(). Returns the loss, detached.
at::Tensor eager_train_step(const Model& model, torch::optim::Optimizer& optimizer, const data::Batch& batch);

/// The largest |a - b| over the parameters of two instances of one model,
/// matched by name (how far a compiled copy ended from its eager twin).
double max_param_diff(const torch::nn::Module& a, const torch::nn::Module& b);

/// The model's loss over a batch {inputs, targets}, as a function of the
/// module and the batch: model.loss(model.forward(batch[0]), batch[1]). Its
/// type is pipeline::LossFn's, for compile_train_step.
std::function<at::Tensor(torch::nn::Module& module, const std::vector<at::Tensor>& batch)> loss_of(const Model& model);

}  // namespace crucible::models
