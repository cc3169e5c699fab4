// The inductor backend's entry point: a graph to a CompiledFn whose fused
// pointwise loops run as generated C++/OpenMP and whose other nodes run as
// extern kernels (boxed ATen calls). Mirrors compile_fx_inner of
// torch/_inductor/compile_fx.py.
#pragma once

#include <crucible/inductor/options.h>
#include <crucible/ir/backend.h>

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
/// CPU tensors of f32/f64 (and i64/i32/bool where an op allows) are lowered
/// to the loop-level IR (Note [Lowering] in src/lowering.cpp): pointwise ops
/// with broadcasting and any strides, views folded into index expressions,
/// and the reductions sum, mean, amax, amin and var_mean; the scheduler
/// fuses them into kernels (Note [Fusion] in src/codegen.cpp: pointwise
/// chains, reductions with their prologues and epilogues, softmax and
/// layer-norm rows in one pass per row), rendered as C++/OpenMP. Everything
/// else (mm, convolution, random and mutating ops, anything unknown) runs as
/// an extern kernel through the dispatcher, in graph order around the
/// kernels that do not depend on it. A graph the plan cannot express (or a
/// lowering failure, reported with a c10 warning) runs on the interpreter. The CompiledFn keeps its own copy of the
/// graph and of the loaded library. Inputs whose strides or dtype differ from the graph's metadata are copied to the
/// expected layout first. `example_inputs` is unused (metadata come from the graph) and may be empty.
///
/// Throws InductorError when the cache directory is unusable, or when the C++
/// compiler fails (naming the generated source file and quoting the
/// compiler) unless options.fallback_to_eager is set, in which case the
/// interpreter runs the graph.
ir::CompiledFn compile_fx_inner(const ir::Graph& graph, const std::vector<at::Tensor>& example_inputs,
                                const InductorOptions& options = {});

/// The C++ translation unit compile_fx_inner generates for `graph` (empty
/// when nothing is fused): what `crucible compile --dump-dir` writes beside
/// a stage's graph.
std::string generate_cpp(const ir::Graph& graph);

/// The loop-level IR compile_fx_inner lowers `graph` to, as text: each
/// extern kernel, and each loop with the buffer it writes (sizes, strides),
/// its kind (pointwise over o < numel, or a reduction over o < kept × r <
/// reduced) and its body in loads and operations, in run order.
std::string loop_ir(const ir::Graph& graph);

}  // namespace crucible::inductor
