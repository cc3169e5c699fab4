// Phase timing: how long each compilation phase took, the C++ counterpart of
// torch/_dynamo/utils.py's dynamo_timed and compile_times().
#pragma once

#include <chrono>
#include <cstddef>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace crucible::runtime {

/// Totals of one phase. Times are wall-clock milliseconds.
struct PhaseStats {
  std::string name;
  /// The phase that was open around this one when it was first recorded
  /// ("" at top level): the report nests phases under their parent.
  std::string parent;
  std::vector<double> times_ms;  ///< one entry per completed scope, in order

  size_t calls() const { return times_ms.size(); }
  double total_ms() const;
};

/// Records wall time per phase name. Phases nest: a scope opened while
/// another scope of the same timer is open on the same thread is reported
/// under it, and the outer phase's time includes the inner one's (as nested
/// dynamo_timed calls do). Thread-safe; nesting is tracked per thread and
/// per timer.
class PhaseTimer {
 public:
  /// RAII: times from construction to destruction and records it under the
  /// phase name. Movable, not copyable.
  class Scope {
   public:
    Scope(PhaseTimer& timer, std::string phase);
    ~Scope();
    Scope(Scope&& other) noexcept;
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    Scope& operator=(Scope&&) = delete;

   private:
    PhaseTimer* timer_;
    std::string phase_;
    std::string parent_;
    std::chrono::steady_clock::time_point start_;
  };

  /// Opens a scope: `auto t = timer.time("partition");`.
  [[nodiscard]] Scope time(std::string phase) { return Scope(*this, std::move(phase)); }

  /// Adds one measurement directly (for times measured elsewhere).
  void record(std::string_view phase, double ms, std::string_view parent = {});

  /// Every phase in the order it was first opened (or recorded), so an
  /// outer phase comes before those it holds; one still open the first
  /// time has no times yet.
  std::vector<PhaseStats> phases() const;
  /// Total ms of a phase over all its scopes; 0 if it never ran.
  double total_ms(std::string_view phase) const;

  /// A table, one line per phase, nested phases indented under their parent:
  /// "phase  calls  total ms  mean ms".
  std::string report() const;
  /// CSV with a header line: "phase,parent,calls,total_ms,mean_ms", one row
  /// per phase, times with 6 decimals (as compile_times(repr="csv")).
  std::string csv() const;

  void clear();

 private:
  // The phase's entry, made (under `parent`) if it has none.
  PhaseStats& entry(std::string_view phase, std::string_view parent);
  PhaseStats& entry_locked(std::string_view phase, std::string_view parent);

  mutable std::mutex mu_;
  std::vector<PhaseStats> phases_;
};

/// The process-wide timer the library's own phases record into (the seed's
/// compilation_time_metrics). Pass another PhaseTimer where isolation is needed.
PhaseTimer& default_phase_timer();

}  // namespace crucible::runtime
