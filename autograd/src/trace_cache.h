// Private: the graphs AOTAutograd traces, kept on disk for later processes.
#pragma once

#include <crucible/autograd/aot_request.h>
#include <crucible/ir/graph.h>

#include <functional>
#include <string_view>

namespace crucible::autograd::detail {

// Note [AOT trace cache]
// A warm compile (a new process, the backend's disk caches full) spends its
// time tracing: the metadata analysis runs the function once, and the
// inference or joint trace runs it again to record the graph the backend
// compiles. torch's AOTAutogradCache skips the second part, keyed on the
// graph Dynamo captured; a C++ function has no bytecode to key on, so the
// graph the metadata analysis traced stands in for Dynamo's (its
// ir::graph_hash, AotRequest::analysis_hash). The key also holds:
//  - the code the process started with (runtime::startup_code_identity:
//    the build IDs of the program and its libraries, Crucible's and
//    LibTorch's among them), so a rebuilt tracer, decomposition or user
//    function never meets an entry of another build;
//  - the compilation's options that shape the trace: compiler_key (the
//    backend and its passes, which also names any wrapper of the user's),
//    trace mode, the decomposed ops, freezing, num_params_buffers,
//    keep_inference_input_mutations, functionalized RNG, the wrappers;
//  - the metadata after the wrappers (ViewAndMutationMeta::to_string),
//    the arguments' metadata, which arguments share storage, the lifted
//    tensors' names, and which trace (inference or joint).
// An entry holds the traced graph in the text form (lossless, printer.h),
// behind a header with its key and a digest of the text: a truncated or
// corrupt entry, or one whose graph does not take the compilation's inputs,
// is a miss, traced again and overwritten. Entries are written atomically
// (runtime::write_atomically), so processes compiling at once each write a
// whole one. What a hit assumes, as every trace cache does: the function is
// a deterministic function of what the key holds. A function whose second
// call records other ops than its first for reasons outside its tensors and
// the code (a clock, the environment, a file) must not share a cache
// directory; nor may one that counts its own calls, since a hit calls it
// once instead of twice.
// Counted as torch counts its own (counters["aot_autograd"]):
// trace_cache_hit, trace_cache_miss, and trace_cache_bypass when an entry
// cannot be keyed or written (a graph constant the text form cannot hold).

/// The graph `trace` makes for `request` (`kind`: "inference" or "joint"),
/// read from the trace cache when request.config.disk_cache_dir and its
/// compiler_key allow (Note [AOT trace cache]), else traced and stored.
/// `num_inputs`: the placeholders it must have. On a hit the instruments
/// see stage `stage` with graph `graph_name`, cached; `trace` reports its
/// own stage. Exceptions of `trace` propagate; the cache's own failures
/// (an unusable directory, a full disk) are warned of once.
ir::Graph traced_graph(const AotRequest& request, std::string_view kind, std::string_view stage,
                       std::string_view graph_name, size_t num_inputs, const std::function<ir::Graph()>& trace);

}  // namespace crucible::autograd::detail
