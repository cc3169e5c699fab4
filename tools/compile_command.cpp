// `crucible compile --model M [--backend B] [--batch N] [--passes P,...]
// [--optimizer ...] --dump-dir D [--no-svg]`: compile a zoo model with the
// builder, as a whole training step and through the AOT path (joint graph,
// forward, backward), and write every stage's graph to D (text, DOT, and SVG
// where Graphviz is installed) and the code the backend generates, so that a
// user can look at what each stage did.
#include "commands.h"
#include "training.h"

#include <crucible/autograd/aot_module.h>
#include <crucible/models/zoo.h>
#include <crucible/partitioner/min_cut_partition.h>
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/instruments.h>
#include <crucible/runtime/backend_registry.h>
#include <crucible/runtime/instruments.h>
#include <crucible/runtime/memory.h>
#include <crucible/runtime/timing.h>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <CLI/CLI.hpp>

#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

namespace crucible::tools {
namespace {

struct CompileCommandOptions : ZooStepFlags {
  std::string dump_dir;
  bool svg = true;
};

// One line: what the backend's plan says a call of the step holds.
std::string describe_plan(const runtime::PlannedMemory& m) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1);
  auto mib = [&os](int64_t bytes) -> std::ostream& { return os << static_cast<double>(bytes) / (1 << 20) << " MiB"; };
  os << "memory plan: peak ";
  mib(m.peak_bytes) << " beyond the inputs (";
  mib(m.input_bytes) << "), during step " << m.peak_step << " of " << m.steps << " (" << m.peak_at << "); outputs ";
  mib(m.output_bytes) << "; " << m.buffers << " buffers, ";
  if (m.in_arena) {
    os << m.in_arena << " of them in " << m.arenas << (m.arenas == 1 ? " arena" : " arenas") << " of ";
    mib(m.arena_bytes) << " (";
  } else {
    os << m.reused << " of them in a dead one's memory (";
  }
  mib(m.allocated_bytes) << " with nothing freed or reused)";
  return os.str();
}

void run_compile_command(const CompileCommandOptions& o) {
  const models::Model model = models::make_model(o.model, o.size);
  model.module->train();
  const data::Batch batch = model.example_batch(o.batch, /*seed=*/0);
  const std::vector<at::Tensor> inputs = {batch.inputs, batch.targets};
  std::unique_ptr<torch::optim::Optimizer> optimizer = o.optimizer.make(model.module->parameters());

  const runtime::BackendRegistry registry = runtime::BackendRegistry::builtin();
  const runtime::BackendInfo& backend = registry.get(o.backend);
  auto dumper = std::make_shared<pipeline::GraphDumper>(
      pipeline::GraphDumpOptions{.dir = o.dump_dir, .svg = o.svg, .code = backend.generated_code});
  pipeline::Builder builder;
  builder.backend(o.backend).instrument(dumper);
  // With min-cut, what each AOT partition saved and recomputed, and why.
  const std::filesystem::path partition_txt = std::filesystem::path(o.dump_dir) / "partition.txt";
  std::filesystem::remove(partition_txt);
  o.compile.apply(builder, [partition_txt](const partitioner::MinCutReport& report) {
    std::filesystem::create_directories(partition_txt.parent_path());
    std::ofstream(partition_txt, std::ios::app) << partitioner::to_text(report);
  });

  // The training step: one graph (forward, backward, optimizer update).
  runtime::PhaseTimer step_timer;
  runtime::Counters counters;
  pipeline::Builder timed = builder;
  timed.instrument(std::make_shared<runtime::CounterRecorder>(counters))
      .instrument(std::make_shared<runtime::StageTimer>(step_timer));
  const pipeline::TrainStep step = timed.compile_train_step(model.module, *optimizer, models::loss_of(model));
  step.compile(inputs);
  std::cout << "training step (" << o.optimizer.kind << ", batch " << o.batch << "), " << step.graph().num_nodes()
            << " nodes: " << describe_stages(step_timer) << "\n";
  if (backend.plan_memory) std::cout << describe_plan(backend.plan_memory(step.graph())) << "\n";
  if (backend.estimated_ms)
    std::cout << "estimated time (roofline): " << backend.estimated_ms(step.graph()) << " ms a step\n";

  // The loss through the AOT path (Builder::compile over the module): the
  // joint graph, its partition into forward and backward, each through the
  // passes and the backend. The backward compiles at the first backward.
  runtime::PhaseTimer aot_timer;
  timed = builder;
  timed.instrument(std::make_shared<runtime::CounterRecorder>(counters))
      .instrument(std::make_shared<runtime::StageTimer>(aot_timer));
  const autograd::AotModule aot = timed.compile(
      model.module, [loss = models::loss_of(model)](torch::nn::Module& m, const std::vector<at::Tensor>& in) {
        return std::vector<at::Tensor>{loss(m, in)};
      });
  aot(inputs).at(0).backward();
  std::cout << "forward and backward (AOT): " << describe_stages(aot_timer) << "\n";
  std::cout << "counters: " << describe_counters(counters) << "\n";

  if (!backend.generated_code)
    std::cout << "backend " << o.backend << " generates no code: it runs the graph of the last stage as it is\n";
  std::cout << "wrote " << dumper->files().size() << " files:\n";
  for (const std::string& f : dumper->files()) std::cout << "  " << f << "\n";
}

}  // namespace

void add_compile_command(CLI::App& app) {
  auto o = std::make_shared<CompileCommandOptions>();
  CLI::App* cmd = app.add_subcommand(
      "compile", "compile a zoo model's training step and write each stage's graph and the generated code");
  o->add_to(*cmd, "batch size of the example inputs");
  cmd->add_option("--dump-dir", o->dump_dir, "directory for the graphs and code (created if missing)")->required();
  cmd->add_flag("!--no-svg", o->svg, "skip the SVG renderings (Graphviz)");
  cmd->callback([o] { run_compile_command(*o); });
}

}  // namespace crucible::tools
