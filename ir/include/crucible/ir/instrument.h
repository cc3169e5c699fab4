// Instruments: hooks around every stage of a compilation — each trace, the
// metadata analysis, the partition, each pass, each compiler and backend —
// for timing, graph dumps, verification, metrics and counters. TVM's
// PassInstrument made the one mechanism for every stage: the stages emit
// events and never look at who listens.
#pragma once

#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace crucible::ir {

class Graph;

/// One graph a stage takes or produces, under the name the compilation gives
/// it: "joint", "forward", "backward", "inference", "train_step", ...
struct StageGraph {
  std::string_view name;
  const Graph* graph = nullptr;
};

// Note [Compilation stages]
// The events a compilation emits, in the order they come (every stage gets
// before_stage, then after_stage; stages nest):
//  - "compile": one compilation of one function by AOTAutograd (the lazy
//    backward compile at the first backward is one too). Before: `id`
//    ("0/1": function 0, its second compilation) and `detail`, why it
//    happens ("first call", the first failing guard of a recompile, "first
//    backward"); after: the same id, and when it failed, `detail` = the
//    error. Everything below happens inside one.
//  - "trace" (pre-grad graphs: the forward graph, "pre_grad"),
//    "collect_metadata" (the metadata analysis, no graphs),
//    "trace_joint" (after: "joint"), "trace_inference" (after: the
//    inference graph, named by AotConfig::inference_graph_name), "export"
//    (after: "export").
//  - "partition": the joint graph before; "forward" and "backward" after.
//  - "fw_compiler", "bw_compiler", "inference_compiler": a compiler called
//    on its graph (before and after, never changed). After: `cached` when a
//    cache of compiled graphs supplied the callable (nothing below ran), and
//    `detail` = the cache's outcome ("hit", "miss", "bypass: ..."; empty
//    without a cache).
//  - inside a compiler, one stage per pass, named after the pass ("dce",
//    "cse", a user pass's name): the graph before and after, `changed`
//    saying whether the pass changed it; then "backend": the graph the
//    backend compiles (never changed), the runtime wrappers inside it.
// When a stage throws, after_stage still comes, with `failed` set and no
// graphs, and the exception propagates. should_run is asked before each
// pass (a pass any instrument says no to is skipped, and gets neither
// event); other stages always run.

/// What a stage event carries; see Note [Compilation stages]. Every field has
/// a default, so an event names only what it carries ({.stage = "trace"}).
struct StageEvent {
  std::string_view stage{};
  /// Before: the stage's input graphs; after: its results (none if it failed).
  std::vector<StageGraph> graphs{};
  /// After: whether the stage changed or made the graphs (false for the
  /// compiler and backend stages, and for passes that left the graph as it was).
  bool changed = true;
  /// After: the stage threw.
  bool failed = false;
  /// After a compiler stage: the callable came from a cache of compiled graphs.
  bool cached = false;
  /// The stage is a pass's (PassManager's; should_run was asked for it).
  bool pass = false;
  /// "compile": the compilation's id.
  std::string_view id{};
  /// "compile" before: why it happens; a compiler stage after: the graph
  /// cache's outcome; a failed "compile": the error message.
  std::string_view detail{};
};

/// Hooks around stages. Override what you need. should_run and before_stage
/// are called in the order instruments were added, after_stage in reverse
/// (so the first instrument's hooks wrap the others': a timer added last
/// times the stage alone, not the dumps of the instruments before it).
/// Hooks may be called from any thread that compiles (a lazy backward
/// compiles on the autograd engine's); an instrument that keeps state
/// across events of one compilation must expect that.
class Instrument {
 public:
  virtual ~Instrument() = default;
  /// Asked before each pass; return false to skip it.
  virtual bool should_run(const StageEvent& event) {
    (void)event;
    return true;
  }
  virtual void before_stage(const StageEvent& event) { (void)event; }
  virtual void after_stage(const StageEvent& event) { (void)event; }
};

using Instruments = std::vector<std::shared_ptr<Instrument>>;

/// True unless an instrument's should_run says no.
bool should_run(const Instruments& instruments, const StageEvent& event);
/// before_stage for each instrument, in order.
void notify_before(const Instruments& instruments, const StageEvent& event);
/// after_stage for each instrument, in reverse order.
void notify_after(const Instruments& instruments, const StageEvent& event);

/// A stage while it runs: before_stage when made, after_stage at done() or,
/// if never done (an exception is unwinding), a failed after_stage when it
/// goes. The event's string views must outlive the scope.
class StageScope {
 public:
  StageScope(const Instruments& instruments, StageEvent before);
  ~StageScope();
  StageScope(const StageScope&) = delete;
  StageScope& operator=(const StageScope&) = delete;

  /// The stage ended with `after` (its stage name and id are taken from the
  /// before event). Calling it twice does nothing the second time.
  void done(StageEvent after);
  /// The stage ended in an error: a failed after event with `message` as
  /// its detail (for "compile", what metrics record).
  void failed(std::string_view message);

 private:
  const Instruments* instruments_;
  std::string_view stage_, id_;
  bool open_;
};

/// Runs `body()` as a stage: before_stage with `before`; after_stage with the
/// graphs `outputs(result)` returns and `changed`, or failed if it threw.
/// Returns body's result.
template <typename Body, typename Outputs>
auto run_stage(const Instruments& instruments, StageEvent before, Body&& body, Outputs&& outputs, bool changed = true) {
  StageScope scope(instruments, before);
  auto result = body();
  StageEvent after;
  after.graphs = outputs(result);
  after.changed = changed;
  scope.done(std::move(after));
  return result;
}

}  // namespace crucible::ir
