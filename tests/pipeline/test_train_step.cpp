// compile_train_step against eager LibTorch: two copies of a zoo model with
// the same initial weights train on the same batches, one through the
// compiled training step (one graph: forward, backward, optimizer update),
// one with torch::optim.
#include <crucible/data/fashion_mnist.h>
#include <crucible/data/synthetic_tokens.h>
#include <crucible/inductor/compile_fx.h>
#include <crucible/inductor/compile_fx_aot.h>
#include <crucible/ir/graph.h>
#include <crucible/models/zoo.h>
#include <crucible/partitioner/min_cut_partition.h>
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/error.h>
#include <crucible/pipeline/train_step.h>
#include <crucible/runtime/backend_registry.h>
#include <crucible/tracer/decomposition.h>
#include <crucible/tracer/make_fx.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "catch.h"
#include "data_dir.h"
#include "graph_testing.h"
#include "testing.h"

using namespace crucible::pipeline;
using namespace crucible::models;
using namespace crucible::data;

namespace {

// The first 50 * 32 training images, normalized, read once.
const FashionMnist& fashion_mnist_subset() {
  static const FashionMnist subset = [] {
    FashionMnist all = load_fashion_mnist(Split::Train, fashion_mnist_test_dir());
    return FashionMnist{all.images.slice(0, 0, 50 * 32).clone(), all.labels.slice(0, 0, 50 * 32).clone()};
  }();
  return subset;
}

using BatchFn = std::function<Batch(int64_t step)>;

BatchFn fashion_mnist_batches(int64_t batch_size) {
  return [batch_size](int64_t step) {
    const FashionMnist& d = fashion_mnist_subset();
    const int64_t start = (step * batch_size) % d.images.size(0);
    return Batch{d.images.slice(0, start, start + batch_size), d.labels.slice(0, start, start + batch_size)};
  };
}

// Two instances of a model with the same parameters and buffers.
struct Twins {
  Model compiled;
  Model eager;
};

Twins twins(const std::function<Model()>& make) {
  torch::manual_seed(0);
  Model a = make();
  Model b = make();
  copy_state(*a.module, *b.module);
  return {std::move(a), std::move(b)};
}

// Parameters and buffers of both copies, by name.
void require_same_state(const Model& compiled, const Model& eager, double rtol, double atol) {
  auto pe = eager.module->named_parameters();
  for (const auto& p : compiled.module->named_parameters()) {
    INFO("parameter " << p.key());
    REQUIRE_CLOSE(p.value().detach(), pe[p.key()].detach(), rtol, atol);
  }
  auto be = eager.module->named_buffers();
  for (const auto& b : compiled.module->named_buffers()) {
    INFO("buffer " << b.key());
    REQUIRE_CLOSE(b.value(), be[b.key()], rtol, atol);
  }
}

std::vector<at::Tensor> snapshot(const Model& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.module->parameters()) out.push_back(p.detach().clone());
  return out;
}

// Trains both copies `steps` steps on `batches`; the losses must agree at
// every step and the parameters and buffers at the end, and the parameters
// must have moved (so that agreement is not that of two untouched copies).
// The compiled step is built by `builder` (the default: interpreter backend,
// no decompositions).
// Returns the compiled step, for a look at its graph.
template <typename Optimizer, typename Options>
TrainStep train_and_compare(const std::function<Model()>& make, const Options& options, const BatchFn& batches,
                            int64_t steps, double rtol, double atol,
                            const Builder& builder = Builder().backend("interpreter")) {
  Twins t = twins(make);
  t.compiled.module->train();
  t.eager.module->train();
  const std::vector<at::Tensor> initial = snapshot(t.compiled);
  Optimizer compiled_opt(t.compiled.module->parameters(), options);
  Optimizer eager_opt(t.eager.module->parameters(), options);
  TrainStep step = builder.compile_train_step(t.compiled.module, compiled_opt, loss_of(t.compiled));
  for (int64_t i = 0; i < steps; ++i) {
    const Batch b = batches(i);
    const at::Tensor compiled_loss = step({b.inputs, b.targets});
    const at::Tensor eager_loss = eager_train_step(t.eager, eager_opt, b);
    INFO("step " << i);
    REQUIRE_CLOSE(compiled_loss, eager_loss, rtol, atol);
  }
  REQUIRE(step.num_compilations() == 1);
  require_same_state(t.compiled, t.eager, rtol, atol);
  const std::vector<at::Tensor> final = snapshot(t.compiled);
  double moved = 0;
  for (size_t i = 0; i < final.size(); ++i) moved = std::max(moved, (final[i] - initial[i]).abs().max().item<double>());
  REQUIRE(moved > 1e-3);
  return step;
}

}  // namespace

// Tolerance of every comparison here: rtol 1e-5, atol 1e-6. The compiled graph
// runs the kernels eager runs, on operands of the same layout and in the
// same order, and the optimizer updates are torch::optim's ops
// (Note [Traceable optimizer state]): with the interpreter the two runs agree
// bitwise (observed with 1 and 2 OpenMP threads). The tolerance leaves room
// for a backend that reorders floating-point work (fused reductions), whose
// last-bit differences 50 steps compound to well below these bounds; a graph
// that baked a step-1 constant (Adam's bias correction, a learning rate),
// missed a buffer update or dropped a step is off by far more.
constexpr double kRtol = 1e-5, kAtol = 1e-6;

TEST_CASE("train step: MLP, 50 steps of SGD with momentum on Fashion-MNIST equal eager", "[pipeline][train_step]") {
  train_and_compare<torch::optim::SGD>([] { return make_mlp(); }, torch::optim::SGDOptions(0.05).momentum(0.9),
                                       fashion_mnist_batches(32), 50, kRtol, kAtol);
}

TEST_CASE("train step: MLP, 50 steps of Adam on Fashion-MNIST equal eager", "[pipeline][train_step]") {
  train_and_compare<torch::optim::Adam>([] { return make_mlp(); }, torch::optim::AdamOptions(1e-3),
                                        fashion_mnist_batches(32), 50, kRtol, kAtol);
}

TEST_CASE("train step: ConvNet, 50 steps of SGD with momentum on Fashion-MNIST equal eager", "[pipeline][train_step]") {
  train_and_compare<torch::optim::SGD>([] { return make_convnet(); },
                                       torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true),
                                       fashion_mnist_batches(32), 50, kRtol, kAtol);
}

TEST_CASE("train step: ConvNet, 50 steps of AdamW on Fashion-MNIST equal eager", "[pipeline][train_step]") {
  train_and_compare<torch::optim::AdamW>([] { return make_convnet(); }, torch::optim::AdamWOptions(2e-3),
                                         fashion_mnist_batches(32), 50, kRtol, kAtol);
}

TEST_CASE("train step: ResNet-18's BatchNorm running statistics are updated as eager updates them",
          "[pipeline][train_step]") {
  // One block per stage and width 4 keep it quick; every BatchNorm and the
  // downsampling path are still there.
  const ResNetConfig config{.in_channels = 1, .image_size = 16, .width = 4, .blocks = {1, 1, 1, 1}};
  const Model shapes = make_resnet(config);
  train_and_compare<torch::optim::SGD>([&] { return make_resnet(config); },
                                       torch::optim::SGDOptions(0.05).momentum(0.9),
                                       [&](int64_t i) { return shapes.example_batch(8, 100 + i); }, 8, kRtol, kAtol);
}

