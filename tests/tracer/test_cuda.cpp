// The tracer on CUDA tensors: the same captures as on the CPU, replayed by
// the interpreter on the GPU and compared with eager on the GPU. Skipped
// where no CUDA device is usable.
#include "catch.h"
#include "module_testing.h"
#include "testing.h"
#include "tracer_testing.h"

#include <crucible/models/zoo.h>
#include <crucible/tracer/functional_call.h>
#include <crucible/tracer/make_fx.h>

#include <torch/nn/module.h>
#include <torch/utils.h>

using crucible::testing::module_graph_inputs;
using crucible::testing::run_traced;
using Tensors = std::vector<at::Tensor>;
namespace ir = crucible::ir;

TEST_CASE("CUDA: a joint trace of the ConvNet's loss.backward() replays eager's loss and gradients", "[tracer][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  torch::manual_seed(0);
  auto model = crucible::models::make_model("convnet");
  model.module->to(torch::kCUDA);
  auto batch = model.example_batch(8, 1);
  const at::Tensor x = batch.inputs.cuda(), y = batch.targets.cuda();
  auto step = [&](torch::nn::Module&, const Tensors& in) {
    auto loss = model.loss(model.forward(in[0]), in[1]);
    loss.backward();
    return Tensors{loss.detach()};
  };
  crucible::tracer::ModuleTraceOptions options;
  options.gradients_as_outputs = true;
  auto r = crucible::tracer::functional_call(*model.module, step, {x, y}, options);
  for (const ir::Value* p : r.graph.placeholders()) REQUIRE(p->meta().device.is_cuda());

  auto actual = run_traced(r, module_graph_inputs(*model.module, {x, y}));
  auto loss = model.loss(model.forward(x), y);
  loss.backward();
  // cuDNN may pick a different (equally valid) convolution algorithm per call,
  // and its weight-gradient algorithms accumulate with atomics in any order:
  // results agree to float32 rounding over the reductions, not bitwise.
  REQUIRE_CLOSE(actual[0], loss.detach(), 1e-5, 1e-6);
  const auto params = model.module->parameters();
  for (size_t g : r.graph.signature().outputs_of(ir::OutputKind::Gradient)) {
    const size_t input = *r.graph.signature().outputs[g].input_index;
    REQUIRE_CLOSE(actual[g], params[input].grad(), 1e-4, 1e-6);
  }
}

TEST_CASE("CUDA: dropout replays eager's mask when the CUDA generator is re-seeded", "[tracer][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  // As on the CPU (see the make_fx dropout test), the graph holds the RNG op,
  // which draws from the default CUDA generator (Philox) when it runs.
  auto fn = [](const Tensors& in) { return Tensors{at::dropout(in[0] * 3.0, 0.5, /*train=*/true)}; };
  const Tensors inputs = {at::randn({64, 64}, at::kCUDA)};
  auto r = crucible::tracer::make_fx(fn, inputs);
  at::manual_seed(7);
  auto expected = fn(inputs);
  at::manual_seed(7);
  auto actual = run_traced(r, inputs);
  REQUIRE_EQUAL_TENSORS(actual[0], expected[0]);
}

TEST_CASE("CUDA: a fake-mode trace of dropout warns that its draws are not eager's; a real-mode trace does not",
          "[tracer][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  // Note [Devices in fake mode]: on meta tensors at::dropout takes its
  // generic path (bernoulli_), not the fused CUDA kernel eager runs.
  auto fn = [](const Tensors& in) { return Tensors{at::dropout(in[0] * 3.0, 0.5, /*train=*/true)}; };
  const Tensors inputs = {at::randn({64, 64}, at::kCUDA)};
  auto warned = [&](crucible::tracer::TraceMode mode) {
    crucible::testing::CollectWarnings warnings;
    crucible::tracer::TraceOptions options;
    options.mode = mode;
    crucible::tracer::make_fx(fn, inputs, options);
    return std::any_of(warnings.messages.begin(), warnings.messages.end(),
                       [](const std::string& w) { return w.find("not the numbers eager draws") != std::string::npos; });
  };
  CHECK(warned(crucible::tracer::TraceMode::Fake));
  CHECK_FALSE(warned(crucible::tracer::TraceMode::Real));
}

TEST_CASE("CUDA: by default (TraceMode::Auto) dropout on a GPU is traced in real mode, with eager's draws",
          "[tracer][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  auto fn = [](const Tensors& in) { return Tensors{at::dropout(in[0] * 3.0, 0.5, /*train=*/true)}; };
  const Tensors inputs = {at::randn({64, 64}, at::kCUDA)};
  crucible::testing::CollectWarnings warnings;
  at::manual_seed(7);
  const auto r = crucible::tracer::make_fx(fn, inputs);
  CHECK(r.mode == crucible::tracer::TraceMode::Real);
  CHECK_THAT(r.fake_mode_abandoned, CRUCIBLE_HAS_SUBSTR("random numbers on a GPU"));
  CHECK(warnings.messages.empty());  // the fake attempt's warning went with it
  at::manual_seed(7);
  const auto expected = fn(inputs);
  at::manual_seed(7);
  REQUIRE_EQUAL_TENSORS(run_traced(r, inputs)[0], expected[0]);
}

TEST_CASE("CUDA: functionalized in-place updates of a GPU input come back as a mutated-input output",
          "[tracer][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  auto fn = [](const Tensors& in) {
    in[0].mul_(2.0).add_(in[1]);
    return Tensors{in[0].sum()};
  };
  const Tensors inputs = {at::randn({32}, at::kCUDA), at::randn({32}, at::kCUDA)};
  crucible::tracer::TraceOptions options;
  options.functionalize = true;
  auto r = crucible::tracer::make_fx(fn, inputs, options);
  REQUIRE(r.input_mutations[0].data);
  REQUIRE_FALSE(r.input_mutations[1].data);
  for (const ir::Node* n : r.graph.nodes()) REQUIRE_FALSE((n->is_call() && n->is_mutating()));
  Tensors eager = crucible::testing::clones(inputs);
  const at::Tensor sum = fn(eager)[0];
  auto actual = run_traced(r, crucible::testing::clones(inputs));
  REQUIRE_EQUAL_TENSORS(actual[0], sum);
  const auto mutated = r.graph.signature().outputs_of(ir::OutputKind::MutatedInput);
  REQUIRE(mutated.size() == 1);
  REQUIRE_EQUAL_TENSORS(actual[mutated[0]], eager[0]);
}
