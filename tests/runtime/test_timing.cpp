// PhaseTimer: nesting, totals and the two report forms.
#include <crucible/runtime/timing.h>

#include <sstream>

#include "catch.h"

using crucible::runtime::PhaseTimer;

TEST_CASE("PhaseTimer records nested phases under their parent", "[runtime][timing]") {
  PhaseTimer timer;
  {
    auto outer = timer.time("compile");
    for (int i = 0; i < 2; ++i) {
      auto inner = timer.time("partition");
      auto innermost = timer.time("backend");
    }
    auto moved = timer.time("trace");
    auto other = std::move(moved);  // the moved-from scope records nothing
  }
  const auto phases = timer.phases();
  REQUIRE(phases.size() == 4);
  // Order of first opening: an outer phase before the ones it holds.
  REQUIRE(phases[0].name == "compile");
  REQUIRE(phases[0].parent.empty());
  REQUIRE(phases[1].name == "partition");
  REQUIRE(phases[1].parent == "compile");
  REQUIRE(phases[1].calls() == 2);
  REQUIRE(phases[2].name == "backend");
  REQUIRE(phases[2].parent == "partition");
  REQUIRE(phases[3].name == "trace");
  REQUIRE(phases[3].calls() == 1);
  // Nested time is part of the enclosing phase's time.
  REQUIRE(timer.total_ms("compile") >= timer.total_ms("partition") + timer.total_ms("trace"));
  REQUIRE(timer.total_ms("partition") >= timer.total_ms("backend"));
  REQUIRE(timer.total_ms("never") == 0.0);

  const std::string report = timer.report();
  // Depth-first and indented: compile, then its children, then theirs.
  const auto at_compile = report.find("\ncompile "), at_partition = report.find("\n  partition "),
             at_backend = report.find("\n    backend "), at_trace = report.find("\n  trace ");
  INFO(report);
  REQUIRE(at_compile != std::string::npos);
  REQUIRE(at_partition != std::string::npos);
  REQUIRE(at_backend != std::string::npos);
  REQUIRE(at_trace != std::string::npos);
  REQUIRE(at_compile < at_partition);
  REQUIRE(at_partition < at_backend);
}

TEST_CASE("PhaseTimer CSV has a header and one row per phase with exact totals", "[runtime][timing]") {
  PhaseTimer timer;
  timer.record("lower", 1.5);
  timer.record("lower", 2.25);
  timer.record("codegen", 4.0, "lower");
  REQUIRE(timer.total_ms("lower") == 3.75);
  std::istringstream csv(timer.csv());
  std::string line;
  std::getline(csv, line);
  REQUIRE(line == "phase,parent,calls,total_ms,mean_ms");
  std::getline(csv, line);
  REQUIRE(line == "lower,,2,3.750000,1.875000");
  std::getline(csv, line);
  REQUIRE(line == "codegen,lower,1,4.000000,4.000000");
  REQUIRE_FALSE(std::getline(csv, line));
  timer.clear();
  REQUIRE(timer.phases().empty());
}
