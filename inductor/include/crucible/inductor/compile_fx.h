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
/// Pointwise nodes of the lowering table (Note [Pointwise lowering]) whose
/// operands are contiguous, of one floating dtype (f32 or f64) and either of
/// the result's size or 0-dim, are grouped into fused loops; the rest (mm,
/// convolution, reductions, views, random and mutating ops, anything
/// unknown) run as extern kernels in graph order, so side effects keep their
/// order. A graph the plan cannot express runs on the interpreter. The
/// CompiledFn keeps its own copy of the graph and of the loaded library.
/// `example_inputs` is unused (metadata come from the graph) and may be empty.
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

}  // namespace crucible::inductor
