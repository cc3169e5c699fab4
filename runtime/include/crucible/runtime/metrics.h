// Compilation metrics: one record per compiled graph, kept in a bounded
// deque, as torch/_dynamo/utils.py's CompilationMetrics /
// BwdCompilationMetrics and record_compilation_metrics keep them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace crucible::runtime {

/// What one compilation did. Times are wall-clock milliseconds.
struct CompilationMetrics {
  std::string compile_id;                ///< e.g. "0/1": function 0, its second compilation
  std::string kind;                      ///< "forward", "backward", "inference", "export"
  int64_t graph_node_count = 0;          ///< all nodes of the compiled graph
  int64_t graph_op_count = 0;            ///< Call nodes
  int64_t graph_input_count = 0;         ///< placeholders
  double compile_time_ms = 0.0;          ///< the whole compilation (trace, partition, backend)
  double backend_compile_time_ms = 0.0;  ///< the backend call alone
  /// Why the cache missed ("first call", "sizes of input 0 changed"), if it did.
  std::string recompile_reason;
  /// What a cache of compiled graphs did for this graph: "hit" (the backend
  /// was skipped; backend_compile_time_ms is then the lookup's), "miss",
  /// "bypass: <why it could not be cached>"; empty when none was consulted.
  std::string graph_cache;
  /// Set when the compilation failed: the innermost stage that threw
  /// ("fw_compiler", "dce", ...; Note [Compilation stages] in
  /// ir/instrument.h; "compile" when no stage inside it did) and the
  /// exception's message.
  std::optional<std::string> fail_type;
  std::optional<std::string> fail_reason;
};

/// The default capacity, as the seed's DEFAULT_COMPILATION_METRICS_LIMIT.
inline constexpr size_t kDefaultMetricsCapacity = 64;

/// A bounded, thread-safe deque of CompilationMetrics: recording into a full
/// log drops the oldest record.
class MetricsLog {
 public:
  explicit MetricsLog(size_t capacity = kDefaultMetricsCapacity) : capacity_(capacity) {}

  void record(CompilationMetrics metrics);
  /// Changes the capacity; drops the oldest records beyond it
  /// (set_compilation_metrics_limit).
  void set_capacity(size_t capacity);
  size_t capacity() const;
  /// The records, oldest first.
  std::vector<CompilationMetrics> records() const;
  size_t size() const;
  void clear();

 private:
  mutable std::mutex mu_;
  size_t capacity_;
  std::deque<CompilationMetrics> records_;
};

/// The process-wide log the autograd library records into.
MetricsLog& default_metrics_log();

}  // namespace crucible::runtime
