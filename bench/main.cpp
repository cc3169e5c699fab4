// The one main() of crucible_bench; benchmarks register themselves from their sources.
#include <benchmark/benchmark.h>

BENCHMARK_MAIN();
