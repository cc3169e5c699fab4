// The inductor backend's entry point: a graph to a CompiledFn whose fused
// loops run as generated C++/OpenMP or CUDA kernels and whose other nodes
// run as extern kernels (boxed ATen calls). Mirrors compile_fx_inner of
// torch/_inductor/compile_fx.py.
#pragma once

#include <crucible/inductor/options.h>
#include <crucible/ir/backend.h>
#include <crucible/runtime/memory.h>

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace crucible::ir {
class Graph;
}

namespace crucible::inductor {

/// Compiles `graph` (ATen-level and functional, metadata on every tensor
/// Value) to a CompiledFn taking its placeholders in order.
///
/// Tensors of f32/f64 (and i64/i32/bool where an op allows) on one device
/// are lowered to the loop-level IR (Note [Lowering] in
/// src/lowering/lowering.cpp): the graph's CUDA device if it has a tensor
/// on one, else the CPU. Pointwise ops with broadcasting and any strides,
/// views folded into index expressions, and the reductions sum, mean, amax,
/// amin and var_mean; the scheduler fuses them into kernels (Note [Fusion]
/// in src/scheduler.cpp: pointwise chains, reductions with their prologues
/// and epilogues, softmax and layer-norm rows in one pass per row),
/// rendered as C++/OpenMP on the CPU, or as CUDA C++ compiled by NVRTC for
/// the device's architecture and launched on the current CUDA stream (Note
/// [CUDA rendering] in src/codegen/cuda.cpp). Everything else (mm, convolution, random and
/// mutating ops, tensors on another device, anything unknown) runs as an
/// extern kernel through the dispatcher, in graph order around the kernels
/// that do not depend on it. A graph the plan cannot express (or a
/// lowering failure, reported with a c10 warning) runs on the interpreter.
/// The CompiledFn keeps its own copy of the graph and of the loaded code.
/// Inputs whose strides or dtype differ from the graph's metadata are
/// copied to the expected layout first; outputs come back with the sizes,
/// strides and storage offsets of the graph's metadata (eager's), whatever
/// layouts the graph computes in (saved values, OutputKind::SavedValue, may
/// come back in another: Note [Eager's strides at the outputs] in
/// src/fx_passes/layout_opt.cpp). `example_inputs` is unused (metadata
/// come from the graph) and may be empty.
///
/// Throws InductorError when the cache directory is unusable, or when the
/// C++ compiler or NVRTC fails (naming the generated source file and
/// quoting the compiler), the CUDA driver cannot be loaded or this build
/// has no NVRTC — unless options.fallback_to_eager is set, in which case
/// the interpreter runs the graph.
ir::CompiledFn compile_fx_inner(const ir::Graph& graph, const std::vector<at::Tensor>& example_inputs,
                                const InductorOptions& options = {});

/// Why compile_fx_inner with InductorOptions::cuda_graphs would run `graph`
/// without capturing it as a CUDA graph (Note [CUDA graphs] in
/// src/runtime/cuda_graphs.cpp), as PyTorch's "skipping cudagraphs due to
/// ..." says: the graph runs on the CPU, an input or result is not a tensor
/// on the graph's GPU (e.g. a learning rate on the host), an op reads a
/// value back to the host (item, nonzero), or a collective (whose work c10d
/// tracks on the host) is in it. Empty when it can be captured.
/// Reads only the graph's metadata: needs no GPU. Throws nothing.
std::string cuda_graph_blocker(const ir::Graph& graph);

/// The translation unit compile_fx_inner generates for a graph.
struct GeneratedCode {
  std::string source;  // empty when nothing is fused
  bool cuda = false;   // CUDA C++ (for NVRTC), else C++
};

/// The code compile_fx_inner generates for `graph`: what `crucible compile
/// --dump-dir` writes beside a stage's graph (kernels.cpp or kernels.cu).
/// Needs no GPU and no compiler.
GeneratedCode generate_code(const ir::Graph& graph);

/// The cubins NVRTC makes of `graph`'s CUDA code for `arch` (e.g.
/// "sm_90"), one per translation unit (a large graph's kernels are split
/// into units compiled side by side: Note [Parallel NVRTC] in
/// src/codecache/cuda_builder.cpp), through the cache of `options`; empty when
/// `graph` generates no CUDA code. Runs without a GPU: the check that
/// every generated kernel compiles. Throws InductorError as
/// compile_fx_inner does for NVRTC.
std::vector<std::string> compile_cuda(const ir::Graph& graph, const std::string& arch,
                                      const InductorOptions& options = {});

/// What one call of the CompiledFn compile_fx_inner makes of `graph` with
/// `options` holds in memory beyond its inputs, by its run-time plan
/// (runtime::PlannedMemory, Note [Planned memory] in
/// src/runtime/memory_plan.cpp): the peak, where it comes, the outputs.
/// Needs no GPU and no compiler: nothing runs. Without CUDA graphs; with
/// them, the graph's private pool holds about the peak. Throws
/// InductorError for a graph without an output node or one the plan cannot
/// express, and what lowering throws.
runtime::PlannedMemory plan_memory(const ir::Graph& graph, const InductorOptions& options = {});

/// One call's time in ms by the roofline model, step by step over the
/// schedule compile_fx_inner makes of `graph` (Note [Roofline estimate] in
/// src/compile_fx.cpp): for comparing two graphs of one computation, such
/// as a step before and after rematerialization, rather than for
/// predicting either's time. Needs no GPU and no compiler. Throws what
/// lowering throws.
double estimated_ms(const ir::Graph& graph, const InductorOptions& options = {});

/// The loop-level IR compile_fx_inner lowers `graph` to, as text: each
/// extern kernel, and each loop with the buffer it writes (sizes, strides),
/// its kind (pointwise over o < numel, or a reduction over o < kept × r <
/// reduced) and its body in loads and operations, in run order.
std::string loop_ir(const ir::Graph& graph);

}  // namespace crucible::inductor
