// Private: how many threads a compiled graph's calls run with on the CPU
// (Note [Threads on a shared machine] in runtime/threads.cpp).
#pragma once

#include <crucible/inductor/options.h>

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace crucible::inductor::detail {

/// Chooses the OpenMP thread count of one compiled CPU graph's calls from
/// their wall times: the caller's maximum, or a halving of it down to 1
/// where fewer threads ran faster (other processes keep the cores busy, or
/// the graph is too small for its threads). Holds no clock: calls report
/// their times, so the policy is tested on made-up times. Thread-safe.
class ThreadTuner {
 public:
  /// The thread count the next call runs with, given `available`, the
  /// calling thread's OpenMP maximum (>= 1; a new value starts over).
  int choose(int available);
  /// Whether the next call should measure how long its thread waited for a
  /// core: the first call, and those before a probe of more threads (Note
  /// [Threads on a shared machine]).
  bool wants_wait() const;
  /// Reports a call that ran with `threads` (what choose() returned):
  /// `seconds` of wall time, of which the share `waited` (0 to 1) the
  /// calling thread was runnable but not running; negative: not measured.
  /// A report for another count than the tuner expects (a concurrent call)
  /// is ignored. Returns whether the chosen count changed.
  bool record(int threads, double seconds, double waited = -1);

 private:
  enum class Phase { warm_up, measure, hold, probe };
  int threads_of(size_t arm) const { return arms_.at(arm); }
  void start_probe(size_t arm);
  void hold();
  // The current count measured at `reference` seconds: hold it, and probe
  // fewer threads first.
  void measured(double reference);
  // A probe lost (or was skipped): hold the current count, whose time is
  // now `reference`, and wait twice as long for the next.
  void stay(double reference);

  mutable std::mutex mutex_;
  std::vector<int> arms_;                          // thread counts: available, halved, ..., 1
  size_t current_ = 0;                             // the arm calls run with
  size_t probed_ = 0;                              // the arm a probe runs with
  Phase phase_ = Phase::warm_up;                   // of current_ (warm_up, measure, hold) or probed_ (probe)
  std::vector<double> samples_;                    // of the phase's arm: measure and probe
  std::vector<double> recent_;                     // the current arm's last calls while holding
  double reference_ = 0;                           // the current arm's mean time a call (seconds)
  int64_t period_ = 0;                             // calls between probes
  int64_t since_ = 0;                              // calls held since the last probe
  bool fewer_next_ = true;                         // the direction of the next probe
  int gate_ = 0;                                   // calls left that measure their wait before a probe of more threads
  double waited_seconds_ = 0, gated_seconds_ = 0;  // their time waiting for a core, and in all
};

/// For its lifetime, the calling thread's OpenMP regions (generated
/// kernels' and ATen's) run with the count `tuner` chooses; the caller's
/// own count is restored after, exception or not. done() reports the
/// call's time to the tuner (a call that threw reports nothing) and counts
/// a change of count as the inductor's thread_count_changes.
class TunedThreads {
 public:
  explicit TunedThreads(ThreadTuner& tuner);
  ~TunedThreads();
  TunedThreads(const TunedThreads&) = delete;
  TunedThreads& operator=(const TunedThreads&) = delete;
  void done();

 private:
  ThreadTuner& tuner_;
  int available_ = 0, threads_ = 0;
  int64_t start_ns_ = 0, waited_ns_ = -1;
};

/// Whether this process has an OpenMP runtime whose per-thread count can be
/// set (LibTorch's, when it was built with OpenMP): without one there is
/// nothing to tune.
bool openmp_threads_settable();

/// The tuner of a plan whose kernels run on `device`: one on the CPU where
/// `options` let the count adapt (adapt_threads, threads 0) and OpenMP
/// lets it be set; null elsewhere.
std::unique_ptr<ThreadTuner> thread_tuner(c10::Device device, const InductorOptions& options);

}  // namespace crucible::inductor::detail
