// The helpers of the "[programs]" suites (test_programs.cpp,
// test_example_programs.cpp): a program trained through compile_train_step
// with each builder and, from the same initial state, by the eager loop
// `zero_grad(); loss_fn(...).backward(); step()`, its losses, parameters
// and buffers compared at every step.
#pragma once

#include <crucible/inductor/compile_fx.h>
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/train_step.h>
#include <crucible/tracer/decomposition.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "catch.h"
#include "testing.h"

namespace crucible::testing::programs {

using pipeline::Builder;
using pipeline::LossFn;
using pipeline::TrainStep;

using Batch = std::vector<at::Tensor>;
using MakeModule = std::function<std::shared_ptr<torch::nn::Module>()>;
using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(torch::nn::Module&)>;
using BatchFn = std::function<Batch(int64_t step)>;

// Everything in float64, so that fused kernels' other summation orders stay
// ~1e-15 relative after a few steps; a wrong kernel, a missed buffer update
// or a baked constant is off by the values' own scale.
inline constexpr double kRtol = 1e-9, kAtol = 1e-11;

// The two copies train_and_compare trained, for a look after training (an
// evaluation pass).
struct Trained {
  std::shared_ptr<torch::nn::Module> compiled, eager;
};

inline void copy_all(const torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  auto src_p = from.named_parameters();
  for (auto& p : to.named_parameters()) p.value().copy_(src_p[p.key()]);
  auto src_b = from.named_buffers();
  for (auto& b : to.named_buffers()) b.value().copy_(src_b[b.key()]);
}

inline void require_same_state(const torch::nn::Module& compiled, const torch::nn::Module& eager) {
  auto pe = eager.named_parameters();
  for (const auto& p : compiled.named_parameters()) {
    INFO("parameter " << p.key());
    REQUIRE_LIKE_EAGER(p.value().detach(), pe[p.key()].detach(), kRtol, kAtol);
  }
  auto be = eager.named_buffers();
  for (const auto& b : compiled.named_buffers()) {
    INFO("buffer " << b.key());
    REQUIRE_LIKE_EAGER(b.value(), be[b.key()], kRtol, kAtol);
  }
}

// Trains a compiled and an eager copy of make()'s module `steps` steps, on
// test_device() (CRUCIBLE_TEST_DEVICE=cuda: the modules and each batch moved
// to the GPU, the CUDA backend's kernels then compared with eager CUDA); the
// parameters must move (agreement of two untouched copies proves nothing).
// `compilations`: how many distinct batch shapes `batches` gives;
// `schedule`, where set, changes each optimizer before each step (a
// learning-rate scheduler). Returns both trained modules.
inline Trained train_and_compare(const MakeModule& make, const MakeOptimizer& make_opt, const LossFn& loss_fn,
                                 const BatchFn& batches, int64_t steps, const Builder& builder, size_t compilations = 1,
                                 const std::function<void(int64_t step, torch::optim::Optimizer&)>& schedule = {}) {
  if (crucible::testing::compile_only()) {
    [] { CRUCIBLE_SKIP("CUDA asked for and no GPU here"); }();  // Catch2 2's skip returns: no modules then
    return {};
  }
  const at::Device device = crucible::testing::test_device();
  torch::manual_seed(0);
  std::shared_ptr<torch::nn::Module> compiled = make(), eager = make();
  compiled->to(device, at::kDouble);
  eager->to(device, at::kDouble);
  copy_all(*compiled, *eager);
  std::vector<at::Tensor> initial;
  for (const auto& p : compiled->parameters()) initial.push_back(p.detach().clone());
  std::unique_ptr<torch::optim::Optimizer> compiled_opt = make_opt(*compiled), eager_opt = make_opt(*eager);
  TrainStep step = builder.compile_train_step(compiled, *compiled_opt, loss_fn);
  for (int64_t i = 0; i < steps; ++i) {
    Batch b = batches(i);
    for (at::Tensor& t : b) t = t.to(device);
    if (schedule) {
      schedule(i, *compiled_opt);
      schedule(i, *eager_opt);
    }
    // The same random draws on both sides: the compiled step replays the
    // generator's stream as eager draws it (Philox offsets in the graph).
    torch::manual_seed(100 + i);
    const at::Tensor compiled_loss = step(b);
    torch::manual_seed(100 + i);
    eager_opt->zero_grad();
    const at::Tensor eager_loss = loss_fn(*eager, b);
    eager_loss.backward();
    eager_opt->step();
    INFO("step " << i);
    REQUIRE_LIKE_EAGER(compiled_loss, eager_loss.detach(), kRtol, kAtol);
  }
  CHECK(step.num_compilations() == compilations);
  require_same_state(*compiled, *eager);
  double moved = 0;
  auto final = compiled->parameters();
  for (size_t i = 0; i < final.size(); ++i)
    moved = std::max(moved, (final[i].detach() - initial[i]).abs().max().item<double>());
  REQUIRE(moved > 1e-4);
  return {compiled, eager};
}

// The builders every program runs with. On a GPU the inductor builder
// rewrites convolutions to channels-last (Note [Channels-last convolutions]
// in inductor/src/fx_passes/layout_opt.cpp); on the CPU a builder of its own forces
// that rewrite, so that what it computes, and the layouts of what the
// caller gets, are checked there too.
inline std::vector<std::pair<std::string, Builder>> builders() {
  std::vector<std::pair<std::string, Builder>> out;
  out.emplace_back("interpreter", Builder().backend("interpreter"));
  out.emplace_back(
      "inductor",
      std::move(Builder().decompositions(crucible::tracer::core_aten_decompositions()).backend("inductor")));
  if (!crucible::testing::test_device().is_cuda())
    out.emplace_back("inductor, layout rewrite forced",
                     std::move(Builder()
                                   .decompositions(crucible::tracer::core_aten_decompositions())
                                   .backend("inductor, layout rewrite forced",
                                            [](const ir::Graph& g, const std::vector<at::Tensor>& examples) {
                                              inductor::InductorOptions o =
                                                  inductor::InductorOptions::from_environment();
                                              o.force_layout_optimization = true;
                                              return inductor::compile_fx_inner(g, examples, o);
                                            })));
  crucible::tracer::TraceOptions fake;
  fake.mode = crucible::tracer::TraceMode::Fake;
  out.emplace_back("fake", std::move(Builder().backend("interpreter").trace_options(fake)));
  out.emplace_back("pre-grad", std::move(Builder().backend("interpreter").pre_grad_passes({"fuse_attention", "cse"})));
  // The pre-grad graph replayed under the inductor's decompositions, whose
  // results must keep the layouts the graph's views were traced on.
  out.emplace_back("pre-grad, core decompositions",
                   std::move(Builder()
                                 .decompositions(crucible::tracer::core_aten_decompositions())
                                 .backend("interpreter")
                                 .pre_grad_passes({"fuse_attention", "cse"})));
  return out;
}

// What a program does that some builders cannot follow on a GPU.
struct GpuLimits {
  // It runs cuDNN's RNN, which points a tensor at its flattened weights'
  // Storage (set_): a forward trace that is not functionalized (the
  // pre-grad passes', which the inductor backends run by default) cannot
  // hold that, so those passes are skipped and the step compiles without
  // them. A fake tensor's Storage holds no data, so the fake builder refuses
  // it, with an error that says to trace in real mode (TraceMode::Auto does).
  bool cudnn_rnn = false;
  // It branches on at::equal of two tensors' values (Note [Guarded equal]):
  // a fake-mode trace has no values, and refuses it with a clear error.
  bool reads_values = false;
};

inline void for_each_backend(const std::function<void(const Builder&)>& body, GpuLimits limits = {}) {
  const bool gpu = crucible::testing::test_device().is_cuda();
  for (const auto& [name, builder] : builders()) {
    SECTION(name) {
      if (gpu && limits.cudnn_rnn && name == "fake")
        REQUIRE_THROWS_WITH(body(builder), CRUCIBLE_HAS_SUBSTR("aten::set") && CRUCIBLE_HAS_SUBSTR("real mode"));
      else if (limits.reads_values && name == "fake")
        REQUIRE_THROWS_WITH(body(builder), CRUCIBLE_HAS_SUBSTR("aten::equal") && CRUCIBLE_HAS_SUBSTR("data-dependent"));
      else
        body(builder);
    }
  }
}

inline MakeOptimizer adam(double lr) {
  return [lr](torch::nn::Module& m) { return std::make_unique<torch::optim::Adam>(m.parameters(), lr); };
}
inline MakeOptimizer sgd(double lr, double momentum = 0.0) {
  return [lr, momentum](torch::nn::Module& m) {
    return std::make_unique<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(lr).momentum(momentum));
  };
}

inline at::Tensor f64_randn(at::IntArrayRef sizes, int64_t seed) {
  at::manual_seed(seed);
  return at::randn(sizes, at::kDouble);
}

}  // namespace crucible::testing::programs
