#include <crucible/runtime/compiler_wrapper.h>
#include <crucible/runtime/error.h>

namespace crucible::runtime {

ir::Backend wrap_backend(WrapperList<GraphRequest> wrappers, ir::Backend backend) {
  if (!backend) throw WrapperError("wrap_backend: the backend is empty; pass a compiler such as ir::interpret");
  return [wrappers = std::move(wrappers), backend = std::move(backend)](const ir::Graph& graph,
                                                                        const std::vector<at::Tensor>& example_inputs) {
    GraphRequest request{graph.clone(), example_inputs};
    return compile_with_wrappers<GraphRequest>(
        wrappers, std::move(request), [&backend](GraphRequest& r) { return backend(r.graph, r.example_inputs); });
  };
}

}  // namespace crucible::runtime
