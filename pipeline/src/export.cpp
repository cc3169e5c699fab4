// See crucible/pipeline/export.h and Note [Exported training step].
#include <crucible/pipeline/error.h>
#include <crucible/pipeline/export.h>

#include <crucible/ir/printer.h>
#include <crucible/runtime/backend_registry.h>
#include <crucible/runtime/disk_cache.h>
#include <crucible/runtime/package.h>

#include <torch/serialize.h>
#include <torch/version.h>

#include <filesystem>
#include <sstream>
#include <system_error>

namespace crucible::pipeline {

namespace {

// Writes `bytes` as `dir`/`name` and lists its checksum in `m`.
void add_file(runtime::PackageManifest& m, const std::string& dir, const std::string& name, const std::string& bytes) {
  try {
    runtime::write_atomically(dir + "/" + name, bytes);
  } catch (const runtime::CacheError& e) {
    throw runtime::PackageError(std::string("export_train_step: ") + e.what());
  }
  m.files[name] = runtime::checksum(bytes);
}

std::string saved(const std::vector<at::Tensor>& tensors) {
  std::ostringstream out;
  torch::save(tensors, out);
  return out.str();
}

}  // namespace

void export_train_step(const TrainStep& step, const std::vector<at::Tensor>& example_batch, const std::string& dir,
                       const ExportOptions& options) {
  const runtime::BackendRegistry registry = runtime::BackendRegistry::builtin();
  const std::string& backend = step.backend_name();
  if (backend != "interpreter" && (!registry.contains(backend) || !registry.get(backend).write_compiled))
    throw PipelineError("export_train_step: backend " + backend +
                        " writes no package; compile the step with an inductor backend or the interpreter");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw PipelineError("export_train_step: cannot make " + dir + ": " + ec.message());

  step.compile(example_batch);
  const ir::Graph& graph = step.graph();
  const std::vector<at::Tensor> inputs = step.graph_inputs(example_batch);
  const auto& specs = graph.signature().inputs;
  runtime::PackageManifest m;
  m.backend = backend;
  m.torch_version = TORCH_VERSION;
  std::vector<at::Tensor> module_state, state;
  for (size_t i = 0; i < specs.size(); ++i) {
    const ir::InputSpec& spec = specs[i];
    if (spec.kind == ir::InputKind::Lifted)
      throw PipelineError("export_train_step: the step reads " + (spec.target.empty() ? "a tensor" : spec.target) +
                          " from outside the module (a lifted input), which a package cannot hold; pass it in the "
                          "batch or register it on the module");
    const at::Tensor& t = inputs.at(i);
    m.inputs.push_back(
        {spec.target, spec.kind, spec.duplicate_of, t.scalar_type(), t.sizes().vec(), t.device(), std::nullopt});
    if (spec.kind == ir::InputKind::State && t.numel() == 1) m.inputs.back().value = t.item<double>();
    if (spec.duplicate_of || !options.state) continue;
    if (spec.kind == ir::InputKind::Parameter || spec.kind == ir::InputKind::Buffer)
      module_state.push_back(t.detach().clone());
    if (spec.kind == ir::InputKind::State) state.push_back(t.detach().clone());
  }
  add_file(m, dir, "graph.txt", ir::to_text(graph));
  if (backend != "interpreter")
    for (const std::string& name : registry.get(backend).write_compiled(graph, dir))
      m.files[name] = runtime::checksum(runtime::read_file(dir + "/" + name));
  for (const char* name : {"module.pt", "state.pt"}) std::filesystem::remove(dir + "/" + name, ec);
  if (options.state) {
    add_file(m, dir, "module.pt", saved(module_state));
    add_file(m, dir, "state.pt", saved(state));
  }
  std::vector<at::Tensor> batch;
  for (const at::Tensor& t : example_batch) batch.push_back(t.detach());
  add_file(m, dir, "example_batch.pt", saved(batch));
  runtime::write_manifest(dir, m);  // last: a package without one is no package
}

}  // namespace crucible::pipeline