TEST_CASE("train step: the GPT with its tied head (one parameter) trains as eager with AdamW",
          "[pipeline][train_step]") {
  const GptConfig config{.vocab_size = 32, .block_size = 16, .n_layer = 1, .n_head = 2, .n_embd = 32};
  train_and_compare<torch::optim::AdamW>(
      [&] { return make_gpt(config); }, torch::optim::AdamWOptions(3e-3),
      [&](int64_t i) {
        return synthetic_token_batch({config.vocab_size, config.block_size, 4, 0}, i);
      },
      20, kRtol, kAtol);
}

// Through the inductor backend, traced with the core decompositions so that
// softmax, layer norm, GELU, batch norm's backward and the losses become the
// pointwise ops and reductions it fuses; in float64, rtol 1e-9, atol 1e-11.
// Fused kernels round differently from ATen's (sums in another order), and
// training turns a last-bit difference into a discrete one now and then: a
// max-pool argmax or a ReLU that flips between two nearly equal values sends
// a gradient elsewhere, and from that step on the runs differ by the
// learning rate times that gradient (observed in float32: 3e-8 for twelve
// steps, then 2e-5 at once on the ConvNet with one thread). In float64 the
// differences stay ~1e-16 relative, far from any such tie, so the
// comparison can be tight; a wrong kernel is off by the values' own scale.
Builder inductor_builder() {
  return std::move(Builder().decompositions(crucible::tracer::core_aten_decompositions()).backend("inductor"));
}
constexpr double kFusedRtol = 1e-9, kFusedAtol = 1e-11;

std::function<Model()> in_double(std::function<Model()> make) {
  return [make] {
    Model m = make();
    m.module->to(torch::kDouble);
    return m;
  };
}

BatchFn in_double(BatchFn batches) {
  return [batches](int64_t step) {
    Batch b = batches(step);
    if (at::isFloatingType(b.inputs.scalar_type())) b.inputs = b.inputs.to(at::kDouble);
    return b;
  };
}

TEST_CASE("train step through inductor: MLP and ConvNet, 20 steps of Adam and SGD equal eager",
          "[pipeline][train_step][inductor]") {
  train_and_compare<torch::optim::Adam>(in_double([] { return make_mlp(); }), torch::optim::AdamOptions(1e-3),
                                        in_double(fashion_mnist_batches(32)), 20, kFusedRtol, kFusedAtol,
                                        inductor_builder());
  train_and_compare<torch::optim::SGD>(
      in_double([] { return make_convnet(); }), torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true),
      in_double(fashion_mnist_batches(32)), 20, kFusedRtol, kFusedAtol, inductor_builder());
}

TEST_CASE("train step through inductor: the GPT trains as eager with AdamW", "[pipeline][train_step][inductor]") {
  const GptConfig config{.vocab_size = 32, .block_size = 16, .n_layer = 1, .n_head = 2, .n_embd = 32};
  train_and_compare<torch::optim::AdamW>(
      in_double([&] { return make_gpt(config); }), torch::optim::AdamWOptions(3e-3),
      [&](int64_t i) {
        return synthetic_token_batch({config.vocab_size, config.block_size, 4, 0}, i);
      },
      20, kFusedRtol, kFusedAtol, inductor_builder());
}

TEST_CASE("train step through inductor: the GPT over changing lengths and a smaller last batch trains as eager",
          "[pipeline][train_step][inductor][dynamic]") {
  // Each new (batch, length) traces and compiles its step again; the C++
  // kernels are built for the first shape, once more when the length
  // changes (Note [Dynamic sizes]) and once more when the batch does, and
  // every later shape reuses them.
  const GptConfig config{.vocab_size = 32, .block_size = 24, .n_layer = 1, .n_head = 2, .n_embd = 32};
  crucible::inductor::InductorOptions o;
  o.cache_dir = crucible::testing::temp_dir("crucible-dynamic-train");
  const Builder builder =
      std::move(Builder()
                    .decompositions(crucible::tracer::core_aten_decompositions())
                    .backend("inductor, own cache", [o](const crucible::ir::Graph& g, const auto& examples) {
                      return crucible::inductor::compile_fx_inner(g, examples, o);
                    }));
  Twins t = twins(in_double([&] { return make_gpt(config); }));
  torch::optim::AdamW compiled_opt(t.compiled.module->parameters(), torch::optim::AdamWOptions(3e-3));
  torch::optim::AdamW eager_opt(t.eager.module->parameters(), torch::optim::AdamWOptions(3e-3));
  TrainStep step = builder.compile_train_step(t.compiled.module, compiled_opt, loss_of(t.compiled));
  // Length 24 is the whole block: with contiguous batches it traces the
  // graph the other lengths trace, and shares their kernels.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{5, 7},  {5, 13}, {5, 9},  {5, 15}, {5, 24}, {5, 11},
                                                           {5, 17}, {5, 19}, {3, 13}, {3, 21}, {5, 7}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto [b, len] = shapes[i];
    Batch batch = synthetic_token_batch({config.vocab_size, config.block_size, b, 0}, static_cast<int64_t>(i));
    // Contiguous, as a loader's padded batches: a slice of a longer batch
    // is not, and the loss's reshape of it traces a copy instead of a view.
    batch = {batch.inputs.slice(1, 0, len).contiguous(), batch.targets.slice(1, 0, len).contiguous()};
    INFO("step " << i << ": batch " << b << ", length " << len);
    REQUIRE_CLOSE(step({batch.inputs, batch.targets}), eager_train_step(t.eager, eager_opt, batch), kFusedRtol,
                  kFusedAtol);
  }
  require_same_state(t.compiled, t.eager, kFusedRtol, kFusedAtol);
  CHECK(step.num_compilations() == shapes.size() - 1);  // the last shape is the first's
  int64_t libraries = 0;
  for (const auto& e : std::filesystem::directory_iterator(o.cache_dir)) libraries += e.path().extension() == ".so";
  CHECK(libraries == 3);
}

// The AOT path with min-cut and inductor (inductor::compile_fx: core
// decompositions, the min-cut partition, forward and backward compiled by
// inductor), on every zoo model's loss in float64: the loss, every
// parameter's gradient and every buffer (batch norm's running statistics)
// as eager's, within the fused bounds.
TEST_CASE("compile_fx: every zoo model's loss and gradients through min-cut and inductor equal eager's",
          "[pipeline][train_step][inductor][min_cut]") {
  for (const std::string& name : model_names()) {
    INFO(name);
    Twins t = twins(in_double([&] { return make_model(name); }));
    t.compiled.module->train();
    t.eager.module->train();
    Batch b = t.compiled.example_batch(4, 0);
    if (at::isFloatingType(b.inputs.scalar_type())) b.inputs = b.inputs.to(at::kDouble);
    auto compiled = crucible::inductor::compile_fx(
        t.compiled.module,
        [loss = loss_of(t.compiled)](torch::nn::Module& m, const std::vector<at::Tensor>& in) {
          return std::vector<at::Tensor>{loss(m, in)};
        },
        {b.inputs, b.targets});
    const at::Tensor loss = compiled({b.inputs, b.targets}).at(0);
    loss.backward();
    const at::Tensor eager_loss = t.eager.loss(t.eager.forward(b.inputs), b.targets);
    eager_loss.backward();
    REQUIRE_CLOSE(loss.detach(), eager_loss.detach(), kFusedRtol, kFusedAtol);
    auto eager_params = t.eager.module->named_parameters();
    for (const auto& p : t.compiled.module->named_parameters()) {
      INFO("gradient of " << p.key());
      REQUIRE_CLOSE(p.value().grad(), eager_params[p.key()].grad(), kFusedRtol, kFusedAtol);
    }
    auto eager_buffers = t.eager.module->named_buffers();
    for (const auto& buf : t.compiled.module->named_buffers()) {
      INFO("buffer " << buf.key());
      REQUIRE_CLOSE(buf.value(), eager_buffers[buf.key()], kFusedRtol, kFusedAtol);
    }
  }
}

