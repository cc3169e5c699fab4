// The standard instruments of compilations (ir/instrument.h): stage timing
// into a PhaseTimer, compilation metrics into a MetricsLog, and counters, the
// C++ counterparts of torch/_dynamo/utils.py's compile_times,
// record_compilation_metrics and counters. default_instruments() holds the
// process-wide ones; a caller that passes its own list (AotConfig::
// instruments, the builder) touches no global.
#pragma once

#include <crucible/ir/instrument.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace crucible::runtime {

class MetricsLog;
class PhaseTimer;

/// Times every stage into a PhaseTimer, one phase per stage name ("compile",
/// "trace_joint", "partition", "dce", "backend", ...): a stage run several
/// times (each pass runs once per graph) adds one measurement each time, so
/// timer.total_ms(stage) is the stage's compile time; stages nest as they
/// ran. The timer must outlive the instrument.
class StageTimer : public ir::Instrument {
 public:
  explicit StageTimer(PhaseTimer& timer);
  ~StageTimer() override;
  void before_stage(const ir::StageEvent& event) override;
  void after_stage(const ir::StageEvent& event) override;

 private:
  PhaseTimer& timer_;
  struct Open;
  std::mutex mu_;
  std::vector<std::unique_ptr<Open>> open_;  // innermost last, of every thread (Open holds the thread id)
};

/// Records one CompilationMetrics per compiled graph (each compiler stage of
/// a "compile": its graph's node, op and placeholder counts, the time since
/// the compilation began, the compiler's time, why it compiled, the graph
/// cache's outcome) and one per failed compilation, into a MetricsLog (the
/// seed's record_compilation_metrics). The log must outlive the instrument.
class MetricsRecorder : public ir::Instrument {
 public:
  explicit MetricsRecorder(MetricsLog& log);
  void before_stage(const ir::StageEvent& event) override;
  void after_stage(const ir::StageEvent& event) override;

 private:
  MetricsLog& log_;
  struct Compilation {
    std::string id, reason;
    std::string failed_stage;  // the innermost stage that threw
    std::chrono::steady_clock::time_point start;
    std::chrono::steady_clock::time_point compiler_start;
  };
  std::mutex mu_;
  std::vector<Compilation> open_;
};

/// Named counts in groups, as torch/_dynamo/utils.py's `counters`
/// (a defaultdict of Counters). Thread-safe.
class Counters {
 public:
  /// Adds `by` to counter `key` of `group`.
  void add(std::string_view group, std::string_view key, int64_t by = 1);
  /// The count (0 if never added).
  int64_t get(std::string_view group, std::string_view key) const;
  /// Every group's counters, sorted by group, then key.
  std::map<std::string, std::map<std::string, int64_t>> snapshot() const;
  /// "group.key: count" per line, sorted; "" when empty.
  std::string report() const;
  void clear();

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::map<std::string, int64_t, std::less<>>, std::less<>> counts_;
};

/// Counts compilation events into Counters:
///   stats.compilations        each "compile"
///   recompiles.<reason>       each "compile" whose reason is not a first one
///                             ("first call", "first backward")
///   graphs.<kind>             each compiled graph: forward, backward, inference
///   graph_cache.<outcome>     each compiler stage's cache outcome: hit, miss, bypass
///   failures.<stage>          each failed stage
///   passes.<name>             each run of a pass that changed its graph
/// The counters must outlive the instrument.
class CounterRecorder : public ir::Instrument {
 public:
  explicit CounterRecorder(Counters& counters);
  void before_stage(const ir::StageEvent& event) override;
  void after_stage(const ir::StageEvent& event) override;

 private:
  Counters& counters_;
};

/// The process-wide counters the default instruments count into.
Counters& default_counters();

/// The process-wide instruments: a StageTimer on default_phase_timer(), a
/// MetricsRecorder on default_metrics_log(), a CounterRecorder on
/// default_counters(). What AotConfig and the builder start with.
const ir::Instruments& default_instruments();

}  // namespace crucible::runtime
