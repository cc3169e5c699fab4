#include <crucible/ir/graph.h>
#include <crucible/runtime/instruments.h>
#include <crucible/runtime/metrics.h>
#include <crucible/runtime/timing.h>

#include <memory>
#include <thread>

namespace crucible::runtime {

namespace {

// The compiled graph's kind a compiler stage stands for, or nullptr.
const char* compiler_kind(std::string_view stage) {
  if (stage == "fw_compiler") return "forward";
  if (stage == "bw_compiler") return "backward";
  if (stage == "inference_compiler") return "inference";
  if (stage == "export") return "export";
  return nullptr;
}

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

// --- StageTimer -------------------------------------------------------------------

struct StageTimer::Open {
  std::thread::id thread;
  std::string stage;
  PhaseTimer::Scope scope;
};

StageTimer::StageTimer(PhaseTimer& timer) : timer_(timer) {}
StageTimer::~StageTimer() = default;

void StageTimer::before_stage(const ir::StageEvent& event) {
  std::lock_guard lock(mu_);
  open_.push_back(std::make_unique<Open>(
      Open{std::this_thread::get_id(), std::string(event.stage), timer_.time(std::string(event.stage))}));
}

void StageTimer::after_stage(const ir::StageEvent& event) {
  // This thread's innermost open stage (Note [Compilation stages]: stages
  // close in the reverse order they opened); closing its scope records it.
  std::unique_ptr<Open> closing;
  {
    std::lock_guard lock(mu_);
    for (auto it = open_.rbegin(); it != open_.rend(); ++it)
      if ((*it)->thread == std::this_thread::get_id()) {
        if ((*it)->stage == event.stage) {
          closing = std::move(*it);
          open_.erase(std::next(it).base());
        }
        break;
      }
  }
}

// --- MetricsRecorder ----------------------------------------------------------------

MetricsRecorder::MetricsRecorder(MetricsLog& log) : log_(log) {}

void MetricsRecorder::before_stage(const ir::StageEvent& event) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(mu_);
  if (event.stage == "compile") {
    open_.push_back(Compilation{std::string(event.id), std::string(event.detail), {}, now, now});
  } else if (compiler_kind(event.stage) && !open_.empty()) {
    open_.back().compiler_start = now;
  }
}

void MetricsRecorder::after_stage(const ir::StageEvent& event) {
  std::lock_guard lock(mu_);
  if (open_.empty()) return;
  Compilation& c = open_.back();
  if (event.stage == "compile") {
    if (event.failed) {
      CompilationMetrics m;
      m.compile_id = c.id;
      m.kind = "compile";
      m.recompile_reason = c.reason;
      m.compile_time_ms = ms_since(c.start);
      m.fail_type = c.failed_stage.empty() ? "compile" : c.failed_stage;
      m.fail_reason = std::string(event.detail);
      log_.record(std::move(m));
    }
    open_.pop_back();
    return;
  }
  // Failed stages close innermost first: the first one is where it threw.
  if (event.failed && c.failed_stage.empty()) c.failed_stage = std::string(event.stage);
  const char* kind = compiler_kind(event.stage);
  if (!kind || event.failed || event.graphs.empty() || !event.graphs[0].graph) return;
  CompilationMetrics m;
  m.compile_id = c.id;
  m.kind = kind;
  for (const ir::Node* n : event.graphs[0].graph->nodes()) {
    ++m.graph_node_count;
    m.graph_op_count += n->is_call();
    m.graph_input_count += n->is_placeholder();
  }
  m.compile_time_ms = ms_since(c.start);
  m.backend_compile_time_ms = ms_since(c.compiler_start);
  m.recompile_reason = c.reason;
  m.graph_cache = std::string(event.detail);
  log_.record(std::move(m));
}

// --- Counters -------------------------------------------------------------------------

void Counters::add(std::string_view group, std::string_view key, int64_t by) {
  std::lock_guard lock(mu_);
  auto g = counts_.find(group);
  if (g == counts_.end()) g = counts_.emplace(std::string(group), std::map<std::string, int64_t, std::less<>>{}).first;
  auto k = g->second.find(key);
  if (k == g->second.end()) k = g->second.emplace(std::string(key), 0).first;
  k->second += by;
}

int64_t Counters::get(std::string_view group, std::string_view key) const {
  std::lock_guard lock(mu_);
  auto g = counts_.find(group);
  if (g == counts_.end()) return 0;
  auto k = g->second.find(key);
  return k == g->second.end() ? 0 : k->second;
}

std::map<std::string, std::map<std::string, int64_t>> Counters::snapshot() const {
  std::lock_guard lock(mu_);
  std::map<std::string, std::map<std::string, int64_t>> out;
  for (const auto& [group, keys] : counts_) out[group] = {keys.begin(), keys.end()};
  return out;
}

std::string Counters::report() const {
  std::string out;
  for (const auto& [group, keys] : snapshot())
    for (const auto& [key, count] : keys) out += group + "." + key + ": " + std::to_string(count) + "\n";
  return out;
}

void Counters::clear() {
  std::lock_guard lock(mu_);
  counts_.clear();
}

// --- CounterRecorder ------------------------------------------------------------------

CounterRecorder::CounterRecorder(Counters& counters) : counters_(counters) {}

void CounterRecorder::before_stage(const ir::StageEvent& event) {
  if (event.stage != "compile") return;
  counters_.add("stats", "compilations");
  if (event.detail != "first call" && event.detail != "first backward" && !event.detail.empty())
    counters_.add("recompiles", event.detail);
}

void CounterRecorder::after_stage(const ir::StageEvent& event) {
  if (event.failed) {
    counters_.add("failures", event.stage);
    return;
  }
  if (event.pass && event.changed) counters_.add("passes", event.stage);
  const char* kind = compiler_kind(event.stage);
  if (!kind) return;
  counters_.add("graphs", kind);
  if (!event.detail.empty()) {
    const std::string_view outcome = event.detail.substr(0, event.detail.find(':'));
    counters_.add("graph_cache", outcome);
  }
}

// --- defaults ---------------------------------------------------------------------------

Counters& default_counters() {
  static Counters* counters = new Counters();  // never destroyed: instruments may run at exit
  return *counters;
}

const ir::Instruments& default_instruments() {
  static const ir::Instruments* instruments = new ir::Instruments{
      std::make_shared<StageTimer>(default_phase_timer()),
      std::make_shared<MetricsRecorder>(default_metrics_log()),
      std::make_shared<CounterRecorder>(default_counters()),
  };
  return *instruments;
}

}  // namespace crucible::runtime