// fuse_attention as a pre-grad pass (Note [Pre-grad passes in a training
// step]): the GPT's written-out attention becomes scaled_dot_product_attention
// before differentiation, so the step's graph runs the fused attention kernel
// `fused` and its backward instead of the scores' matmuls and softmax. Ten
// SGD steps of a 2-layer GPT with `builder` (its pre-grad passes set here)
// against eager, on `device` in `dtype`, within rtol/atol.
void train_gpt_with_fused_attention(Builder builder, at::Device device, at::ScalarType dtype, const std::string& fused,
                                    double rtol, double atol) {
  const GptConfig config{.vocab_size = 32, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 32};
  builder.pre_grad_passes({"fuse_attention"});
  INFO("backend " << builder.backend_name() << " on " << device);
  Twins t = twins([&] {
    Model m = make_gpt(config);
    m.module->to(device, dtype);
    return m;
  });
  torch::optim::SGD compiled_opt(t.compiled.module->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD eager_opt(t.eager.module->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  TrainStep step = builder.compile_train_step(t.compiled.module, compiled_opt, loss_of(t.compiled));
  for (int64_t i = 0; i < 10; ++i) {
    Batch b = synthetic_token_batch({config.vocab_size, config.block_size, 4, 0}, i);
    b = Batch{b.inputs.to(device), b.targets.to(device)};
    const at::Tensor compiled_loss = step({b.inputs, b.targets});
    INFO("step " << i);
    REQUIRE_CLOSE(compiled_loss, eager_train_step(t.eager, eager_opt, b), rtol, atol);
  }
  require_same_state(t.compiled, t.eager, rtol, atol);
  size_t forward = 0, backward = 0, softmax = 0;
  for (const crucible::ir::Node* n : step.graph().nodes()) {
    if (!n->is_call()) continue;
    forward += n->target() == fused;
    backward += n->target() == fused + "_backward";
    softmax += n->target() == "aten::_softmax";
  }
  CHECK(forward == static_cast<size_t>(config.n_layer));
  CHECK(backward == static_cast<size_t>(config.n_layer));
  CHECK(softmax == 0);  // the attention's was the only softmax (the loss's is a log_softmax)
}

// On a CPU: flash attention's kernel for CPUs; float64, where its other
// summation order stays ~1e-15 relative, so the inductor bounds hold for
// both backends.
TEST_CASE("train step with fuse_attention before differentiation: the GPT trains as eager",
          "[pipeline][train_step][fuse_attention]") {
  for (const Builder& builder : {Builder().backend("interpreter"), inductor_builder()})
    train_gpt_with_fused_attention(builder, at::kCPU, at::kDouble, "aten::_scaled_dot_product_flash_attention_for_cpu",
                                   kFusedRtol, kFusedAtol);
}

TEST_CASE("train step through inductor: ResNet-18 with BatchNorm statistics, 8 SGD steps",
          "[pipeline][train_step][inductor]") {
  const ResNetConfig config{.in_channels = 1, .image_size = 16, .width = 4, .blocks = {1, 1, 1, 1}};
  const Model shapes = make_resnet(config);
  train_and_compare<torch::optim::SGD>(in_double([&] { return make_resnet(config); }),
                                       torch::optim::SGDOptions(0.05).momentum(0.9),
                                       in_double([&](int64_t i) { return shapes.example_batch(8, 100 + i); }), 8,
                                       kFusedRtol, kFusedAtol, inductor_builder());
}

// Rematerialization inside the step's graph (Note [Rematerialization in
// one graph]): the backward recomputes what the cut does not keep alive.
// Recomputed values come from the same kernels as the originals, so the
// steps agree with eager as closely as without it: bitwise with the
// interpreter (the bounds above), as the fused bounds with inductor.
// `report` receives what the last compilation's cut did.
Builder with_remat(Builder builder, std::shared_ptr<crucible::partitioner::RematReport> report,
                   double memory_budget = 1.0) {
  crucible::partitioner::MinCutOptions options;
  options.memory_budget = memory_budget;
  builder.remat(std::nullopt);  // this cut, unconditional, in place of the backend's weighed one
  builder.add_pass({"remat", [report, options](crucible::ir::Graph& g) {
                      *report = crucible::partitioner::rematerialize(g, options);
                    }});
  return builder;
}

void require_recomputed(const crucible::partitioner::RematReport& r) {
  INFO("kept " << r.kept_bytes_before << " -> " << r.kept_bytes_after << " bytes, " << r.recomputed_nodes
               << " nodes recomputed");
  REQUIRE(r.recomputed_nodes > 0);
  REQUIRE(r.kept_bytes_after < r.kept_bytes_before);
}

TEST_CASE("train step with rematerialization in its graph: every zoo model trains as eager, keeping no more bytes",
          "[pipeline][train_step][remat]") {
  // Budget 1: the heuristics' cut; budget 0: whatever can be recomputed,
  // matmuls included.
  for (double budget : {1.0, 0.0}) {
    CAPTURE(budget);
    auto report = std::make_shared<crucible::partitioner::RematReport>();
    auto check = [&] {
      INFO("kept " << report->kept_bytes_before << " -> " << report->kept_bytes_after << " bytes, "
                   << report->recomputed_nodes << " nodes recomputed");
      REQUIRE(report->kept_bytes_after <= report->kept_bytes_before);
      if (budget == 0.0) require_recomputed(*report);
    };
    train_and_compare<torch::optim::SGD>([] { return make_mlp(); }, torch::optim::SGDOptions(0.05).momentum(0.9),
                                         fashion_mnist_batches(32), 10, kRtol, kAtol,
                                         with_remat(Builder().backend("interpreter"), report, budget));
    check();
    train_and_compare<torch::optim::Adam>([] { return make_convnet(); }, torch::optim::AdamOptions(1e-3),
                                          fashion_mnist_batches(32), 10, kRtol, kAtol,
                                          with_remat(Builder().backend("interpreter"), report, budget));
    check();
    const GptConfig gpt{.vocab_size = 32, .block_size = 16, .n_layer = 1, .n_head = 2, .n_embd = 32};
    train_and_compare<torch::optim::AdamW>([&] { return make_gpt(gpt); }, torch::optim::AdamWOptions(3e-3),
                                           [&](int64_t i) {
                                             return synthetic_token_batch({gpt.vocab_size, gpt.block_size, 4, 0}, i);
                                           },
                                           10, kRtol, kAtol,
                                           with_remat(Builder().backend("interpreter"), report, budget));
    check();
    const ResNetConfig resnet{.in_channels = 1, .image_size = 16, .width = 4, .blocks = {1, 1, 1, 1}};
    const Model shapes = make_resnet(resnet);
    train_and_compare<torch::optim::SGD>([&] { return make_resnet(resnet); },
                                         torch::optim::SGDOptions(0.05).momentum(0.9),
                                         [&](int64_t i) { return shapes.example_batch(8, 100 + i); }, 8, kRtol, kAtol,
                                         with_remat(Builder().backend("interpreter"), report, budget));
    check();
  }
}

TEST_CASE("train step with rematerialization: a memory budget sweep keeps non-increasing bytes, training as eager",
          "[pipeline][train_step][remat]") {
  const GptConfig gpt{.vocab_size = 32, .block_size = 16, .n_layer = 1, .n_head = 2, .n_embd = 32};
  double last = std::numeric_limits<double>::infinity();
  for (double budget : {1.0, 0.5, 0.1, 0.0}) {
    CAPTURE(budget);
    auto report = std::make_shared<crucible::partitioner::RematReport>();
    train_and_compare<torch::optim::AdamW>([&] { return make_gpt(gpt); }, torch::optim::AdamWOptions(3e-3),
                                           [&](int64_t i) {
                                             return synthetic_token_batch({gpt.vocab_size, gpt.block_size, 4, 0}, i);
                                           },
                                           5, kRtol, kAtol,
                                           with_remat(Builder().backend("interpreter"), report, budget));
    REQUIRE(report->kept_bytes_after <= last);
    last = report->kept_bytes_after;
  }
}

// Note [Rematerialization in one graph]: remat_pass keeps its rewrite only
// where it lowers the step's estimated peak. The ConvNet's cut keeps fewer
// bytes alive by its own sum, yet the peak stays (its pooling backward's
// moment): the graph is left as it was. The zoo's small GPT's peak drops:
// the rewrite stays, lower by the estimate. Both train as eager.
TEST_CASE("train step with remat_pass: the rewrite stays only where it lowers the estimated peak",
          "[pipeline][train_step][remat]") {
  struct Seen {
    size_t nodes = 0;
    double peak = 0;
  };
  // `seen` gets the last compiled step's graph after the post-grad passes.
  auto builder = [](bool remat, std::shared_ptr<Seen> seen) {
    Builder b = Builder().backend("interpreter");
    if (remat) b.add_pass(crucible::partitioner::remat_pass());
    b.add_pass({"probe", [seen](crucible::ir::Graph& g) {
                  seen->nodes = g.num_nodes();
                  seen->peak = crucible::partitioner::estimated_peak_bytes(g);
                }});
    return b;
  };
  const Model gpt_shapes = make_gpt();  // the zoo's small GPT: its peak is at activations the cut frees
  for (const bool is_gpt : {false, true}) {
    INFO((is_gpt ? "gpt" : "convnet"));
    auto without = std::make_shared<Seen>(), with = std::make_shared<Seen>();
    for (const bool remat : {false, true}) {
      const Builder b = builder(remat, remat ? with : without);
      if (is_gpt)
        train_and_compare<torch::optim::AdamW>([] { return make_gpt(); }, torch::optim::AdamWOptions(3e-3),
                                               [&](int64_t i) { return gpt_shapes.example_batch(8, 100 + i); }, 3,
                                               kRtol, kAtol, b);
      else
        train_and_compare<torch::optim::Adam>([] { return make_convnet(); }, torch::optim::AdamOptions(1e-3),
                                              fashion_mnist_batches(32), 3, kRtol, kAtol, b);
    }
    REQUIRE(without->peak > 0);
    if (is_gpt) {
      CHECK(with->peak < without->peak);
      CHECK(with->nodes > without->nodes);  // the recomputed copies
    } else {
      CHECK(with->peak == without->peak);
      CHECK(with->nodes == without->nodes);
    }
  }
}

// MinCutOptions::estimated_ms: the rewrite that lowers the small GPT's peak
// costs between 2% and 20% by the inductor's roofline (8.7% for the
// inductor backend's graph of the step at batch 8, 12% measured on a CPU:
// bench/results/partitioner.md). A 2% limit leaves the graph as it was; a
// 20% one keeps the rewrite. All train as eager.
TEST_CASE("train step with remat_pass and a cost model: the rewrite stays only within the slowdown allowed",
          "[pipeline][train_step][remat]") {
  const Model shapes = make_gpt();
  auto nodes_with = [&](std::optional<double> max_slowdown) {
    auto nodes = std::make_shared<size_t>(0);
    crucible::partitioner::MinCutOptions options;
    if (max_slowdown) {
      options.estimated_ms = [](const crucible::ir::Graph& g) { return crucible::inductor::estimated_ms(g); };
      options.max_slowdown = *max_slowdown;
    }
    Builder b = Builder().backend("interpreter");
    b.add_pass(crucible::partitioner::remat_pass(options));
    b.add_pass({"probe", [nodes](crucible::ir::Graph& g) { *nodes = g.num_nodes(); }});
    train_and_compare<torch::optim::AdamW>([] { return make_gpt(); }, torch::optim::AdamWOptions(3e-3),
                                           [&](int64_t i) { return shapes.example_batch(8, 100 + i); }, 2, kRtol, kAtol,
                                           b);
    return *nodes;
  };
  const size_t unguarded = nodes_with(std::nullopt), tight = nodes_with(0.02), loose = nodes_with(0.2);
  Builder plain = Builder().backend("interpreter");
  auto plain_nodes = std::make_shared<size_t>(0);
  plain.add_pass({"probe", [plain_nodes](crucible::ir::Graph& g) { *plain_nodes = g.num_nodes(); }});
  train_and_compare<torch::optim::AdamW>([] { return make_gpt(); }, torch::optim::AdamWOptions(3e-3),
                                         [&](int64_t i) { return shapes.example_batch(8, 100 + i); }, 2, kRtol, kAtol,
                                         plain);
  CHECK(unguarded > *plain_nodes);  // the recomputed copies
  CHECK(tight == *plain_nodes);
  CHECK(loose == unguarded);
}

// Builder::remat's default: with a backend that has a cost model
// (BackendInfo::estimated_ms), the cut inside the step is kept where it
// lowers the estimated peak at ≤ 2% more time by that model. The zoo's
// small GPT's cut lowers its peak at 8.7% more time by the inductor's
// roofline (the test above), so the inductor's default leaves the step as
// it was; a backend whose model gives every graph the same time keeps it.
// Without a model (the interpreter), or with remat(std::nullopt), nothing
// is recomputed. All train as eager.
TEST_CASE("train step: min-cut inside the step by default, where the backend's cost model allows it",
          "[pipeline][train_step][inductor][remat]") {
  CHECK_FALSE(Builder().backend("interpreter").remat().has_value());
  const Builder inductor = Builder().backend("inductor");
  REQUIRE(inductor.remat().has_value());
  CHECK(inductor.remat()->max_slowdown == 0.02);
  CHECK(inductor.remat()->estimated_ms);
  CHECK_FALSE(Builder().remat(std::nullopt).backend("inductor").remat().has_value());  // a choice outlives backend()

  crucible::runtime::BackendRegistry registry = crucible::runtime::BackendRegistry::builtin();
  crucible::runtime::BackendInfo flat = registry.get("interpreter");
  flat.name = "interpreter-with-a-flat-cost-model";
  flat.estimated_ms = [](const crucible::ir::Graph&) { return 1.0; };
  registry.add(flat);

  const Model shapes = make_gpt();
  auto nodes_with = [&](const Builder& b) {
    return train_and_compare<torch::optim::AdamW>([] { return make_gpt(); }, torch::optim::AdamWOptions(3e-3),
                                                  [&](int64_t i) { return shapes.example_batch(8, 100 + i); }, 2, kRtol,
                                                  kAtol, b)
        .graph()
        .num_nodes();
  };
  const size_t plain = nodes_with(Builder().backend("interpreter"));
  CHECK(nodes_with(Builder().backend(flat.name, registry)) > plain);  // the recomputed copies
  CHECK(nodes_with(Builder().backend(flat.name, registry).remat(std::nullopt)) == plain);
  // The inductor's own model: the rewrite costs more than 2%.
  CHECK(nodes_with(Builder().backend("interpreter").remat(inductor.remat())) == plain);
}

TEST_CASE("train step through inductor with rematerialization: the GPT and ResNet-18 train as eager",
          "[pipeline][train_step][inductor][remat]") {
  // Budget 0: the most recomputation, fused into the backward's kernels
  // where it is pointwise.
  auto report = std::make_shared<crucible::partitioner::RematReport>();
  const GptConfig gpt{.vocab_size = 32, .block_size = 16, .n_layer = 1, .n_head = 2, .n_embd = 32};
  train_and_compare<torch::optim::AdamW>(
      in_double([&] { return make_gpt(gpt); }), torch::optim::AdamWOptions(3e-3),
      [&](int64_t i) {
        return synthetic_token_batch({gpt.vocab_size, gpt.block_size, 4, 0}, i);
      },
      10, kFusedRtol, kFusedAtol, with_remat(inductor_builder(), report, 0.0));
  require_recomputed(*report);
  const ResNetConfig resnet{.in_channels = 1, .image_size = 16, .width = 4, .blocks = {1, 1, 1, 1}};
  const Model shapes = make_resnet(resnet);
  train_and_compare<torch::optim::SGD>(in_double([&] { return make_resnet(resnet); }),
                                       torch::optim::SGDOptions(0.05).momentum(0.9),
                                       in_double([&](int64_t i) { return shapes.example_batch(8, 100 + i); }), 8,
                                       kFusedRtol, kFusedAtol, with_remat(inductor_builder(), report, 0.0));
  require_recomputed(*report);
}

// The same training steps with the model, the batches and the optimizer
// state on the GPU: fused kernels are generated as CUDA C++ (Note [CUDA
// rendering]), everything else runs ATen's CUDA kernels. Float64 and the
// bounds above, for the reasons above; CUDA's float64 sums round as the
// CPU's do (a few ulps), far inside them.
std::function<Model()> on_cuda(std::function<Model()> make) {
  return [make] {
    Model m = make();
    m.module->to(at::Device(at::kCUDA));
    return m;
  };
}

BatchFn on_cuda(BatchFn batches) {
  return [batches](int64_t step) {
    Batch b = batches(step);
    return Batch{b.inputs.to(at::kCUDA), b.targets.to(at::kCUDA)};
  };
}

TEST_CASE("train step through inductor on CUDA: MLP with Adam, ConvNet with SGD, 20 steps equal eager",
          "[pipeline][train_step][inductor][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  train_and_compare<torch::optim::Adam>(on_cuda(in_double([] { return make_mlp(); })), torch::optim::AdamOptions(1e-3),
                                        on_cuda(in_double(fashion_mnist_batches(32))), 20, kFusedRtol, kFusedAtol,
                                        inductor_builder());
  train_and_compare<torch::optim::SGD>(
      on_cuda(in_double([] { return make_convnet(); })), torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true),
      on_cuda(in_double(fashion_mnist_batches(32))), 20, kFusedRtol, kFusedAtol, inductor_builder());
}

