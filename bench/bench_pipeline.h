// The per-stage pipeline benchmarks (bench_pipeline.cpp), listed for
// `crucible bench`, which runs them in-process.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace benchmark {
class State;
}

namespace crucible::bench {

/// One stage's benchmark body for one zoo model (by name).
using PipelineBenchFn = void (*)(benchmark::State& state, const std::string& model);

/// Stage name ("Trace", "Joint", "StepCompiled", ...) -> benchmark, in
/// pipeline order; each is registered as BM_Pipeline<stage>/<model> for
/// every model of models::model_names(), model by model.
const std::vector<std::pair<std::string, PipelineBenchFn>>& pipeline_stages();

}  // namespace crucible::bench
