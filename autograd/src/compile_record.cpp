#include "compile_record.h"

#include <crucible/runtime/metrics.h>

namespace crucible::autograd::detail {

double elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}

void record_metrics(const std::string& compile_id, const char* kind, const ir::Graph& graph, double compile_ms,
                    double backend_ms, std::string reason) {
  runtime::CompilationMetrics m;
  m.compile_id = compile_id;
  m.kind = kind;
  for (const ir::Node* n : graph.nodes()) {
    ++m.graph_node_count;
    m.graph_op_count += n->is_call();
    m.graph_input_count += n->is_placeholder();
  }
  m.compile_time_ms = compile_ms;
  m.backend_compile_time_ms = backend_ms;
  m.recompile_reason = std::move(reason);
  runtime::default_metrics_log().record(std::move(m));
}

void record_failure(const std::string& compile_id, const char* kind, std::string reason, const char* fail_type,
                    const std::string& message) {
  runtime::CompilationMetrics m;
  m.compile_id = compile_id;
  m.kind = kind;
  m.recompile_reason = std::move(reason);
  m.fail_type = fail_type;
  m.fail_reason = message;
  runtime::default_metrics_log().record(std::move(m));
}

}  // namespace crucible::autograd::detail