TEST_CASE("train step through inductor on CUDA: the GPT with AdamW and ResNet-18 with SGD equal eager",
          "[pipeline][train_step][inductor][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  const GptConfig gpt{.vocab_size = 32, .block_size = 16, .n_layer = 1, .n_head = 2, .n_embd = 32};
  train_and_compare<torch::optim::AdamW>(on_cuda(in_double([&] { return make_gpt(gpt); })),
                                         torch::optim::AdamWOptions(3e-3), on_cuda(BatchFn([&](int64_t i) {
                                           return synthetic_token_batch({gpt.vocab_size, gpt.block_size, 4, 0}, i);
                                         })),
                                         20, kFusedRtol, kFusedAtol, inductor_builder());
  const ResNetConfig resnet{.in_channels = 1, .image_size = 16, .width = 4, .blocks = {1, 1, 1, 1}};
  const Model shapes = make_resnet(resnet);
  train_and_compare<torch::optim::SGD>(on_cuda(in_double([&] { return make_resnet(resnet); })),
                                       torch::optim::SGDOptions(0.05).momentum(0.9),
                                       on_cuda(in_double([&](int64_t i) { return shapes.example_batch(8, 100 + i); })),
                                       8, kFusedRtol, kFusedAtol, inductor_builder());
}

// On CUDA, the memory-efficient attention kernel, which has no float64:
// float32 (and full-precision matmuls, TF32 off by default), whose rounding
// the two sides accumulate differently over ten steps: rtol 1e-4, atol 1e-5
// (a wrong mask or scale moves the loss by its own size).
TEST_CASE("train step with fuse_attention on CUDA: the GPT trains as eager with memory-efficient attention",
          "[pipeline][train_step][fuse_attention][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  for (const Builder& builder : {Builder().backend("interpreter"), inductor_builder()})
    train_gpt_with_fused_attention(builder, at::kCUDA, at::kFloat, "aten::_scaled_dot_product_efficient_attention",
                                   1e-4, 1e-5);
}

