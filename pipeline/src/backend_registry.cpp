#include <crucible/pipeline/backend_registry.h>
#include <crucible/pipeline/error.h>

#include <crucible/inductor/compile_fx.h>
#include <crucible/ir/interpreter.h>

namespace crucible::pipeline {

BackendRegistry BackendRegistry::builtin() {
  BackendRegistry r;
  r.add({"interpreter",
         "runs the graph node by node through the dispatcher (the reference backend)",
         ir::interpret,
         {},
         0});
  // The inductor backends rank below the interpreter, so that a Builder's
  // default is the reference backend, bitwise with eager; `crucible train`
  // defaults to inductor itself (its --check-eager compares fused results
  // as Note [Agreement with eager for a fused backend] says).
  const CodeGenerator inductor_code = [](const ir::Graph& g) {
    std::vector<GeneratedFile> files{{"loops.txt", inductor::loop_ir(g)}};
    inductor::GeneratedCode code = inductor::generate_code(g);
    if (!code.source.empty()) files.push_back({code.cuda ? "kernels.cu" : "kernels.cpp", code.source});
    return files;
  };
  const std::string inductor_cache = inductor::InductorOptions::from_environment().cache_dir;
  r.add({"inductor",
         "lowers to a loop-level IR and fuses pointwise ops and reductions into generated kernels (C++/OpenMP on "
         "the CPU, CUDA through NVRTC on a GPU); other ops run as ATen extern kernels",
         [](const ir::Graph& g, const std::vector<at::Tensor>& example_inputs) {
           return inductor::compile_fx_inner(g, example_inputs, inductor::InductorOptions::from_environment());
         },
         inductor_code, -1, /*cuda_graphs=*/false, inductor_cache});
  r.add({"inductor-cudagraphs",
         "inductor, with each compiled graph captured as a CUDA graph and replayed (torch.compile's "
         "mode=\"reduce-overhead\"); graphs on the CPU run as with inductor",
         [](const ir::Graph& g, const std::vector<at::Tensor>& example_inputs) {
           inductor::InductorOptions options = inductor::InductorOptions::from_environment();
           options.cuda_graphs = true;
           return inductor::compile_fx_inner(g, example_inputs, options);
         },
         inductor_code, -1, /*cuda_graphs=*/true, inductor_cache});
  return r;
}

void BackendRegistry::add(BackendInfo backend) {
  if (!backend.compile)
    throw PipelineError("BackendRegistry::add: backend '" + backend.name + "' has no compile function");
  if (backends_.contains(backend.name))
    throw PipelineError("BackendRegistry::add: a backend named '" + backend.name +
                        "' is registered already; pick another name");
  std::string name = backend.name;
  backends_.emplace(std::move(name), std::move(backend));
}

const BackendInfo& BackendRegistry::get(std::string_view name) const {
  if (auto it = backends_.find(name); it != backends_.end()) return it->second;
  std::string known;
  for (const auto& [n, b] : backends_) known += (known.empty() ? "" : ", ") + n;
  throw PipelineError("unknown backend '" + std::string(name) + "'; the registered backends are " +
                      (known.empty() ? std::string("none") : known));
}

bool BackendRegistry::contains(std::string_view name) const { return backends_.find(name) != backends_.end(); }

std::vector<std::string> BackendRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [n, b] : backends_) out.push_back(n);
  return out;
}

const BackendInfo& BackendRegistry::best() const {
  const BackendInfo* best = nullptr;
  for (const auto& [n, b] : backends_)
    if (!best || b.rank > best->rank) best = &b;
  if (!best) throw PipelineError("BackendRegistry::best: no backend is registered");
  return *best;
}

}  // namespace crucible::pipeline
