// The per-step profile a plan prints when it goes: see Note [Per-step
// profile].
#include "runtime/plan.h"

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <unordered_set>
#include <utility>

namespace crucible::inductor::detail {

// Note [Per-step profile]
// With InductorOptions::profile, every call times each step (CUDA events
// around it on a GPU, read once the call's work is done; a steady clock on
// the CPU) and the plan prints, when the CompiledFn goes, the steps that
// took the most time over all calls: what a reader needs to see where a
// compiled graph spends its time (generated kernels against extern ones)
// without a profiler. Events and the wait at the end of each call slow the
// calls down: profiling is for looking, not for timing the whole. The first
// call is left out when later ones ran (as torch.profiler's warm-up): it
// loads modules and makes cuBLAS's and cuDNN's handles, workspaces and
// algorithm choices, which cost more than the GPT-2 step's lm-head matmuls
// themselves would over ten calls.

namespace {

// The ATen ops a kernel's `fuses` text names ("%v (aten::op) ..."), each
// once, in order, without the namespace: "amax sub exp sum div".
std::string fused_ops(const std::string& fuses) {
  std::string ops;
  std::unordered_set<std::string> seen;
  for (size_t at = fuses.find("(aten::"); at != std::string::npos; at = fuses.find("(aten::", at + 1)) {
    const size_t end = fuses.find(')', at);
    if (end == std::string::npos) break;
    std::string op = fuses.substr(at + 7, end - at - 7);
    op = op.substr(0, op.find('.'));
    if (seen.insert(op).second) ops += (ops.empty() ? "" : " ") + op;
  }
  return ops;
}

}  // namespace

Plan::~Plan() {
  if (!profile || times.empty() || times.front().calls == 0) return;
  const bool past_warmup = times.front().calls > 1;
  if (past_warmup)
    for (size_t i = 0; i < times.size(); ++i) {
      times[i].ms -= first_ms[i];
      --times[i].calls;
    }
  std::vector<size_t> order(steps.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return times[a].ms > times[b].ms; });
  double total = 0, generated = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    total += times[i].ms;
    if (!steps[i].node) generated += times[i].ms;
  }
  const double calls = static_cast<double>(times.front().calls);
  std::ostringstream os;
  os << std::fixed << std::setprecision(3) << "inductor profile (Note [Per-step profile]): " << steps.size()
     << " steps, " << times.front().calls << (past_warmup ? " calls after the first" : " call (the warm-up)") << ", "
     << total / calls << " ms a call, of which generated kernels " << generated / calls << " ms ("
     << std::setprecision(1) << 100 * generated / std::max(total, 1e-12) << "%)\n  ms/call   share  step\n";
  for (size_t k = 0; k < std::min<size_t>(order.size(), 30); ++k) {
    const Step& st = steps[order[k]];
    const std::string what =
        st.node ? "extern " + st.node->target() + (st.node->num_results() ? " -> %" + st.node->result(0)->name() : "")
                : st.kernel_name + ": " + st.fuses;
    os << std::setprecision(3) << std::setw(9) << times[order[k]].ms / calls << std::setprecision(1) << std::setw(7)
       << 100 * times[order[k]].ms / std::max(total, 1e-12) << "%  " << what.substr(0, 160) << "\n";
  }
  // The same time summed by what ran, as torch.profiler's key_averages: one
  // line per extern op, and one per kind of generated kernel, named by the
  // ops it fuses as TorchInductor names its kernels (a layer's softmax rows
  // are one kind across the layers).
  std::map<std::string, StepTime> by_target;
  for (size_t i = 0; i < steps.size(); ++i) {
    StepTime& t = by_target[steps[i].node ? "extern " + steps[i].node->target() : "fused " + fused_ops(steps[i].fuses)];
    t.ms += times[i].ms;
    t.calls += 1;
  }
  std::vector<std::pair<std::string, StepTime>> totals(by_target.begin(), by_target.end());
  std::sort(totals.begin(), totals.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  os << "  ms/call   share  steps  summed by op\n";
  for (size_t k = 0; k < std::min<size_t>(totals.size(), 25); ++k)
    os << std::setprecision(3) << std::setw(9) << totals[k].second.ms / calls << std::setprecision(1) << std::setw(7)
       << 100 * totals[k].second.ms / std::max(total, 1e-12) << "%" << std::setw(7) << totals[k].second.calls << "  "
       << totals[k].first.substr(0, 160) << "\n";
  std::cerr << os.str();
}

}  // namespace crucible::inductor::detail
