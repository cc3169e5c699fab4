// `crucible bench` runs the per-stage benchmarks of the crucible_bench
// binary (built where Google Benchmark is found).
#include "catch.h"
#include "cli.h"

using crucible::testing::run_cli;

TEST_CASE("crucible bench lists and runs the per-stage benchmarks", "[tools][bench]") {
  const auto list = run_cli("bench --list --model mlp,gpt --stage Trace,StepCompiled");
  INFO(list.err);
  REQUIRE(list.exit_code == 0);
  CHECK(list.out ==
        "BM_PipelineTrace/mlp\nBM_PipelineStepCompiled/mlp\nBM_PipelineTrace/gpt\n"
        "BM_PipelineStepCompiled/gpt\n");
  const auto run = run_cli("bench --model mlp --stage Partition -- --benchmark_min_time=0.01");
  INFO(run.err);
  REQUIRE(run.exit_code == 0);
  CHECK_THAT(run.out, CRUCIBLE_HAS_SUBSTR("BM_PipelinePartition/mlp"));
}
