// Small training programs unlike the model zoo (batch norm's buffers, a
// frozen and an unused parameter with two param groups, dropout, a summed
// loss over odd shards, a tied embedding), and what PyTorch's
// DistributedDataParallel computes for them: the reference spmd::compile is
// compared with. spmd_worker runs one rank of a program compiled ("ddp"
// scenario); test_spmd computes every rank's reference in one process.
//
// DDP's semantics, as the reference applies them (torch/nn/parallel/
// distributed.py, torch/csrc/distributed/c10d/reducer.cpp):
// - every rank starts from rank 0's parameters and buffers;
// - with broadcast_buffers (DDP's default), rank 0's buffers are copied to
//   every rank before each forward;
// - each rank runs forward and backward on its shard, drawing random numbers
//   from its own generator;
// - each gradient is averaged over the ranks, whatever the loss's reduction;
//   a parameter without a gradient on every rank (frozen, or unused with
//   find_unused_parameters) keeps no gradient, so the optimizer skips it;
// - every rank's optimizer takes the same step.
#pragma once

#include <crucible/pipeline/train_step.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace crucible::spmd_testing {

constexpr int kDdpSteps = 4;

struct Program {
  std::shared_ptr<torch::nn::Module> module;
  pipeline::LossFn loss;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  /// Each rank's shard of the global batch.
  int64_t per_rank = 4;
  /// The global batch of step `s` over `n` examples: {inputs, targets}.
  std::function<std::vector<at::Tensor>(int64_t n, int s)> batch;
  /// Rank r's generator is seeded with this before its first step.
  std::function<uint64_t(int rank)> rng_seed = [](int rank) { return 1000 + static_cast<uint64_t>(rank); };
};

namespace detail {

inline at::Tensor randn(at::IntArrayRef sizes, uint64_t seed) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(sizes, g, at::TensorOptions().dtype(at::kDouble));
}
inline at::Tensor randint(int64_t high, at::IntArrayRef sizes, uint64_t seed) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(high, sizes, g, at::TensorOptions().dtype(at::kLong));
}

// Linear, batch norm (running statistics: buffers), tanh, linear.
struct BatchNormNet : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  BatchNormNet() {
    fc1 = register_module("fc1", torch::nn::Linear(5, 8));
    bn = register_module("bn", torch::nn::BatchNorm1d(8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 2));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(bn(fc1(x)).tanh()); }
};

// A frozen scale (requires_grad false, used) and a registered parameter the
// forward never reads.
struct FrozenNet : torch::nn::Module {
  torch::nn::Linear a{nullptr}, b{nullptr};
  at::Tensor scale, unused;
  FrozenNet() {
    a = register_module("a", torch::nn::Linear(4, 6));
    b = register_module("b", torch::nn::Linear(6, 3));
    scale = register_parameter("scale", at::rand({6}) + 0.5, /*requires_grad=*/false);
    unused = register_parameter("unused", at::randn({3}));
  }
  at::Tensor forward(const at::Tensor& x) { return b(a(x).relu() * scale); }
};

struct DropoutNet : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  DropoutNet() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 1));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(at::dropout(fc1(x).relu(), 0.5, is_training())); }
};

struct SmallNet : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  SmallNet() {
    fc1 = register_module("fc1", torch::nn::Linear(3, 4));
    fc2 = register_module("fc2", torch::nn::Linear(4, 1));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(fc1(x).tanh()); }
};

// A float32 layer, then a float64 one: gradients of two dtypes, in buckets
// of their own.
struct MixedNet : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  MixedNet() {
    fc1 = register_module("fc1", torch::nn::Linear(4, 8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 2));
    fc2->to(at::kDouble);
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(fc1(x.to(at::kFloat)).tanh().to(at::kDouble)); }
};

// Embedding, layer norm, and an LM head whose weight is the embedding's,
// registered under a second name (as Hugging Face ties lm_head.weight).
struct TiedLM : torch::nn::Module {
  static constexpr int64_t kVocab = 11, kDim = 6;
  torch::nn::Embedding emb{nullptr};
  torch::nn::LayerNorm ln{nullptr};
  at::Tensor head_weight, head_bias;
  TiedLM() {
    emb = register_module("emb", torch::nn::Embedding(kVocab, kDim));
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    head_weight = register_parameter("head_weight", emb->weight);
    head_bias = register_parameter("head_bias", at::zeros({kVocab}));
  }
  at::Tensor forward(const at::Tensor& tokens) { return at::linear(ln(emb(tokens)), head_weight, head_bias); }
};

