// How many threads a compiled graph's calls run with on the CPU: see
// runtime/threads.h.
#include "runtime/threads.h"

#include <crucible/runtime/instruments.h>

#include <ATen/Parallel.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>

namespace crucible::inductor::detail {

// Note [Threads on a shared machine]
// A parallel region waits at its end for its slowest thread, and OpenMP's
// waiting threads spin (libgomp's default). Where other processes keep
// the cores busy, a preempted thread holds every region up for a time
// slice: on a 2-core machine running two busy loops, the ConvNet's step
// took 237 ms with 2 threads and 1.5 ms with 1 (eager LibTorch, whose
// at::parallel_for is the same OpenMP, 290 ms). A library can neither set
// the wait policy (read once, when the runtime starts) nor trust the
// machine's load (the load average lags by a minute; a container sees its
// host's), so each compiled CPU graph times its own calls and picks its
// thread count, as an autotuner picks a kernel's configuration: the
// calling thread's OpenMP maximum (OMP_NUM_THREADS, at::set_num_threads),
// or a halving of it down to 1.
// - After a warm-up call it measures the current count over 4 calls and
//   keeps their mean, then probes fewer threads at once. Means, not
//   medians: on a busy machine a count's cost is its slow calls, one in a
//   few taking 5x the others.
// - Every `period` calls it probes a neighbouring count, fewer threads and
//   more in turn, for 4 calls, and moves there if their mean is 5% below
//   the current count's last 8 calls'. A probe whose first call took 4x
//   that stops there: a bad count costs one call. A probe that loses
//   doubles the period (16 calls up to 2048), so a settled graph spends
//   well under 1% of its calls probing.
// - A slowdown (the last 3 calls' median 1.5x the measured mean: load
//   came) probes fewer threads at once.
// - Before it probes more threads, 4 calls measure how long the calling
//   thread waited for a core (/proc/thread-self/schedstat; one short call
//   is too few to see a preemption). Above 10% of their time the cores are
//   taken, more threads would spin against their owners, and the probe is
//   skipped: on the busy machine above, a probe of 2 threads would cost a
//   237 ms call.
// - The warm-up call measures its wait too: where the cores are taken
//   already, it stands for the measurement, and fewer threads are probed
//   from the second call.
// The count is set with omp_set_num_threads, the calling thread's own
// setting: other threads keep theirs, and the caller gets its own back
// after the call. What the count changes is speed, not results: generated
// kernels compute the same bits with any count (Note [Split reductions]).
// ATen's kernels that split a reduction across threads may round
// otherwise, as they do when a user changes at::set_num_threads; a fixed
// InductorOptions::threads, or adapt_threads off, keeps one count.
namespace {

constexpr size_t kSamples = 4, kRecent = 8;
constexpr int64_t kMinPeriod = 16, kMaxPeriod = 2048;
constexpr double kBetter = 0.95, kGiveUp = 4.0, kSlowdown = 1.5, kMaxWait = 0.1;

double mean(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// omp_set_num_threads of the OpenMP runtime LibTorch loaded, looked up
// rather than linked: a LibTorch built with another runtime (or none)
// links nothing of ours. Null without one.
using SetNumThreads = void (*)(int);
SetNumThreads omp_set_num_threads_fn() {
  static const auto fn = reinterpret_cast<SetNumThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  return fn;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The time the calling thread has spent runnable but not running, in ns
// (the second field of its schedstat); -1 where the kernel does not say.
int64_t waited_ns() {
  const int fd = ::open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char text[128];
  const ssize_t n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  if (n <= 0) return -1;
  text[n] = '\0';
  unsigned long long running = 0, waiting = 0;
  if (std::sscanf(text, "%llu %llu", &running, &waiting) != 2) return -1;
  return static_cast<int64_t>(waiting);
}

}  // namespace

int ThreadTuner::choose(int available) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (arms_.empty() || arms_.front() != available) {
    arms_.clear();
    for (int t = std::max(available, 1); t > 1; t = (t + 1) / 2) arms_.push_back(t);
    arms_.push_back(1);
    current_ = probed_ = 0;
    phase_ = Phase::warm_up;
    samples_.clear();
    recent_.clear();
    period_ = kMinPeriod;
    since_ = 0;
    fewer_next_ = true;
    gate_ = 0;
  }
  return threads_of(phase_ == Phase::probe ? probed_ : current_);
}

bool ThreadTuner::wants_wait() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return gate_ > 0 || phase_ == Phase::warm_up;
}

void ThreadTuner::hold() {
  phase_ = Phase::hold;
  samples_.clear();
  since_ = 0;
}

void ThreadTuner::start_probe(size_t arm) {
  probed_ = arm;
  phase_ = Phase::probe;
  samples_.clear();
}

void ThreadTuner::measured(double reference) {
  reference_ = reference;
  recent_.clear();
  period_ = kMinPeriod;
  hold();
  // Fewer threads at once: on a busy machine every call until then is the
  // slow kind.
  fewer_next_ = false;
  start_probe(current_ + 1);
}

void ThreadTuner::stay(double reference) {
  reference_ = reference;
  period_ = std::min(2 * period_, kMaxPeriod);
  hold();
}

bool ThreadTuner::record(int threads, double seconds, double waited) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (arms_.size() < 2 || threads != threads_of(phase_ == Phase::probe ? probed_ : current_)) return false;
  switch (phase_) {
    case Phase::warm_up:
      if (waited > kMaxWait)  // the cores are taken already: this call stands for the measurement
        measured(seconds);
      else
        phase_ = Phase::measure;
      return false;
    case Phase::measure:
      samples_.push_back(seconds);
      if (samples_.size() < kSamples) return false;
      measured(mean(samples_));
      return false;
    case Phase::hold: {
      recent_.push_back(seconds);
      if (recent_.size() > kRecent) recent_.erase(recent_.begin());
      if (gate_ > 0) {  // the calls before a probe of more threads measure their wait
        waited_seconds_ += std::max(waited, 0.0) * seconds;
        gated_seconds_ += seconds;
        if (--gate_ > 0) return false;
        if (waited_seconds_ > kMaxWait * gated_seconds_)  // skipped, as a probe that lost
          stay(mean(recent_));
        else
          start_probe(current_ - 1);
        return false;
      }
      // Robust to one slow call: the median of the last 3.
      const bool slow = recent_.size() >= 3 && median({recent_.end() - 3, recent_.end()}) > kSlowdown * reference_;
      if (slow) {
        period_ = kMinPeriod;
        fewer_next_ = true;
      } else if (++since_ < period_) {
        return false;
      }
      bool fewer = fewer_next_;
      if (fewer && current_ + 1 == arms_.size()) fewer = false;
      if (!fewer && current_ == 0) fewer = true;
      fewer_next_ = !fewer;
      if (fewer) {
        start_probe(current_ + 1);
      } else {
        gate_ = static_cast<int>(kSamples);
        waited_seconds_ = gated_seconds_ = 0;
      }
      since_ = 0;
      return false;
    }
    case Phase::probe: {
      samples_.push_back(seconds);
      const double base = recent_.size() < kSamples ? reference_ : mean(recent_);
      const bool hopeless = samples_.size() == 1 && seconds > kGiveUp * base;
      if (!hopeless && samples_.size() < kSamples) return false;
      const double probed = mean(samples_);
      if (!hopeless && probed < kBetter * base) {
        fewer_next_ = probed_ > current_;  // on in the direction that won
        current_ = probed_;
        reference_ = probed;
        recent_.clear();
        period_ = kMinPeriod;
        hold();
        return true;
      }
      stay(base);  // the current count's time now: a slowdown no probe beat is the new normal
      return false;
    }
  }
  return false;
}

