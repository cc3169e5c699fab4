// The thread count of a compiled graph's calls on the CPU (Note [Threads on
// a shared machine] in inductor/src/runtime/threads.cpp). The policy is
// driven with made-up call times, so what it decides is exact and no test
// depends on how busy the machine running it is. The times are the shapes
// measured on a 2-core machine: the ConvNet's step took 1.0 ms with 2
// threads and 1.5 ms with 1 when idle, 150 ms with 2 and 1.5 ms with 1 while
// two busy loops ran.
#include "runtime/threads.h"

#include <crucible/inductor/compile_fx.h>
#include <crucible/ir/graph.h>
#include <crucible/ir/propagate_meta.h>
#include <crucible/ir/tensor_meta.h>

#include <ATen/Parallel.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tanh.h>

#include "catch.h"
#include "testing.h"

#include <functional>
#include <map>
#include <stdexcept>

using crucible::inductor::detail::ThreadTuner;
using crucible::inductor::detail::TunedThreads;

namespace {

// A call's time in ms by its thread count, and the share of it the calling
// thread waited for a core.
struct Machine {
  std::map<int, double> ms;
  double waited = 0;
};

const Machine kIdle{{{2, 1.0}, {1, 1.5}}, 0.0};
const Machine kBusy{{{2, 150.0}, {1, 1.5}}, 0.33};  // 3 runnable threads on 2 cores: a third of the time waiting

// Runs `calls` calls on `machine` (which may change with the call's
// index); returns how many ran with each thread count, and counts in
// `changes` the calls after which the count changed.
std::map<int, int> run(ThreadTuner& tuner, int available, int calls, const std::function<Machine(int)>& machine,
                       int* changes = nullptr) {
  std::map<int, int> counts;
  for (int i = 0; i < calls; ++i) {
    const int t = tuner.choose(available);
    REQUIRE(t >= 1);
    REQUIRE(t <= available);
    const Machine m = machine(i);
    const bool changed = tuner.record(t, m.ms.at(t) * 1e-3, tuner.wants_wait() ? m.waited : -1);
    if (changes && changed) ++*changes;
    ++counts[t];
  }
  return counts;
}

}  // namespace

TEST_CASE("threads: an idle machine keeps every thread, probing one thread rarely", "[inductor][threads]") {
  ThreadTuner tuner;
  int changes = 0;
  const std::map<int, int> counts = run(
      tuner, 2, 10000, [](int) { return kIdle; }, &changes);
  // Probes of 1 thread, 4 calls each: one after measuring, then after 32,
  // 64, ... 2048 calls and every 2048 after: 10 probes in 10000 calls, 0.4%.
  CHECK(counts.at(1) > 0);
  CHECK(counts.at(1) <= 40);
  CHECK(changes == 0);
}

TEST_CASE("threads: a busy machine moves to 1 thread within a few calls and never probes 2 again",
          "[inductor][threads]") {
  ThreadTuner tuner;
  int changes = 0;
  const std::map<int, int> counts = run(
      tuner, 2, 10000, [](int) { return kBusy; }, &changes);
  // The warm-up call at 2 threads, which waited a third of its time for a
  // core, then 1 thread for good: every probe of 2 threads waits for 4
  // calls that measure their wait, and a third of their time waiting skips
  // it.
  CHECK(counts.at(2) == 1);
  CHECK(changes == 1);
}

TEST_CASE("threads: a busy machine that does not say so costs the warm-up and 4 measured calls",
          "[inductor][threads]") {
  ThreadTuner tuner;
  Machine busy = kBusy;
  busy.waited = 0;  // the calls' waits unseen (a kernel without schedstat reports none either)
  const std::map<int, int> counts = run(tuner, 2, 200, [&](int) { return busy; });
  // And probes of 2 threads, each stopped at its first call: after 16, 32
  // and 64 calls (and 4 that measure their wait), 3 in 200 calls.
  CHECK(counts.at(2) == 5 + 3);
  CHECK(tuner.choose(2) == 1);
}

TEST_CASE("threads: load that comes and goes: fewer threads while it lasts, all of them after", "[inductor][threads]") {
  ThreadTuner tuner;
  std::map<int, int> at_two_while_busy;
  int last_switch_back = -1;
  int previous = 0;
  for (int i = 0; i < 12000; ++i) {
    const bool busy = i >= 1000 && i < 3000;
    const Machine& m = busy ? kBusy : kIdle;
    const int t = tuner.choose(2);
    tuner.record(t, m.ms.at(t) * 1e-3, tuner.wants_wait() ? m.waited : -1);
    if (busy && t == 2) ++at_two_while_busy[i < 1010 ? 0 : 1];
    if (!busy && i >= 3000 && t == 2 && previous == 1 && last_switch_back < 0) last_switch_back = i;
    previous = t;
  }
  // The slowdown shows after 2 slow calls (a median of 3 beyond 1.5x), then
  // a probe of 1 thread wins: at most 2 slow calls at 2 threads, and none
  // after the first 10 busy calls.
  CHECK(at_two_while_busy[0] <= 2);
  CHECK(at_two_while_busy[1] == 0);
  // Back to 2 threads after the load went, within one probe period (at
  // most 2048 calls, and 4 calls that measure their wait).
  REQUIRE(last_switch_back >= 3000);
  CHECK(last_switch_back <= 3000 + 2048 + 4);
  CHECK(tuner.choose(2) == 2);
}

