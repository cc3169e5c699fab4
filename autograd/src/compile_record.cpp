#include "compile_record.h"

namespace crucible::autograd::detail {

AotCache::Compiled run_backend(const ir::Instruments& instruments, const char* stage, std::string_view graph_name,
                               const ir::Backend& backend, const std::shared_ptr<AotCache>& cache,
                               const std::string& compiler_key, const char* kind, const ir::Graph& graph,
                               const std::vector<at::Tensor>& example_inputs) {
  ir::StageScope scope(instruments, ir::StageEvent{.stage = stage, .graphs = {{graph_name, &graph}}});
  AotCache::Compiled compiled = cache && !compiler_key.empty()
                                    ? cache->compile(backend, compiler_key, kind, graph, example_inputs)
                                    : AotCache::Compiled{backend(graph, example_inputs), ""};
  ir::StageEvent after{.stage = stage, .graphs = {{graph_name, &graph}}};
  after.changed = false;
  after.cached = compiled.outcome == "hit";
  after.detail = compiled.outcome;
  scope.done(std::move(after));
  return compiled;
}

}  // namespace crucible::autograd::detail
