// Fake-mode compilation (AotConfig::trace_mode, Builder::trace_options):
// the graphs traced on fake tensors are the graphs traced on real copies,
// and a training step compiled in fake mode trains as eager.
#include <crucible/ir/printer.h>
#include <crucible/models/zoo.h>
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/train_step.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/adam.h>

#include "catch.h"
#include "testing.h"

using namespace crucible::pipeline;
using namespace crucible::models;
using namespace crucible::data;
namespace ir = crucible::ir;

namespace {

// Every graph a builder's stages see, as text, in the order they came.
struct Recorder : ir::Instrument {
  std::vector<std::string> graphs;
  void after_stage(const ir::StageEvent& event) override {
    if (event.failed) return;
    for (const ir::StageGraph& g : event.graphs) graphs.push_back(std::string(g.name) + "\n" + ir::to_text(*g.graph));
  }
};

Builder builder_for(crucible::tracer::TraceMode mode, const std::shared_ptr<Recorder>& recorder) {
  crucible::tracer::TraceOptions options;
  options.mode = mode;
  Builder b = Builder().backend("interpreter");
  // No graph cache: each mode compiles (and reports) every graph itself.
  b.backend("interpreter").trace_options(options).instrument(recorder).compiler_key("");
  return b;
}

}  // namespace

TEST_CASE("fake mode: every zoo model's train-step, forward and backward graphs equal real mode's",
          "[pipeline][fake]") {
  for (const std::string& name : model_names()) {
    INFO(name);
    std::vector<std::vector<std::string>> per_mode;
    for (auto mode : {crucible::tracer::TraceMode::Real, crucible::tracer::TraceMode::Fake}) {
      torch::manual_seed(0);
      Model m = make_model(name);
      m.module->train();
      auto recorder = std::make_shared<Recorder>();
      const Builder b = builder_for(mode, recorder);
      torch::optim::Adam opt(m.module->parameters(), torch::optim::AdamOptions(1e-3));
      const Batch batch = m.example_batch(2, 0);
      b.compile_train_step(m.module, opt, loss_of(m)).compile({batch.inputs, batch.targets});
      // Forward and backward through aot_module (the backward compiles at the first backward).
      auto fwd = b.compile(m.module, [&m](torch::nn::Module&, const std::vector<at::Tensor>& in) {
        return std::vector<at::Tensor>{m.loss(m.forward(in[0]), in[1])};
      });
      fwd({batch.inputs, batch.targets})[0].backward();
      per_mode.push_back(recorder->graphs);
    }
    REQUIRE(per_mode[0].size() == per_mode[1].size());
    for (size_t k = 0; k < per_mode[0].size(); ++k) REQUIRE(per_mode[1][k] == per_mode[0][k]);
  }
}

TEST_CASE("fake mode: a training step compiled on fake tensors trains as eager", "[pipeline][fake]") {
  torch::manual_seed(1);
  Model compiled = make_model("convnet"), eager = make_model("convnet");
  copy_state(*compiled.module, *eager.module);
  torch::optim::Adam c_opt(compiled.module->parameters(), torch::optim::AdamOptions(1e-3));
  torch::optim::Adam e_opt(eager.module->parameters(), torch::optim::AdamOptions(1e-3));
  auto recorder = std::make_shared<Recorder>();
  TrainStep step = builder_for(crucible::tracer::TraceMode::Fake, recorder)
                       .compile_train_step(compiled.module, c_opt, loss_of(compiled));
  for (int64_t i = 0; i < 10; ++i) {
    const Batch b = compiled.example_batch(8, static_cast<uint64_t>(i));
    const at::Tensor c = step({b.inputs, b.targets});
    e_opt.zero_grad();
    const at::Tensor e = eager.loss(eager.forward(b.inputs), b.targets);
    e.backward();
    e_opt.step();
    // The same graph as a real-mode trace, run by the interpreter: bitwise.
    REQUIRE_EQUAL_TENSORS(c, e.detach());
  }
  auto ep = eager.module->named_parameters();
  for (const auto& p : compiled.module->named_parameters())
    REQUIRE_EQUAL_TENSORS(p.value().detach(), ep[p.key()].detach());
}