TEST_CASE("threads: a graph too small for its threads runs on one", "[inductor][threads]") {
  ThreadTuner tuner;
  const Machine small{{{2, 0.36}, {1, 0.32}}, 0.0};  // the MLP step's times on the idle 2-core machine
  const std::map<int, int> counts = run(tuner, 2, 5000, [&](int) { return small; });
  CHECK(counts.at(1) > 4900);
}

TEST_CASE("threads: 8 threads on a machine where 4 cores are free settle at 4", "[inductor][threads]") {
  ThreadTuner tuner;
  const Machine half{{{8, 100.0}, {4, 1.0}, {2, 1.8}, {1, 3.5}}, 0.0};
  run(tuner, 8, 200, [&](int) { return half; });
  CHECK(tuner.choose(8) == 4);
  const std::map<int, int> counts = run(tuner, 8, 5000, [&](int) { return half; });
  CHECK(counts.at(4) > 4900);
  // A probe of 8 stops after its first call (beyond 4x the current mean).
  CHECK(counts.at(8) <= 10);
}

TEST_CASE("threads: a new maximum starts over; reports of another count are ignored", "[inductor][threads]") {
  ThreadTuner tuner;
  run(tuner, 2, 100, [](int) { return kBusy; });
  CHECK(tuner.choose(2) == 1);
  // The caller's maximum went to 4 (at::set_num_threads): measured anew.
  CHECK(tuner.choose(4) == 4);
  // A concurrent call that ran with another count says nothing.
  CHECK_FALSE(tuner.record(1, 1.0));
  CHECK(tuner.choose(4) == 4);
  // With one thread available there is nothing to choose.
  ThreadTuner single;
  CHECK(single.choose(1) == 1);
  CHECK_FALSE(single.record(1, 1.0));
}

TEST_CASE("threads: a kernel that does not say how long a thread waited still probes more threads",
          "[inductor][threads]") {
  ThreadTuner tuner;
  // Busy first (to 1 thread), then idle, with no waiting share reported.
  int at_two_late = 0;
  for (int i = 0; i < 6000; ++i) {
    const Machine& m = i < 500 ? kBusy : kIdle;
    const int t = tuner.choose(2);
    tuner.record(t, m.ms.at(t) * 1e-3, -1);
    if (i >= 5000 && t == 2) ++at_two_late;
  }
  CHECK(at_two_late > 990);
}

TEST_CASE("threads: TunedThreads sets the calling thread's count for the call and restores it", "[inductor][threads]") {
  const int before = at::get_num_threads();
  at::set_num_threads(4);
  ThreadTuner tuner;
  // Made-up times that make 1 thread the choice.
  run(tuner, 4, 200, [](int) { return Machine{{{4, 100.0}, {2, 50.0}, {1, 1.0}}, 0.0}; });
  REQUIRE(tuner.choose(4) == 1);
  {
    TunedThreads scope(tuner);
    CHECK(at::get_num_threads() == 1);  // what ATen's parallel_for and the generated regions see
    scope.done();
  }
  CHECK(at::get_num_threads() == 4);
  // An exception inside the call: the count comes back all the same.
  try {
    TunedThreads scope(tuner);
    throw std::runtime_error("a kernel failed");
  } catch (const std::runtime_error&) {
  }
  CHECK(at::get_num_threads() == 4);
  at::set_num_threads(before);
}

TEST_CASE("threads: a compiled CPU graph leaves the caller's thread count as it was", "[inductor][threads]") {
  const at::Tensor x = at::randn({1 << 16});
  crucible::ir::Graph g;
  crucible::ir::Value* in = g.add_placeholder("x", crucible::ir::TensorMeta::of(x));
  g.set_output({g.add_call("aten::tanh", {in})->result()});
  crucible::ir::propagate_meta(g);
  crucible::ir::CompiledFn fn = crucible::inductor::compile_fx_inner(g, {x}, {});
  const int before = at::get_num_threads();
  for (int i = 0; i < 50; ++i) {
    std::vector<at::Tensor> inputs = {x};
    const std::vector<at::Tensor> out = fn(inputs);
    // The generated tanh rounds within a few float ulps of ATen's.
    REQUIRE_CLOSE(out.at(0), at::tanh(x), 1e-6, 1e-6);
    REQUIRE(at::get_num_threads() == before);
  }
}