// With CUDA graphs (Note [CUDA graphs]): the backend keeps the learning rate
// and the step counts on the GPU (TrainStepOptions::capturable), the second
// call captures the whole step and later calls replay it, on new batches
// copied into the capture's inputs. The kernels are inductor's; the bias
// corrections are computed on the device (float64, a few ulps from the
// host's), far inside the bounds above.
TEST_CASE(
    "train step through inductor with CUDA graphs: MLP with Adam, ConvNet with SGD, the GPT with AdamW equal eager",
    "[pipeline][train_step][inductor][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  crucible::testing::CollectWarnings warnings;
  auto builder = [] {
    return std::move(
        Builder().decompositions(crucible::tracer::core_aten_decompositions()).backend("inductor-cudagraphs"));
  };
  REQUIRE(builder().backend_cuda_graphs());
  train_and_compare<torch::optim::Adam>(on_cuda(in_double([] { return make_mlp(); })), torch::optim::AdamOptions(1e-3),
                                        on_cuda(in_double(fashion_mnist_batches(32))), 20, kFusedRtol, kFusedAtol,
                                        builder());
  train_and_compare<torch::optim::SGD>(
      on_cuda(in_double([] { return make_convnet(); })), torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true),
      on_cuda(in_double(fashion_mnist_batches(32))), 20, kFusedRtol, kFusedAtol, builder());
  const GptConfig gpt{.vocab_size = 32, .block_size = 16, .n_layer = 1, .n_head = 2, .n_embd = 32};
  train_and_compare<torch::optim::AdamW>(on_cuda(in_double([&] { return make_gpt(gpt); })),
                                         torch::optim::AdamWOptions(3e-3), on_cuda(BatchFn([&](int64_t i) {
                                           return synthetic_token_batch({gpt.vocab_size, gpt.block_size, 4, 0}, i);
                                         })),
                                         20, kFusedRtol, kFusedAtol, builder());
  // Captured, not run around the capture: no skip and no failed capture.
  for (const std::string& w : warnings.messages) CHECK_THAT(w, !CRUCIBLE_HAS_SUBSTR("CUDA graph"));
}

