// Private: the graphs AOTAutograd traces, kept on disk for later processes.
#pragma once

#include <crucible/autograd/aot_request.h>
#include <crucible/ir/graph.h>

#include <functional>
#include <optional>
#include <string_view>
#include <vector>

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
// fewer times (once, on fake tensors, where Note [Fake fingerprints] hits
// too; three times without the caches).
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

// Note [Fake fingerprints]
// In real mode (TraceMode::Real; Auto runs in fake mode where it can and
// needs no fingerprint) the analysis that keys the trace cache runs the
// function on copies of its arguments: on a GPU, a whole training step with
// the process's first cuBLAS calls and allocations, most of a warm compile.
// Where the trace cache is on, the analysis first runs in fake mode, on meta
// tensors (tens of milliseconds), and its graph digest and metadata key a
// fingerprint entry that holds the real analysis's graph digest. On a hit
// that digest keys the trace cache as the real analysis would have, and the
// fake analysis's metadata and lifted tensors stand for the real one's. On a
// miss the real analysis runs, and the entry is written only when its
// metadata and lifted tensors are the fake one's, since a hit returns those.
// The graphs themselves may differ (fake mode takes a composite op's generic
// path where real mode takes the device's: dropout's fused CUDA kernel):
// the fingerprint stands for the function, not for its graph.
// What a hit assumes beyond Note [AOT trace cache]'s assumptions: a real
// trace follows what the fake one does, plus the arguments' devices (in the
// key) and the process-wide switches by which ATen's composite ops choose a
// device's kernel (cuDNN, MKLDNN, the attention backends, deterministic
// algorithms; in the key too). A cache directory shared by GPUs of other
// architectures may then give a graph that names a kernel the other GPU
// lacks, which fails when run; the backend's own entries are per device.
// A function fake mode cannot run (item() on a fake tensor) has no
// fingerprint and is analysed for real. Counted as fingerprint_hit,
// fingerprint_miss, fingerprint_differs (the two analyses disagreed: not
// stored) and fingerprint_bypass (no fingerprint or no usable directory).

/// The metadata analysis of a request (collect_metadata's own work),
/// filling `lifted` and `graph_hash` as collect_metadata does.
using MetadataAnalysis = std::function<ViewAndMutationMeta(const AotRequest&, std::vector<tracer::NamedTensor>* lifted,
                                                           std::optional<ir::GraphHash>* graph_hash)>;

/// `analyze(request, lifted, graph_hash)`, read through a fake-mode
/// fingerprint where the request traces in real mode with the trace cache on
/// and a graph digest is asked for (Note [Fake fingerprints]); otherwise
/// `analyze` itself. Exceptions of the real analysis propagate; the fake
/// one's only mean there is no fingerprint.
ViewAndMutationMeta fingerprinted_analysis(const AotRequest& request, std::vector<tracer::NamedTensor>* lifted,
                                           std::optional<ir::GraphHash>* graph_hash, const MetadataAnalysis& analyze);

}  // namespace crucible::autograd::detail
