// Private: the backend call of a compilation, and the timing and metrics
// records of compilations.
#pragma once

#include <crucible/autograd/aot_cache.h>
#include <crucible/ir/graph.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace crucible::autograd::detail {

/// Milliseconds since `since`.
double elapsed_ms(std::chrono::steady_clock::time_point since);

/// backend(graph, example_inputs), through `cache` when it is set and
/// `compiler_key` is not empty (Note [AOT graph cache]); the outcome is then
/// the cache's, else "". `kind` is "forward", "backward" or "inference".
AotCache::Compiled run_backend(const ir::Backend& backend, const std::shared_ptr<AotCache>& cache,
                               const std::string& compiler_key, const char* kind, const ir::Graph& graph,
                               const std::vector<at::Tensor>& example_inputs);

/// Records one runtime::CompilationMetrics for `graph` (its node, op and
/// placeholder counts) in runtime::default_metrics_log(). `kind` is
/// "forward", "backward", "inference" or "export"; `graph_cache` is
/// run_backend's outcome.
void record_metrics(const std::string& compile_id, const char* kind, const ir::Graph& graph, double compile_ms,
                    double backend_ms, std::string reason, std::string graph_cache = {});

/// Records a failed compilation: the exception's type and message.
void record_failure(const std::string& compile_id, const char* kind, std::string reason, const char* fail_type,
                    const std::string& message);

}  // namespace crucible::autograd::detail
