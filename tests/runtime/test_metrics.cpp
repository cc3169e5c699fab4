// MetricsLog: a bounded deque of compilation records.
#include <crucible/runtime/metrics.h>

#include "catch.h"

using crucible::runtime::CompilationMetrics;
using crucible::runtime::MetricsLog;

namespace {

CompilationMetrics record_with_id(std::string id) {
  CompilationMetrics m;
  m.compile_id = std::move(id);
  m.kind = "forward";
  return m;
}

std::vector<std::string> ids(const MetricsLog& log) {
  std::vector<std::string> out;
  for (const auto& m : log.records()) out.push_back(m.compile_id);
  return out;
}

}  // namespace

TEST_CASE("MetricsLog keeps the newest records up to its capacity", "[runtime][metrics]") {
  MetricsLog log(3);
  for (int i = 0; i < 5; ++i) log.record(record_with_id(std::to_string(i)));
  REQUIRE(log.size() == 3);
  REQUIRE(ids(log) == std::vector<std::string>{"2", "3", "4"});
  log.set_capacity(2);
  REQUIRE(ids(log) == std::vector<std::string>{"3", "4"});
  log.set_capacity(4);
  log.record(record_with_id("5"));
  REQUIRE(ids(log) == std::vector<std::string>{"3", "4", "5"});
  log.clear();
  REQUIRE(log.size() == 0);
  log.set_capacity(0);
  log.record(record_with_id("6"));
  REQUIRE(log.size() == 0);
}
