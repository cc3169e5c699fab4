// Private: the compiler call of a compilation, with its stage event.
#pragma once

#include <crucible/autograd/aot_cache.h>
#include <crucible/ir/graph.h>
#include <crucible/ir/instrument.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace crucible::autograd::detail {

/// backend(graph, example_inputs) as the compiler stage `stage`
/// ("fw_compiler", "bw_compiler", "inference_compiler"; Note [Compilation
/// stages]) of `instruments`, the graph reported under `graph_name`; through
/// `cache` when it is set and `compiler_key` is not empty (Note [AOT graph
/// cache]), the outcome then the cache's, else "". `kind` is "forward",
/// "backward" or "inference".
AotCache::Compiled run_backend(const ir::Instruments& instruments, const char* stage, std::string_view graph_name,
                               const ir::Backend& backend, const std::shared_ptr<AotCache>& cache,
                               const std::string& compiler_key, const char* kind, const ir::Graph& graph,
                               const std::vector<at::Tensor>& example_inputs);

}  // namespace crucible::autograd::detail
