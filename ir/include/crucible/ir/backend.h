// The backend contract every compiler stage speaks (see DESIGN.md,
// "Contracts between stages").
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace crucible::ir {

class Graph;

/// A compiled graph: takes the graph's placeholders in order (it may steal
/// and clear the vector, as AOTAutograd's boxed calling convention does) and
/// returns the graph's outputs in order.
using CompiledFn = std::function<std::vector<at::Tensor>(std::vector<at::Tensor>& inputs)>;

/// A compiler: a graph plus example inputs (one per placeholder, of its meta)
/// to a CompiledFn. The interpreter, inductor::cpp and inductor::cuda are
/// backends; so is any user function of this type.
using Backend = std::function<CompiledFn(const Graph& graph, const std::vector<at::Tensor>& example_inputs)>;

}  // namespace crucible::ir