// The module's parameters, each once (a tied one is listed under each name).
inline std::vector<at::Tensor> unique_parameters(const torch::nn::Module& m) {
  std::vector<at::Tensor> unique;
  for (const at::Tensor& p : m.parameters()) {
    bool seen = false;
    for (const at::Tensor& q : unique) seen = seen || q.is_same(p);
    if (!seen) unique.push_back(p);
  }
  return unique;
}

inline std::vector<at::Tensor> regression(int64_t n, int s, int64_t in, int64_t out) {
  return {randn({n, in}, 10 + 2 * static_cast<uint64_t>(s)), randn({n, out}, 11 + 2 * static_cast<uint64_t>(s))};
}

}  // namespace detail

/// The program `name` (batchnorm, frozen, dropout, dropout_same, sum,
/// mixed, tied), float64 (mixed: a float32 layer, then a float64 one), its
/// weights drawn from the default generator.
inline Program make_program(const std::string& name) {
  using namespace detail;
  Program p;
  if (name == "batchnorm") {
    auto m = std::make_shared<BatchNormNet>();
    p.module = m;
    p.loss = [](torch::nn::Module& m, const std::vector<at::Tensor>& b) {
      return at::mse_loss(static_cast<BatchNormNet&>(m).forward(b[0]), b[1]);
    };
    p.optimizer = std::make_unique<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    p.batch = [](int64_t n, int s) { return regression(n, s, 5, 2); };
  } else if (name == "frozen") {
    auto m = std::make_shared<FrozenNet>();
    p.module = m;
    p.loss = [](torch::nn::Module& m, const std::vector<at::Tensor>& b) {
      return at::mse_loss(static_cast<FrozenNet&>(m).forward(b[0]), b[1]);
    };
    // Two groups with their own rates; the frozen and the unused parameter
    // are in the first, with momentum and weight decay that would move them
    // if they had a (zero) gradient.
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(
        std::vector<at::Tensor>{m->a->weight, m->a->bias, m->scale, m->unused},
        std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01)));
    groups.emplace_back(
        std::vector<at::Tensor>{m->b->weight, m->b->bias},
        std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.02).momentum(0.9).weight_decay(0.01)));
    p.optimizer = std::make_unique<torch::optim::SGD>(std::move(groups), torch::optim::SGDOptions(0.1));
    p.batch = [](int64_t n, int s) { return regression(n, s, 4, 3); };
  } else if (name == "dropout" || name == "dropout_same") {
    auto m = std::make_shared<DropoutNet>();
    p.module = m;
    p.loss = [](torch::nn::Module& m, const std::vector<at::Tensor>& b) {
      return at::mse_loss(static_cast<DropoutNet&>(m).forward(b[0]), b[1]);
    };
    p.optimizer = std::make_unique<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.05));
    p.batch = [](int64_t n, int s) { return regression(n, s, 6, 1); };
    if (name == "dropout_same") p.rng_seed = [](int) { return uint64_t{1000}; };
  } else if (name == "sum") {
    // A summed loss over shards of 3: DDP still averages the gradients.
    auto m = std::make_shared<SmallNet>();
    p.module = m;
    p.per_rank = 3;
    p.loss = [](torch::nn::Module& m, const std::vector<at::Tensor>& b) {
      return at::mse_loss(static_cast<SmallNet&>(m).forward(b[0]), b[1], at::Reduction::Sum);
    };
    p.optimizer = std::make_unique<torch::optim::Adam>(m->parameters(), torch::optim::AdamOptions(1e-2));
    p.batch = [](int64_t n, int s) { return regression(n, s, 3, 1); };
  } else if (name == "mixed") {
    auto m = std::make_shared<MixedNet>();
    p.module = m;
    p.loss = [](torch::nn::Module& m, const std::vector<at::Tensor>& b) {
      return at::mse_loss(static_cast<MixedNet&>(m).forward(b[0]), b[1]);
    };
    p.optimizer = std::make_unique<torch::optim::Adam>(m->parameters(), torch::optim::AdamOptions(1e-2));
    p.batch = [](int64_t n, int s) { return regression(n, s, 4, 2); };
    return p;  // float32 and float64, as made
  } else if (name == "tied") {
    auto m = std::make_shared<TiedLM>();
    p.module = m;
    p.loss = [](torch::nn::Module& m, const std::vector<at::Tensor>& b) {
      const at::Tensor logits = static_cast<TiedLM&>(m).forward(b[0]);
      return at::cross_entropy_loss(logits.reshape({-1, TiedLM::kVocab}), b[1].reshape({-1}));
    };
    p.optimizer =
        std::make_unique<torch::optim::SGD>(unique_parameters(*m), torch::optim::SGDOptions(0.5).momentum(0.9));
    p.batch = [](int64_t n, int s) {
      return std::vector<at::Tensor>{randint(TiedLM::kVocab, {n, 5}, 20 + 2 * static_cast<uint64_t>(s)),
                                     randint(TiedLM::kVocab, {n, 5}, 21 + 2 * static_cast<uint64_t>(s))};
    };
  } else {
    throw std::invalid_argument("no program named " + name);
  }
  p.module->to(at::kDouble);
  return p;
}

