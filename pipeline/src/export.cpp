// See crucible/pipeline/export.h and Note [Exported training step].
#include <crucible/pipeline/error.h>
#include <crucible/pipeline/export.h>

#include <crucible/ir/printer.h>
#include <crucible/runtime/backend_registry.h>
#include <crucible/runtime/disk_cache.h>
#include <crucible/runtime/package.h>
#include <crucible/runtime/rng_state_guard.h>

#include <c10/core/GradMode.h>

#include <torch/serialize.h>
#include <torch/version.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <system_error>
#include <unordered_map>

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

// Note [Tuned before export]
// A GPU step's kernels choose among configurations at their first run
// (Note [Autotuning] in inductor/src/runtime/autotune.cpp), and a package
// carries the choices its exporting process stored. So that a package
// exported before any step ran carries them too, the step's graph runs
// once here through the backend, on copies of its inputs: the module, the
// optimizer state and the RNG streams stay as they were. A loaded step on a
// GPU like this one then launches what the process's step launches, from
// its first step on, which times nothing. The copies cost the step's
// inputs' memory again (GPT-2 small's weights and Adam state: 1.5 GB) for
// as long as the run.
void tune_on_copies(const runtime::BackendInfo& backend, const ir::Graph& graph,
                    const std::vector<at::Tensor>& inputs) {
  const runtime::RngStateGuard rng;
  std::vector<at::Tensor> copies;
  std::unordered_map<const c10::TensorImpl*, at::Tensor> copy_of;  // a duplicated input stays one tensor
  for (const at::Tensor& t : inputs) {
    auto [it, fresh] = copy_of.try_emplace(t.unsafeGetTensorImpl());
    if (fresh) it->second = t.detach().clone();
    copies.push_back(it->second);
  }
  const c10::AutoGradMode no_grad(false);
  backend.compile(graph, copies)(copies);
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
  std::vector<at::Tensor> module_state, state, lifted;
  size_t lifted_count = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const ir::InputSpec& spec = specs[i];
    const at::Tensor& t = inputs.at(i);
    // A lifted tensor nobody named is named by its position among them.
    const std::string name = spec.kind == ir::InputKind::Lifted && spec.target.empty()
                                 ? "lifted tensor " + std::to_string(lifted_count)
                                 : spec.target;
    if (spec.kind == ir::InputKind::Lifted) ++lifted_count;
    m.inputs.push_back(
        {name, spec.kind, spec.duplicate_of, t.scalar_type(), t.sizes().vec(), t.device(), std::nullopt});
    if (spec.kind == ir::InputKind::State && t.numel() == 1) m.inputs.back().value = t.item<double>();
    if (spec.duplicate_of || !options.state) continue;
    if (spec.kind == ir::InputKind::Parameter || spec.kind == ir::InputKind::Buffer)
      module_state.push_back(t.detach().clone());
    if (spec.kind == ir::InputKind::State) state.push_back(t.detach().clone());
    if (spec.kind == ir::InputKind::Lifted) lifted.push_back(t.detach().clone());
  }
  add_file(m, dir, "graph.txt", ir::to_text(graph));
  if (backend != "interpreter" &&
      std::any_of(inputs.begin(), inputs.end(), [](const at::Tensor& t) { return t.is_cuda(); }))
    tune_on_copies(registry.get(backend), graph, inputs);
  if (backend != "interpreter")
    for (const std::string& name : registry.get(backend).write_compiled(graph, dir, options.cuda_archs))
      m.files[name] = runtime::checksum(runtime::read_file(dir + "/" + name));
  for (const char* name : {"module.pt", "state.pt", "lifted.pt"}) std::filesystem::remove(dir + "/" + name, ec);
  if (options.state) {
    add_file(m, dir, "module.pt", saved(module_state));
    add_file(m, dir, "state.pt", saved(state));
    if (!lifted.empty()) add_file(m, dir, "lifted.pt", saved(lifted));
  }
  std::vector<at::Tensor> batch;
  for (const at::Tensor& t : example_batch) batch.push_back(t.detach());
  add_file(m, dir, "example_batch.pt", saved(batch));
  runtime::write_manifest(dir, m);  // last: a package without one is no package
}

}  // namespace crucible::pipeline