TEST_CASE(
    "train step through inductor with CUDA graphs on the CPU: trains as inductor and says why nothing is captured",
    "[pipeline][train_step][inductor]") {
  crucible::testing::CollectWarnings warnings;
  train_and_compare<torch::optim::Adam>(
      in_double([] { return make_mlp(); }), torch::optim::AdamOptions(1e-3), in_double(fashion_mnist_batches(32)), 20,
      kFusedRtol, kFusedAtol,
      std::move(Builder().decompositions(crucible::tracer::core_aten_decompositions()).backend("inductor-cudagraphs")));
  bool said = false;
  for (const std::string& w : warnings.messages)
    said |= w.find("skipping CUDA graphs: the graph runs on cpu") != std::string::npos;
  CHECK(said);
}

TEST_CASE("train step through inductor: every zoo model's CUDA kernels compile with NVRTC",
          "[pipeline][train_step][inductor][nvrtc]") {
  // Traced on the CPU (no GPU needed), the graph's metadata moved to cuda:0:
  // what lowering sees of a step traced on a GPU. Every kernel the step
  // fuses must compile for sm_90 (the H100's architecture).
  const GptConfig gpt{.vocab_size = 32, .block_size = 16, .n_layer = 1, .n_head = 2, .n_embd = 32};
  const ResNetConfig resnet{.in_channels = 1, .image_size = 16, .width = 4, .blocks = {1, 1, 1, 1}};
  const std::vector<std::pair<std::string, std::function<Model()>>> zoo = {
      {"mlp", [] { return make_mlp(); }},
      {"convnet", [] { return make_convnet(); }},
      {"gpt", [&] { return make_gpt(gpt); }},
      {"resnet18", [&] { return make_resnet(resnet); }},
  };
  crucible::inductor::InductorOptions options;
  options.cache_dir = crucible::testing::temp_dir("crucible-nvrtc-zoo");
  for (const auto& [name, make] : zoo) {
    INFO(name);
    Model m = make();
    torch::optim::AdamW optimizer(m.module->parameters(), torch::optim::AdamWOptions(1e-3));
    const Builder builder =
        std::move(Builder().decompositions(crucible::tracer::core_aten_decompositions()).backend("interpreter"));
    TrainStep step = builder.compile_train_step(m.module, optimizer, loss_of(m));
    const Batch b = m.example_batch(4, 1);
    step.compile({b.inputs, b.targets});
    crucible::ir::Graph g = step.graph().clone();
    crucible::testing::relabel_device(g, at::Device(at::kCUDA, 0));
    const crucible::inductor::GeneratedCode code = crucible::inductor::generate_code(g);
    REQUIRE(code.cuda);
    REQUIRE(code.source.find("__global__") != std::string::npos);
    const std::vector<std::string> cubins = crucible::inductor::compile_cuda(g, "sm_90", options);
    REQUIRE(!cubins.empty());
    for (const std::string& cubin : cubins)
      REQUIRE(cubin.compare(0, 4,
                            "\x7f"
                            "ELF") == 0);
  }
}

TEST_CASE("train step: the step count and the learning rate are graph inputs, not constants",
          "[pipeline][train_step]") {
  Twins t = twins([] { return make_mlp({.in_features = 784, .hidden = {32}, .num_classes = 10}); });
  torch::optim::Adam compiled_opt(t.compiled.module->parameters(), torch::optim::AdamOptions(1e-2));
  torch::optim::Adam eager_opt(t.eager.module->parameters(), torch::optim::AdamOptions(1e-2));
  TrainStep step =
      Builder().backend("interpreter").compile_train_step(t.compiled.module, compiled_opt, loss_of(t.compiled));
  const BatchFn batches = fashion_mnist_batches(16);
  // A schedule that changes the rate at every step, set on each optimizer as
  // a torch::optim scheduler would set it.
  for (int64_t i = 0; i < 30; ++i) {
    const double lr = 1e-2 * (1 + std::cos(M_PI * static_cast<double>(i) / 30)) / 2;
    static_cast<torch::optim::AdamOptions&>(compiled_opt.param_groups()[0].options()).lr(lr);
    static_cast<torch::optim::AdamOptions&>(eager_opt.param_groups()[0].options()).lr(lr);
    const Batch b = batches(i);
    step({b.inputs, b.targets});
    eager_train_step(t.eager, eager_opt, b);
  }
  require_same_state(t.compiled, t.eager, kRtol, kAtol);

  const crucible::ir::Graph& g = step.graph();
  const auto& sig = g.signature();
  const auto state = sig.inputs_of(crucible::ir::InputKind::State);
  // step, exp_avg and exp_avg_sq of 4 parameters, then the learning rate.
  REQUIRE(state.size() == 4 * 3 + 1);
  CHECK(sig.inputs[state.back()].target == "lr");
  CHECK(sig.inputs[state.front()].target == "fc1.weight.step");
  CHECK(sig.inputs_of(crucible::ir::InputKind::Parameter).size() == 4);
  CHECK(sig.inputs_of(crucible::ir::InputKind::UserInput).size() == 2);
  REQUIRE(sig.outputs.size() == 1);
  CHECK(sig.outputs[0].kind == crucible::ir::OutputKind::Loss);
  // The optimizer's state has counted the 30 steps.
  for (const ParamState& s : step.optimizer_state().params) CHECK(s.step.item<double>() == 30);
}

TEST_CASE("train step: compiling changes nothing; a new batch size compiles again", "[pipeline][train_step]") {
  Twins t = twins([] { return make_convnet(); });
  torch::optim::SGD compiled_opt(t.compiled.module->parameters(), torch::optim::SGDOptions(0.1).momentum(0.5));
  torch::optim::SGD eager_opt(t.eager.module->parameters(), torch::optim::SGDOptions(0.1).momentum(0.5));
  TrainStep step =
      Builder().backend("interpreter").compile_train_step(t.compiled.module, compiled_opt, loss_of(t.compiled));
  const std::vector<at::Tensor> before = snapshot(t.compiled);
  const Batch first = fashion_mnist_batches(8)(0);
  step.compile({first.inputs, first.targets});
  REQUIRE(step.num_compilations() == 1);
  const std::vector<at::Tensor> after = snapshot(t.compiled);
  for (size_t i = 0; i < before.size(); ++i) REQUIRE_EQUAL_TENSORS(after[i], before[i]);
  for (const ParamState& s : step.optimizer_state().params) REQUIRE(s.step.item<double>() == 0);

  for (int64_t i = 0; i < 4; ++i) {
    const Batch b = fashion_mnist_batches(i % 2 ? 8 : 5)(i);
    REQUIRE_CLOSE(step({b.inputs, b.targets}), eager_train_step(t.eager, eager_opt, b), kRtol, kAtol);
  }
  CHECK(step.num_compilations() == 2);
  require_same_state(t.compiled, t.eager, kRtol, kAtol);
}