/// Rank `rank`'s shard of a global batch.
inline std::vector<at::Tensor> shard_of(const std::vector<at::Tensor>& global, int rank, int64_t per_rank) {
  std::vector<at::Tensor> shard;
  for (const at::Tensor& t : global) shard.push_back(t.narrow(0, rank * per_rank, per_rank).clone());
  return shard;
}

/// What a rank ends with: its losses, then every parameter (named_parameters
/// order, a tied one under each name) and every buffer (named_buffers), all
/// as float64, flattened into one tensor.
inline at::Tensor rank_result(const std::vector<double>& losses, const torch::nn::Module& m) {
  std::vector<at::Tensor> flat{at::tensor(losses, at::kDouble)};
  for (const at::Tensor& p : m.parameters()) flat.push_back(p.detach().to(at::kDouble).cpu().reshape({-1}));
  for (const at::Tensor& b : m.buffers()) flat.push_back(b.detach().to(at::kDouble).cpu().reshape({-1}));
  return at::cat(flat);
}

/// Every rank's rank_result after kDdpSteps steps of DDP over `world` ranks,
/// computed in one process (one replica a rank). The replicas are made as
/// spmd_worker makes rank 0's model (seed 100) and copied, as DDP's
/// constructor broadcasts rank 0's state.
inline std::vector<at::Tensor> ddp_reference(const std::string& name, int world, bool broadcast_buffers = true) {
  std::vector<Program> replicas;
  for (int r = 0; r < world; ++r) {
    at::manual_seed(100);
    replicas.push_back(make_program(name));
  }
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::vector<at::Tensor> rng;
  for (int r = 0; r < world; ++r) {
    at::manual_seed(replicas[0].rng_seed(r));
    rng.push_back(gen.get_state());
  }
  std::vector<std::vector<double>> losses(world);
  for (int s = 0; s < kDdpSteps; ++s) {
    if (broadcast_buffers) {
      at::NoGradGuard no_grad;
      const std::vector<at::Tensor> root = replicas[0].module->buffers();
      for (int r = 1; r < world; ++r) {
        const std::vector<at::Tensor> mine = replicas[r].module->buffers();
        for (size_t i = 0; i < mine.size(); ++i) mine[i].copy_(root[i]);
      }
    }
    const std::vector<at::Tensor> global = replicas[0].batch(replicas[0].per_rank * world, s);
    for (int r = 0; r < world; ++r) {
      Program& p = replicas[r];
      gen.set_state(rng[r]);
      p.optimizer->zero_grad();
      at::Tensor loss = p.loss(*p.module, shard_of(global, r, p.per_rank));
      loss.backward();
      losses[r].push_back(loss.item<double>());
      rng[r] = gen.get_state();
    }
    // The gradients averaged over the ranks (a parameter with no gradient on
    // any rank keeps none).
    const std::vector<at::Tensor> params0 = detail::unique_parameters(*replicas[0].module);
    for (size_t i = 0; i < params0.size(); ++i) {
      if (!params0[i].grad().defined()) continue;
      at::Tensor sum = at::zeros_like(params0[i]);
      for (int r = 0; r < world; ++r) sum += detail::unique_parameters(*replicas[r].module)[i].grad();
      for (int r = 0; r < world; ++r) detail::unique_parameters(*replicas[r].module)[i].mutable_grad() = sum / world;
    }
    for (int r = 0; r < world; ++r) replicas[r].optimizer->step();
  }
  std::vector<at::Tensor> results;
  for (int r = 0; r < world; ++r) results.push_back(rank_result(losses[r], *replicas[r].module));
  return results;
}

}  // namespace crucible::spmd_testing
