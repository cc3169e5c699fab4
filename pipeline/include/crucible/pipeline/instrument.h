// Stage instruments: hooks the builder calls around every stage of a
// compilation (trace, partition, each pass, backend), for timing, graph dumps
// and verification, as TVM's PassInstrument does around passes. The stages
// themselves never see them.
#pragma once

#include <string_view>
#include <vector>

namespace crucible::ir {
class Graph;
}

namespace crucible::pipeline {

/// One graph a stage takes or produces, under the name the builder gives it:
/// "train_step", "joint", "forward", "backward", "inference".
struct StageGraph {
  std::string_view name;
  const ir::Graph* graph = nullptr;
};

// Note [Compilation stages]
// What the builder runs, and the events its instruments see:
//  - "trace" (compile_train_step): no graphs before; the traced train_step
//    graph after.
//  - "partition" (the AOT path of compile()): the joint graph before; the
//    forward and backward graphs after. The joint trace itself runs inside
//    aot_function, which times it as "trace_joint" in the default PhaseTimer.
//  - one stage per pass of the pass list, named after the pass ("dce",
//    "cse", a user pass's name): the graph before and after, with `changed`
//    saying whether the pass changed it. Passes run through ir::PassManager.
//  - "backend": the graph the backend compiles, before and after (never
//    changed); the runtime wrappers run inside this stage.
// Every stage gets before_stage, then after_stage; when a stage throws,
// after_stage still comes, with `failed` set and no graphs, and the
// exception propagates. should_run is asked before each pass (a pass any
// instrument says no to is skipped, and gets neither event); trace,
// partition and backend always run. A graph compiled lazily (the backward,
// at the first backward call) gets its events then.

/// What a stage event carries.
struct StageEvent {
  std::string_view stage;
  /// Before: the stage's input graphs; after: its results (none if it failed).
  std::vector<StageGraph> graphs;
  /// After: whether the stage changed or made the graphs (false for the backend
  /// stage and for passes that left the graph as it was).
  bool changed = true;
  /// After: the stage threw.
  bool failed = false;
};

/// Hooks around compilation stages; see Note [Compilation stages]. Override
/// what you need. should_run and before_stage are called in the order the
/// instruments were added to the builder, after_stage in the reverse order,
/// so the first added wraps the others (add a timer last to time the stage
/// alone); all from the compiling thread.
/// A hook that throws aborts the compilation: the exception propagates to
/// the caller unchanged, what the stage made is dropped, and the remaining
/// instruments miss that event (GraphVerifier relies on this to stop at an
/// invalid graph). A throw from before_stage or should_run also means the
/// stage does not run and gets no after_stage; one from a failed stage's
/// after_stage replaces the stage's exception.
class StageInstrument {
 public:
  virtual ~StageInstrument() = default;
  /// Asked before each pass; return false to skip it.
  virtual bool should_run(const StageEvent& event) {
    (void)event;
    return true;
  }
  virtual void before_stage(const StageEvent& event) { (void)event; }
  virtual void after_stage(const StageEvent& event) { (void)event; }
};

}  // namespace crucible::pipeline
