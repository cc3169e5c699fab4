// Autotuning at a kernel's first run: see runtime/autotune.h.
#include "runtime/autotune.h"

#include <crucible/inductor/error.h>
#include <crucible/runtime/disk_cache.h>
#include <crucible/runtime/instruments.h>

#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <vector>

namespace crucible::inductor::detail {

// Note [Autotuning] (codegen/cuda.cpp says what is rendered): the first
// run of a kernel rendered in several configurations times each on the
// run's own buffers, as torch/_inductor's CachingAutotuner benchmarks its
// configs at the first launch: every configuration is launched once to warm
// up, then kTimedLaunches times between two events, in kRounds rounds that
// take turns (a clock change then falls on all of them alike); the least
// mean wins. A configuration giving the same grid of the same kernel as an
// earlier one is not timed, nor one the driver refuses to launch. The
// kernels compute the same values, so running them again only overwrites
// the outputs; the chosen one runs last, so the call's results are those
// every later call gets. The choice is shared by the plan's identical
// kernels (one tuning key) and stored in the cache directory, keyed by the
// key and the device, so a new process takes it without timing (and
// computes the same bits as this one). While the stream captures a CUDA
// graph nothing can be timed: the first configuration runs, untuned (the
// warm-up call before a capture has tuned already).

namespace {

constexpr int kRounds = 2;
constexpr int kTimedLaunches = 3;

std::string tuning_path(const std::string& cache_dir, const std::string& tuning_key, const std::string& tuning_device) {
  return cache_dir + "/t" + cache_key(tuning_key + "\n" + tuning_device) + ".tune";
}

}  // namespace

std::optional<int> stored_configuration(const std::string& cache_dir, const std::string& tuning_key,
                                        const std::string& tuning_device, int n) {
  const std::string stored = runtime::read_file(tuning_path(cache_dir, tuning_key, tuning_device));
  // "<choice> of <n>"; anything else (another format, a torn file) is timed again.
  int index = -1, of = -1;
  if (std::sscanf(stored.c_str(), "%d of %d", &index, &of) == 2 && of == n && index >= 0 && index < n) return index;
  return std::nullopt;
}

int choose_configuration(const Plan& plan, const Step& st, void* stream, void** args) {
  int chosen = st.chosen->load(std::memory_order_acquire);
  if (chosen >= 0) return chosen;
  if (plan.cuda->capturing(stream)) return 0;
  std::lock_guard<std::mutex> lock(plan.tuning_mutex);
  if ((chosen = st.chosen->load(std::memory_order_relaxed)) >= 0) return chosen;
  const int n = static_cast<int>(st.configs.size());
  runtime::Counters& counters = runtime::default_counters();
  if (auto it = plan.tuned.find(st.tuning_key); it != plan.tuned.end()) {
    chosen = it->second;
  } else if (const std::optional<int> stored =
                 stored_configuration(plan.cache_dir, st.tuning_key, plan.tuning_device, n)) {
    chosen = *stored;
    counters.add("inductor", "autotune_cache_hit");
  }
  if (chosen < 0) {
    const c10::Stream s = c10::impl::getDeviceGuardImpl(c10::kCUDA)->getStream(plan.device);
    std::vector<bool> timed(st.configs.size(), true);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < i; ++j)
        timed[i] = timed[i] && !(st.configs[j].kernel == st.configs[i].kernel &&
                                 plan.cuda->blocks(st.configs[j].launch) == plan.cuda->blocks(st.configs[i].launch));
    // A configuration the driver refuses (more registers or shared memory
    // than a block may have on this device) is left out; the first one is
    // what an untuned run launches, so its refusal stands.
    for (int i = 0; i < n; ++i) {
      if (!timed[i]) continue;
      try {
        plan.cuda->launch(st.configs[i].kernel, st.configs[i].name, st.configs[i].launch, stream, args);
      } catch (const InductorError&) {
        if (i == 0) throw;
        timed[i] = false;
      }
    }
    std::vector<c10::Event> events;
    events.reserve(2 * n * kRounds);
    for (int round = 0; round < kRounds; ++round)
      for (int i = 0; i < n; ++i) {
        if (!timed[i]) continue;
        events.emplace_back(c10::kCUDA, c10::EventFlag::BACKEND_DEFAULT);
        events.back().record(s);
        for (int k = 0; k < kTimedLaunches; ++k)
          plan.cuda->launch(st.configs[i].kernel, st.configs[i].name, st.configs[i].launch, stream, args);
        events.emplace_back(c10::kCUDA, c10::EventFlag::BACKEND_DEFAULT);
        events.back().record(s);
      }
    std::vector<double> ms(st.configs.size(), std::numeric_limits<double>::infinity());
    size_t e = 0;
    for (int round = 0; round < kRounds; ++round)
      for (int i = 0; i < n; ++i) {
        if (!timed[i]) continue;
        events[e + 1].synchronize();
        ms[i] = std::min(ms[i], events[e].elapsedTime(events[e + 1]));
        e += 2;
      }
    chosen = static_cast<int>(std::min_element(ms.begin(), ms.end()) - ms.begin());
    counters.add("inductor", "autotuned");
    try {
      write_atomically(tuning_path(plan.cache_dir, st.tuning_key, plan.tuning_device),
                       std::to_string(chosen) + " of " + std::to_string(n) + "\n");
    } catch (const InductorError& err) {  // the next process times it again
      TORCH_WARN_ONCE("inductor: an autotuning choice was not stored: ", err.what());
    }
  }
  plan.tuned.emplace(st.tuning_key, chosen);
  st.chosen->store(chosen, std::memory_order_release);
  return chosen;
}

}  // namespace crucible::inductor::detail
