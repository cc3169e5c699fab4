// The standard instruments (runtime/instruments.h), driven by the stage
// events a compilation emits (Note [Compilation stages]).
#include <crucible/ir/graph.h>
#include <crucible/ir/instrument.h>
#include <crucible/ir/pass_manager.h>
#include <crucible/runtime/instruments.h>
#include <crucible/runtime/metrics.h>
#include <crucible/runtime/timing.h>

#include <memory>
#include <stdexcept>
#include <thread>

#include "catch.h"

using namespace crucible;

namespace {

// x -> neg -> output: one placeholder, one op, three nodes.
ir::Graph small_graph() {
  ir::Graph g;
  ir::Value* x = g.add_placeholder("x", ir::TensorMeta::contiguous({3}));
  ir::Value* y = g.add_call("aten::neg", {x})->result();
  y->set_meta(ir::TensorMeta::contiguous({3}));
  g.set_output({y});
  return g;
}

// One compilation as AOTAutograd's inference path emits it; `fail` makes
// the compiler stage throw.
void compile(const ir::Instruments& instruments, const ir::Graph& g, const char* id, const char* reason,
             bool fail = false, const char* cache = "") {
  ir::StageScope c(instruments, ir::StageEvent{.stage = "compile", .id = id, .detail = reason});
  try {
    ir::StageScope compiler(instruments, ir::StageEvent{.stage = "inference_compiler", .graphs = {{"inference", &g}}});
    if (fail) throw std::runtime_error("no kernel for aten::neg");
    ir::StageEvent after{.stage = "inference_compiler", .graphs = {{"inference", &g}}};
    after.changed = false;
    after.detail = cache;
    after.cached = std::string_view(cache) == "hit";
    compiler.done(after);
  } catch (const std::exception& e) {
    c.failed(e.what());
    return;
  }
  c.done({});
}

}  // namespace

TEST_CASE("MetricsRecorder: one record per compiled graph and one per failed compilation", "[runtime][instruments]") {
  runtime::MetricsLog log(8);
  const ir::Instruments instruments = {std::make_shared<runtime::MetricsRecorder>(log)};
  const ir::Graph g = small_graph();
  compile(instruments, g, "0/0", "first call", false, "miss");
  compile(instruments, g, "0/1", "input 0: sizes [4] (compiled for [3])", true);
  const auto records = log.records();
  REQUIRE(records.size() == 2);
  CHECK(records[0].compile_id == "0/0");
  CHECK(records[0].kind == "inference");
  CHECK(records[0].graph_node_count == 3);
  CHECK(records[0].graph_op_count == 1);
  CHECK(records[0].graph_input_count == 1);
  CHECK(records[0].graph_cache == "miss");
  CHECK(records[0].recompile_reason == "first call");
  CHECK(records[0].compile_time_ms >= records[0].backend_compile_time_ms);
  CHECK_FALSE(records[0].fail_reason.has_value());
  CHECK(records[1].compile_id == "0/1");
  CHECK(records[1].recompile_reason == "input 0: sizes [4] (compiled for [3])");
  CHECK(records[1].kind == "compile");
  CHECK(records[1].fail_type == "inference_compiler");
  CHECK(records[1].fail_reason == "no kernel for aten::neg");
}

TEST_CASE("CounterRecorder: compilations, recompile reasons, graphs, cache outcomes and failures",
          "[runtime][instruments]") {
  runtime::Counters counters;
  const ir::Instruments instruments = {std::make_shared<runtime::CounterRecorder>(counters)};
  const ir::Graph g = small_graph();
  compile(instruments, g, "0/0", "first call", false, "miss");
  compile(instruments, g, "1/0", "first call", false, "hit");
  compile(instruments, g, "1/1", "input 0: sizes [4] (compiled for [3])", false, "bypass: user backend");
  compile(instruments, g, "1/2", "input 0: sizes [5] (compiled for [3])", true);
  CHECK(counters.get("stats", "compilations") == 4);
  CHECK(counters.get("graphs", "inference") == 3);
  CHECK(counters.get("graph_cache", "miss") == 1);
  CHECK(counters.get("graph_cache", "hit") == 1);
  CHECK(counters.get("graph_cache", "bypass") == 1);
  CHECK(counters.get("recompiles", "input 0: sizes [4] (compiled for [3])") == 1);
  CHECK(counters.get("failures", "inference_compiler") == 1);
  CHECK(counters.get("failures", "compile") == 1);
  CHECK(counters.get("stats", "never_counted") == 0);
  CHECK(counters.report().find("stats.compilations: 4\n") != std::string::npos);
  counters.clear();
  CHECK(counters.snapshot().empty());
  CHECK(counters.report().empty());
}

