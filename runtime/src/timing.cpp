#include <crucible/runtime/timing.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <iterator>
#include <numeric>
#include <sstream>
#include <utility>

namespace crucible::runtime {

namespace {

// The phases open on this thread, innermost last, with their timer: a
// phase nests under the innermost open phase of its own timer (two timers
// on the same stages each keep their own tree).
thread_local std::vector<std::pair<const PhaseTimer*, std::string>> t_open_phases;

std::string innermost_open(const PhaseTimer* timer) {
  for (auto it = t_open_phases.rbegin(); it != t_open_phases.rend(); ++it)
    if (it->first == timer) return it->second;
  return {};
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// 0 for a phase still open the first time.
double mean_ms(const PhaseStats& p) { return p.calls() ? p.total_ms() / static_cast<double>(p.calls()) : 0.0; }

}  // namespace

double PhaseStats::total_ms() const { return std::accumulate(times_ms.begin(), times_ms.end(), 0.0); }

PhaseTimer::Scope::Scope(PhaseTimer& timer, std::string phase)
    : timer_(&timer),
      phase_(std::move(phase)),
      parent_(innermost_open(&timer)),
      start_(std::chrono::steady_clock::now()) {
  t_open_phases.emplace_back(&timer, phase_);
  timer_->entry(phase_, parent_);  // listed from its opening: outer phases before the ones they hold
}

PhaseTimer::Scope::Scope(Scope&& other) noexcept
    : timer_(other.timer_), phase_(std::move(other.phase_)), parent_(std::move(other.parent_)), start_(other.start_) {
  other.timer_ = nullptr;
}

PhaseTimer::Scope::~Scope() {
  if (!timer_) return;
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  // A timer's scopes close in reverse order of opening on one thread.
  for (auto it = t_open_phases.rbegin(); it != t_open_phases.rend(); ++it)
    if (it->first == timer_) {
      t_open_phases.erase(std::next(it).base());
      break;
    }
  timer_->record(phase_, ms, parent_);
}

PhaseStats& PhaseTimer::entry(std::string_view phase, std::string_view parent) {
  std::lock_guard lock(mu_);
  return entry_locked(phase, parent);
}

PhaseStats& PhaseTimer::entry_locked(std::string_view phase, std::string_view parent) {
  auto it = std::find_if(phases_.begin(), phases_.end(), [&](const PhaseStats& p) { return p.name == phase; });
  if (it != phases_.end()) return *it;
  phases_.push_back(PhaseStats{std::string(phase), std::string(parent), {}});
  return phases_.back();
}

void PhaseTimer::record(std::string_view phase, double ms, std::string_view parent) {
  std::lock_guard lock(mu_);
  entry_locked(phase, parent).times_ms.push_back(ms);
}

std::vector<PhaseStats> PhaseTimer::phases() const {
  std::lock_guard lock(mu_);
  return phases_;
}

double PhaseTimer::total_ms(std::string_view phase) const {
  std::lock_guard lock(mu_);
  for (const auto& p : phases_)
    if (p.name == phase) return p.total_ms();
  return 0.0;
}

std::string PhaseTimer::report() const {
  const auto all = phases();
  std::ostringstream os;
  os << "phase                                calls    total ms     mean ms\n";
  std::vector<bool> printed(all.size(), false);
  // Depth-first, so nested phases follow their parent, indented.
  std::function<void(size_t, int)> emit = [&](size_t i, int depth) {
    printed[i] = true;
    std::string name = std::string(2 * static_cast<size_t>(depth), ' ') + all[i].name;
    if (name.size() < 36) name.resize(36, ' ');
    const double total = all[i].total_ms();
    char line[512];
    std::snprintf(line, sizeof line, "%s %6zu %11.3f %11.3f\n", name.c_str(), all[i].calls(), total, mean_ms(all[i]));
    os << line;
    for (size_t j = 0; j < all.size(); ++j)
      if (!printed[j] && all[j].parent == all[i].name) emit(j, depth + 1);
  };
  // Top level: phases with no parent, or whose parent has no entry (it was
  // opened on another timer).
  auto recorded = [&](const std::string& name) {
    return std::any_of(all.begin(), all.end(), [&](const PhaseStats& p) { return p.name == name; });
  };
  for (size_t i = 0; i < all.size(); ++i)
    if (!printed[i] && (all[i].parent.empty() || !recorded(all[i].parent))) emit(i, 0);
  // Phases nested in each other both ways (A inside B once, B inside A once).
  for (size_t i = 0; i < all.size(); ++i)
    if (!printed[i]) emit(i, 0);
  return os.str();
}

std::string PhaseTimer::csv() const {
  std::ostringstream os;
  os << "phase,parent,calls,total_ms,mean_ms\n";
  for (const auto& p : phases()) {
    const double total = p.total_ms();
    os << p.name << ',' << p.parent << ',' << p.calls() << ',' << fixed(total, 6) << ',' << fixed(mean_ms(p), 6)
       << '\n';
  }
  return os.str();
}

void PhaseTimer::clear() {
  std::lock_guard lock(mu_);
  phases_.clear();
}

PhaseTimer& default_phase_timer() {
  static PhaseTimer timer;
  return timer;
}

}  // namespace crucible::runtime