TEST_CASE("train step: one submodule switched to eval() compiles again and trains as eager", "[pipeline][train_step]") {
  const ResNetConfig config{.in_channels = 1, .image_size = 16, .width = 4, .blocks = {1, 1, 1, 1}};
  const Model shapes = make_resnet(config);
  Twins t = twins([&] { return make_resnet(config); });
  torch::optim::SGD compiled_opt(t.compiled.module->parameters(), torch::optim::SGDOptions(0.05));
  torch::optim::SGD eager_opt(t.eager.module->parameters(), torch::optim::SGDOptions(0.05));
  TrainStep step =
      Builder().backend("interpreter").compile_train_step(t.compiled.module, compiled_opt, loss_of(t.compiled));
  // The first BatchNorm in both copies: in eval() it normalizes with its
  // running statistics and leaves them alone, a different graph.
  auto first_batch_norm = [](const Model& m) {
    for (const auto& child : m.module->modules(/*include_self=*/false))
      if (child->name().find("BatchNorm") != std::string::npos) return child;
    FAIL("the ResNet has no BatchNorm");
    return std::shared_ptr<torch::nn::Module>();
  };
  for (int64_t i = 0; i < 4; ++i) {
    if (i == 2) {
      first_batch_norm(t.compiled)->eval();
      first_batch_norm(t.eager)->eval();
    }
    const Batch b = shapes.example_batch(8, 200 + i);
    INFO("step " << i);
    REQUIRE_CLOSE(step({b.inputs, b.targets}), eager_train_step(t.eager, eager_opt, b), kRtol, kAtol);
  }
  CHECK(step.num_compilations() == 2);
  require_same_state(t.compiled, t.eager, kRtol, kAtol);
}

TEST_CASE("train step: a compiled step resumes from the state eager steps left in the optimizer",
          "[pipeline][train_step]") {
  Twins t = twins([] { return make_mlp({.in_features = 784, .hidden = {32}, .num_classes = 10}); });
  torch::optim::Adam compiled_opt(t.compiled.module->parameters(), torch::optim::AdamOptions(1e-2).amsgrad(true));
  torch::optim::Adam eager_opt(t.eager.module->parameters(), torch::optim::AdamOptions(1e-2).amsgrad(true));
  const BatchFn batches = fashion_mnist_batches(16);
  for (int64_t i = 0; i < 3; ++i) {
    eager_train_step(t.compiled, compiled_opt, batches(i));
    eager_train_step(t.eager, eager_opt, batches(i));
  }
  TrainStep step =
      Builder().backend("interpreter").compile_train_step(t.compiled.module, compiled_opt, loss_of(t.compiled));
  for (int64_t i = 3; i < 10; ++i) {
    const Batch b = batches(i);
    REQUIRE_CLOSE(step({b.inputs, b.targets}), eager_train_step(t.eager, eager_opt, b), kRtol, kAtol);
  }
  require_same_state(t.compiled, t.eager, kRtol, kAtol);
}