TEST_CASE("CounterRecorder: the passes that changed a graph, by name", "[runtime][instruments]") {
  runtime::Counters counters;
  ir::Graph g = small_graph();
  const std::vector<ir::Pass> passes = {{"leaves_it", [](ir::Graph&) {}},
                                        {"doubles", [](ir::Graph& graph) {
                                           ir::Value* y = graph.outputs()[0];
                                           ir::Node* twice = graph.add_call("aten::add.Tensor", {y, y});
                                           twice->result()->set_meta(y->meta());
                                           graph.set_output({twice->result()});
                                         }}};
  ir::PassManager(passes, {.instruments = {std::make_shared<runtime::CounterRecorder>(counters)}}).run(g);
  ir::PassManager(passes, {.instruments = {std::make_shared<runtime::CounterRecorder>(counters)}}).run(g);
  CHECK(counters.get("passes", "doubles") == 2);
  CHECK(counters.get("passes", "leaves_it") == 0);
}

TEST_CASE("StageTimer: nested stages nest as phases; each thread closes its own", "[runtime][instruments]") {
  runtime::PhaseTimer timer;
  const ir::Instruments instruments = {std::make_shared<runtime::StageTimer>(timer)};
  const ir::Graph g = small_graph();
  compile(instruments, g, "0/0", "first call");
  // A lazy backward compiles on another thread while this one is inside a stage.
  {
    ir::StageScope outer(instruments, ir::StageEvent{.stage = "compile"});
    std::thread([&] { compile(instruments, g, "0/1", "first backward"); }).join();
    outer.done({});
  }
  const auto phases = timer.phases();
  REQUIRE(phases.size() == 2);
  CHECK(phases[0].name == "compile");
  CHECK(phases[0].calls() == 3);
  CHECK(phases[1].name == "inference_compiler");
  CHECK(phases[1].parent == "compile");
  CHECK(phases[1].calls() == 2);
}

TEST_CASE("default_instruments time, record and count into the process-wide timer, log and counters",
          "[runtime][instruments]") {
  runtime::default_metrics_log().clear();
  runtime::default_counters().clear();
  const double before_ms = runtime::default_phase_timer().total_ms("inference_compiler");
  const ir::Graph g = small_graph();
  compile(runtime::default_instruments(), g, "7/0", "first call");
  CHECK(runtime::default_metrics_log().records().size() == 1);
  CHECK(runtime::default_counters().get("stats", "compilations") == 1);
  CHECK(runtime::default_phase_timer().total_ms("inference_compiler") >= before_ms);
  CHECK(runtime::default_metrics_log().capacity() == runtime::kDefaultMetricsCapacity);
}

TEST_CASE("StageTimer: two timers on one list both time every stage", "[runtime][instruments]") {
  runtime::PhaseTimer first, second;
  const ir::Instruments instruments = {std::make_shared<runtime::StageTimer>(first),
                                       std::make_shared<runtime::StageTimer>(second)};
  const ir::Graph g = small_graph();
  compile(instruments, g, "0/0", "first call");
  for (const runtime::PhaseTimer* timer : {&first, &second}) {
    const auto phases = timer->phases();
    REQUIRE(phases.size() == 2);
    CHECK(phases[0].calls() == 1);
    CHECK(phases[1].calls() == 1);
    CHECK(phases[1].parent == "compile");
  }
}
