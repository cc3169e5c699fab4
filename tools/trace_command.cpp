// `crucible trace --model {mlp,convnet,gpt,resnet18} [--joint] [--functionalize] [--mode real|fake]
// [--format text|dot|json]`: trace a zoo model with the tracer and print its graph.
// add_trace_command is declared in commands.h with the other subcommands.
#include "commands.h"
#include "training.h"

#include <crucible/ir/dot.h>
#include <crucible/ir/json.h>
#include <crucible/ir/printer.h>
#include <crucible/models/zoo.h>
#include <crucible/tracer/functional_call.h>

#include <torch/nn/module.h>
#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>

namespace crucible::tools {
namespace {

struct TraceCommandOptions {
  std::string model = "mlp";
  std::string size = "small";
  bool joint = false;
  bool functionalize = false;
  std::string mode = "real";
  std::string format = "text";
  int64_t batch = 4;
};

void run_trace_command(const TraceCommandOptions& o) {
  models::Model model = models::make_model(o.model, o.size);
  const data::Batch batch = model.example_batch(o.batch, /*seed=*/0);
  tracer::ModuleTraceOptions options;
  options.trace.functionalize = o.functionalize;
  options.trace.mode = o.mode == "fake" ? tracer::TraceMode::Fake : tracer::TraceMode::Real;
  options.gradients_as_outputs = o.joint;
  tracer::ModuleFn fn;
  std::vector<at::Tensor> inputs = {batch.inputs};
  if (o.joint) {
    // One training step's forward and backward: the loss, then every parameter's gradient.
    inputs.push_back(batch.targets);
    fn = [&model](torch::nn::Module&, const std::vector<at::Tensor>& in) {
      at::Tensor loss = model.loss(model.forward(in[0]), in[1]);
      loss.backward();
      return std::vector<at::Tensor>{loss.detach()};
    };
  } else {
    fn = [&model](torch::nn::Module&, const std::vector<at::Tensor>& in) {
      return std::vector<at::Tensor>{model.forward(in[0])};
    };
  }
  const tracer::TraceResult r = tracer::functional_call(*model.module, fn, inputs, options);
  if (o.format == "text") {
    ir::print(r.graph, std::cout);
  } else if (o.format == "dot") {
    std::cout << ir::to_dot(r.graph);
  } else {
    std::cout << ir::to_json(r.graph) << "\n";
  }
}

}  // namespace

void add_trace_command(CLI::App& app) {
  auto opts = std::make_shared<TraceCommandOptions>();
  CLI::App* cmd = app.add_subcommand("trace", "trace a model of the zoo into a graph (make_fx) and print it");
  cmd->add_option("--model", opts->model, "model of the zoo to trace")->check(CLI::IsMember(models::model_names()));
  add_size_option(*cmd, opts->size);
  cmd->add_flag("--joint", opts->joint, "trace one training step: forward, loss.backward(), gradients as outputs");
  cmd->add_flag("--functionalize", opts->functionalize, "remove in-place ops and view mutation");
  cmd->add_option("--mode", opts->mode, "real: run on example data; fake: fake tensors (metadata, no data)")
      ->check(CLI::IsMember({"real", "fake"}));
  cmd->add_option("--format", opts->format, "output format")->check(CLI::IsMember({"text", "dot", "json"}));
  cmd->add_option("--batch", opts->batch, "batch size of the example inputs")->check(at_least_one());
  cmd->callback([opts] { run_trace_command(*opts); });
}

}  // namespace crucible::tools
