// CUDA graphs around a compiled graph: Note [CUDA graphs] in
// runtime/cuda_graphs.cpp.
#pragma once

#include <crucible/ir/backend.h>

#include <c10/core/Device.h>

#include <string>

namespace crucible::ir {
class Graph;
}

namespace crucible::inductor::detail {

/// Why calls of `graph` on `device` cannot be captured as a CUDA graph (an
/// input or a result that is not a tensor on `device`, an op that reads a
/// value back to the host), or empty when they can. Reads only the graph's
/// metadata: runs without a GPU.
std::string cuda_graph_blocker(const ir::Graph& graph, c10::Device device);

/// `fn` (the compiled `graph`, on CUDA `device`) behind a CUDA graph: the
/// first call runs `fn`, the second captures it and every later call replays
/// the capture (Note [CUDA graphs]). Throws InductorError when this LibTorch
/// has no CUDA.
ir::CompiledFn cudagraphify(ir::CompiledFn fn, const ir::Graph& graph, c10::Device device);

/// The CUDA-graph policy of compile_fx_inner and load_compiled: `fn` (the
/// compiled `graph`, on `device`) behind cudagraphify where `cuda_graphs`
/// is asked for and the graph can be captured; as it is otherwise, with a
/// warning that says why where it was asked for (cuda_graph_blocker, or
/// `profile`: profiling times each step apart).
ir::CompiledFn with_cuda_graphs(ir::CompiledFn fn, const ir::Graph& graph, c10::Device device, bool cuda_graphs,
                                bool profile);

}  // namespace crucible::inductor::detail
