// `crucible export --model M [--backend B] [--size S] [--batch N]
// [--device cpu|cuda] [--cuda-arch sm_XY ...] [--optimizer ...] [the pass,
// trace and decomposition flags] --out DIR`: compile a zoo model's training
// step and write it as a package that crucible::load_train_step runs
// without the compiler (Note [Exported training step] in
// pipeline/export.h), with the example batch it was compiled for.
#include "commands.h"
#include "training.h"

#include <crucible/models/zoo.h>
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/export.h>

#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace crucible::tools {
namespace {

struct ExportCommandOptions : ZooStepFlags {
  std::string out, device = "cpu";
  std::vector<std::string> cuda_archs;
  bool state = true;
};

void run_export_command(const ExportCommandOptions& o) {
  const at::Device device(o.device);
  require_usable(device, "export");
  const models::Model model = models::make_model(o.model, o.size);
  model.module->to(device);
  model.module->train();
  const data::Batch example = model.example_batch(o.batch, /*seed=*/0);
  const data::Batch batch{example.inputs.to(device), example.targets.to(device)};
  std::unique_ptr<torch::optim::Optimizer> optimizer = o.optimizer.make(model.module->parameters());
  pipeline::Builder builder;
  builder.backend(o.backend);
  o.compile.apply(builder);
  const pipeline::TrainStep step = builder.compile_train_step(model.module, *optimizer, models::loss_of(model));
  pipeline::export_train_step(step, {batch.inputs, batch.targets}, o.out,
                              {.state = o.state, .cuda_archs = o.cuda_archs});
  std::cout << "exported the " << o.model << " training step (" << o.backend << ", " << o.optimizer.kind << ", batch "
            << o.batch << ", " << step.graph().num_nodes() << " nodes) to " << o.out << "\n";
}

}  // namespace

void add_export_command(CLI::App& app) {
  auto o = std::make_shared<ExportCommandOptions>();
  CLI::App* cmd = app.add_subcommand(
      "export", "compile a zoo model's training step into a package that trains without the compiler");
  o->add_to(*cmd, "batch size of the example batch (the package's, fixed)");
  cmd->add_option("--out", o->out, "the package's directory (created if missing)")->required();
  add_device_option(*cmd, o->device, "where the step trains (the package's device)");
  cmd->add_option("--cuda-arch", o->cuda_archs,
                  "a GPU architecture to build the kernels for (sm_80, sm_90, ...; repeat for several): the "
                  "package loads on GPUs of these; compute_90 and the like add PTX, for that architecture and "
                  "newer ones; default: the exporting GPU's");
  cmd->add_flag("!--no-state", o->state,
                "write the layout of the weights and optimizer state, not their values (a loader then binds a "
                "module of its own)");
  cmd->callback([o] { run_export_command(*o); });
}

}  // namespace crucible::tools
