// Private: timing and metrics records of compilations.
#pragma once

#include <crucible/ir/graph.h>

#include <chrono>
#include <optional>
#include <string>

namespace crucible::autograd::detail {

/// Milliseconds since `since`.
double elapsed_ms(std::chrono::steady_clock::time_point since);

/// Records one runtime::CompilationMetrics for `graph` (its node, op and
/// placeholder counts) in runtime::default_metrics_log(). `kind` is
/// "forward", "backward", "inference" or "export".
void record_metrics(const std::string& compile_id, const char* kind, const ir::Graph& graph, double compile_ms,
                    double backend_ms, std::string reason);

/// Records a failed compilation: the exception's type and message.
void record_failure(const std::string& compile_id, const char* kind, std::string reason, const char* fail_type,
                    const std::string& message);

}  // namespace crucible::autograd::detail