TEST_CASE("train step: a module converted to float64 after compile_train_step keeps float64 optimizer state",
          "[pipeline][train_step]") {
  // torch::optim makes its state at the first step, in the parameters' dtype
  // then; state made in float32 at compile_train_step would round every
  // momentum and moment to float32 (~1e-8 relative), far beyond the float64
  // rounding (~1e-15) the two copies differ by otherwise.
  for (const bool adam : {false, true}) {
    Twins t = twins([] { return make_mlp({.in_features = 784, .hidden = {16}, .num_classes = 10}); });
    auto make_opt = [&](const Model& m) -> std::unique_ptr<torch::optim::Optimizer> {
      if (adam) return std::make_unique<torch::optim::Adam>(m.module->parameters(), torch::optim::AdamOptions(1e-2));
      return std::make_unique<torch::optim::SGD>(m.module->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    };
    auto compiled_opt = make_opt(t.compiled), eager_opt = make_opt(t.eager);
    TrainStep step =
        Builder().backend("interpreter").compile_train_step(t.compiled.module, *compiled_opt, loss_of(t.compiled));
    t.compiled.module->to(at::kDouble);
    t.eager.module->to(at::kDouble);
    for (int64_t i = 0; i < 3; ++i) {
      Batch b = fashion_mnist_batches(16)(i);
      b.inputs = b.inputs.to(at::kDouble);
      INFO("adam " << adam << ", step " << i);
      REQUIRE_CLOSE(step({b.inputs, b.targets}), eager_train_step(t.eager, *eager_opt, b), 1e-12, 1e-14);
    }
    for (const at::Tensor& s : step.optimizer_state().flat())
      if (s.dim() > 0) CHECK(s.scalar_type() == at::kDouble);
    require_same_state(t.compiled, t.eager, 1e-12, 1e-14);
  }
}

TEST_CASE("train step: a loss of sizes [1] trains as eager's", "[pipeline][train_step]") {
  // Eager's backward() takes any loss of one element without a gradient.
  Twins t = twins([] { return make_mlp({.in_features = 784, .hidden = {16}, .num_classes = 10}); });
  torch::optim::SGD compiled_opt(t.compiled.module->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD eager_opt(t.eager.module->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const LossFn mean = loss_of(t.compiled);
  TrainStep step = Builder()
                       .backend("interpreter")
                       .compile_train_step(t.compiled.module, compiled_opt,
                                           [mean](torch::nn::Module& m, const std::vector<at::Tensor>& b) {
                                             return mean(m, b).reshape({1});
                                           });
  for (int64_t i = 0; i < 3; ++i) {
    const Batch b = fashion_mnist_batches(16)(i);
    const at::Tensor loss = step({b.inputs, b.targets});
    REQUIRE(loss.sizes() == at::IntArrayRef{1});
    REQUIRE_CLOSE(loss.reshape({}), eager_train_step(t.eager, eager_opt, b), kRtol, kAtol);
  }
  require_same_state(t.compiled, t.eager, kRtol, kAtol);
}

TEST_CASE("train step: a parameter's hook is traced once; one registered after compiling is refused",
          "[pipeline][train_step][errors]") {
  Twins t = twins([] { return make_mlp({.in_features = 784, .hidden = {16}, .num_classes = 10}); });
  torch::optim::SGD compiled_opt(t.compiled.module->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD eager_opt(t.eager.module->parameters(), torch::optim::SGDOptions(0.1));
  // A factor of 3 on one gradient: applied twice or not at all, the
  // parameters differ by far more than rounding.
  for (const Model* m : {&t.compiled, &t.eager})
    m->module->parameters().front().register_hook([](const at::Tensor& g) { return g * 3; });
  TrainStep step =
      Builder().backend("interpreter").compile_train_step(t.compiled.module, compiled_opt, loss_of(t.compiled));
  const Batch b = fashion_mnist_batches(16)(0);
  REQUIRE_CLOSE(step({b.inputs, b.targets}), eager_train_step(t.eager, eager_opt, b), kRtol, kAtol);
  require_same_state(t.compiled, t.eager, kRtol, kAtol);
  const at::Tensor last = t.compiled.module->parameters().back();
  last.register_hook([](const at::Tensor& g) { return g * 0; });
  const at::Tensor before = last.detach().clone();
  REQUIRE_THROWS_WITH(step({b.inputs, b.targets}), CRUCIBLE_HAS_SUBSTR("hook was registered on or removed from"));
  REQUIRE_EQUAL_TENSORS(last.detach(), before);
}

TEST_CASE("train step: clear errors for optimizers it cannot compile", "[pipeline][train_step][errors]") {
  Model m = make_mlp({.in_features = 4, .hidden = {}, .num_classes = 2});
  const LossFn loss = loss_of(m);
  SECTION("a tensor that is not a parameter of the module") {
    torch::optim::SGD opt({at::zeros({3}, at::requires_grad())}, torch::optim::SGDOptions(0.1));
    CHECK_THROWS_WITH(compile_train_step(m.module, opt, loss), CRUCIBLE_HAS_SUBSTR("not a parameter of the module"));
  }
  SECTION("an optimizer without a traceable update") {
    torch::optim::Adagrad opt(m.module->parameters(), torch::optim::AdagradOptions(0.1));
    CHECK_THROWS_AS(compile_train_step(m.module, opt, loss), PipelineError);
  }
  SECTION("a loss that is not a scalar") {
    torch::optim::SGD opt(m.module->parameters(), torch::optim::SGDOptions(0.1));
    TrainStep step = Builder()
                         .backend("interpreter")
                         .compile_train_step(m.module, opt, [&](torch::nn::Module&, const std::vector<at::Tensor>& b) {
                           return m.forward(b[0]);
                         });
    CHECK_THROWS_WITH(step({at::ones({2, 4}), at::zeros({2}, at::kLong)}),
                      CRUCIBLE_HAS_SUBSTR("must return a tensor of one element"));
  }
  SECTION("options other than the learning rate changed after compiling (constants of the step)") {
    torch::optim::SGD opt(m.module->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    TrainStep step = Builder().backend("interpreter").compile_train_step(m.module, opt, loss);
    const std::vector<at::Tensor> batch = {at::ones({2, 4}), at::zeros({2}, at::kLong)};
    step(batch);
    auto& options = static_cast<torch::optim::SGDOptions&>(opt.param_groups()[0].options());
    options.lr(0.05);  // a scheduler's change: read at every call
    step(batch);
    options.momentum(0.5);
    CHECK_THROWS_WITH(step(batch), CRUCIBLE_HAS_SUBSTR("compile a new step for the new options"));
  }
}

TEST_CASE("train step: every zoo model's graph is functional, its writes the trailing copies",
          "[pipeline][train_step]") {
  for (const std::string& name : model_names()) {
    INFO(name);
    torch::manual_seed(0);
    Model m = make_model(name);
    m.module->train();
    torch::optim::Adam opt(m.module->parameters(), torch::optim::AdamOptions(1e-3));
    TrainStep step = Builder().backend("interpreter").compile_train_step(m.module, opt, loss_of(m));
    const Batch b = m.example_batch(2, 0);
    step.compile({b.inputs, b.targets});
    const crucible::ir::Graph& g = step.graph();
    // The mutations: aten::copy_ into a placeholder, after every other op.
    bool writing = false;
    size_t copies = 0;
    for (const crucible::ir::Node* n : g.nodes()) {
      if (!n->is_call()) continue;
      const bool copy =
          n->target() == "aten::copy_" && n->arg(0).is_value() && n->arg(0).value()->node()->is_placeholder();
      INFO(n->target());
      REQUIRE((copy || !n->is_mutating()));
      REQUIRE((copy || !writing));
      writing |= copy;
      copies += copy;
      REQUIRE(n->target() != "aten::native_batch_norm");  // hidden writes: Note [Ops with hidden writes]
    }
    // Every parameter and every optimizer state tensor is written.
    const auto& sig = g.signature();
    REQUIRE(copies >= sig.inputs_of(crucible::ir::InputKind::Parameter).size() +
                          sig.inputs_of(crucible::ir::InputKind::State).size() - 1);  // all but the rate
  }
}

TEST_CASE("train step: a step that fails to compile leaves the module, its gradients and the optimizer as they were",
          "[pipeline][train_step][errors]") {
  // A loss that reads a value the trace cannot hold (nonzero's data-dependent
  // size), after the forward has run a BatchNorm in training mode: the
  // failed compile must not have written the running statistics, the
  // parameters, their .grad or the optimizer's state, so the user's eager
  // fallback continues from exactly where it was.
  const ResNetConfig config{.in_channels = 1, .image_size = 8, .width = 4, .blocks = {1, 1, 1, 1}};
  Twins t = twins([&] { return make_resnet(config); });
  const Batch b = make_resnet(config).example_batch(4, 7);
  const LossFn compiled_loss = loss_of(t.compiled);
  const LossFn failing = [&](torch::nn::Module& m, const std::vector<at::Tensor>& batch) {
    at::Tensor loss = compiled_loss(m, batch);
    return loss * at::nonzero(batch[1]).size(0);
  };
  for (const bool fake : {false, true}) {
    INFO((fake ? "fake mode" : "real mode"));
    torch::optim::Adam compiled_opt(t.compiled.module->parameters(), torch::optim::AdamOptions(1e-2));
    torch::optim::Adam eager_opt(t.eager.module->parameters(), torch::optim::AdamOptions(1e-2));
    // Some state to keep: a step each, and .grad left filled by a backward.
    eager_train_step(t.compiled, compiled_opt, b);
    eager_train_step(t.eager, eager_opt, b);
    loss_of(t.compiled)(*t.compiled.module, {b.inputs, b.targets}).backward();
    loss_of(t.eager)(*t.eager.module, {b.inputs, b.targets}).backward();
    crucible::tracer::TraceOptions options;
    if (fake) options.mode = crucible::tracer::TraceMode::Fake;
    TrainStep step = Builder()
                         .backend("interpreter")
                         .trace_options(options)
                         .compile_train_step(t.compiled.module, compiled_opt, failing);
    CHECK_THROWS_WITH(step({b.inputs, b.targets}), CRUCIBLE_HAS_SUBSTR("nonzero"));
    require_same_state(t.compiled, t.eager, 0.0, 0.0);
    auto eager_params = t.eager.module->parameters();
    auto params = t.compiled.module->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      REQUIRE(params[i].grad().defined());
      REQUIRE_EQUAL_TENSORS(params[i].grad(), eager_params[i].grad());
    }
    // The optimizer continues as eager's: its state was not touched.
    for (int64_t i = 0; i < 2; ++i)
      REQUIRE_EQUAL_TENSORS(eager_train_step(t.compiled, compiled_opt, b), eager_train_step(t.eager, eager_opt, b));
    require_same_state(t.compiled, t.eager, 0.0, 0.0);
  }
}

// Note [Auto trace mode]: compiling costs no copy of the state or of the
// activations; the loss function is only ever run on fake tensors.
TEST_CASE("train step: compiled by default on fake tensors (TraceMode::Auto), the steps equal eager's",
          "[pipeline][train_step]") {
  torch::manual_seed(0);
  torch::nn::Linear compiled(6, 3), eager(6, 3);
  {
    torch::NoGradGuard no_grad;
    eager->weight.copy_(compiled->weight);
    eager->bias.copy_(compiled->bias);
  }
  torch::optim::SGD compiled_opt(compiled->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD eager_opt(eager->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  int real_calls = 0, fake_calls = 0;
  auto loss = [](torch::nn::Linear& m, const std::vector<at::Tensor>& b) {
    return at::cross_entropy_loss(m->forward(b[0]), b[1]);
  };
  TrainStep step =
      Builder()
          .backend("interpreter")
          .compile_train_step(compiled.ptr(), compiled_opt, [&](torch::nn::Module&, const std::vector<at::Tensor>& b) {
            (crucible::tracer::is_fake(b[0]) ? fake_calls : real_calls) += 1;
            return loss(compiled, b);
          });
  for (int64_t i = 0; i < 3; ++i) {
    const std::vector<at::Tensor> b = {at::randn({5, 6}), at::randint(0, 3, {5})};
    const at::Tensor l = step(b);
    eager_opt.zero_grad();
    const at::Tensor e = loss(eager, b);
    e.backward();
    eager_opt.step();
    REQUIRE_EQUAL_TENSORS(l, e.detach());
  }
  CHECK(real_calls == 0);
  CHECK(fake_calls >= 1);
  REQUIRE_EQUAL_TENSORS(compiled->weight.detach(), eager->weight.detach());
  REQUIRE_EQUAL_TENSORS(compiled->bias.detach(), eager->bias.detach());
}