TunedThreads::TunedThreads(ThreadTuner& tuner) : tuner_(tuner) {
  // at::get_num_threads also runs LibTorch's per-thread initialization of
  // the count, which would otherwise overwrite ours inside the call.
  available_ = at::get_num_threads();
  threads_ = tuner_.choose(available_);
  if (threads_ != available_) omp_set_num_threads_fn()(threads_);
  if (tuner_.wants_wait()) waited_ns_ = waited_ns();
  start_ns_ = now_ns();
}

TunedThreads::~TunedThreads() {
  if (threads_ != available_) omp_set_num_threads_fn()(available_);
}

void TunedThreads::done() {
  const int64_t elapsed = std::max<int64_t>(now_ns() - start_ns_, 1);
  double waited = -1;
  if (waited_ns_ >= 0) {
    const int64_t after = waited_ns();
    if (after >= 0) waited = static_cast<double>(after - waited_ns_) / static_cast<double>(elapsed);
  }
  if (tuner_.record(threads_, static_cast<double>(elapsed) * 1e-9, waited))
    runtime::default_counters().add("inductor", "thread_count_changes");
}

bool openmp_threads_settable() { return omp_set_num_threads_fn() != nullptr; }

std::unique_ptr<ThreadTuner> thread_tuner(c10::Device device, const InductorOptions& options) {
  if (!device.is_cpu() || !options.adapt_threads || options.threads != 0 || !openmp_threads_settable()) return nullptr;
  return std::make_unique<ThreadTuner>();
}

}  // namespace crucible::inductor::detail
