// Padding of matmuls whose sizes slow cuBLAS down: Note [Padding matmuls]
// in pad_mm.cpp.
#pragma once

namespace crucible::ir {
class Graph;
}

namespace crucible::inductor::detail {

/// Rewrites, in a graph whose loops run on a GPU, each large aten::mm with a
/// dimension that is not a multiple of the tensor cores' alignment into an
/// mm of zero-padded operands sliced back to its sizes (Note [Padding
/// matmuls]). Leaves CPU graphs and matmuls the graph returns as they are.
/// Throws ir::IrError only if LibTorch's meta kernels reject a padded shape.
void pad_mm(ir::Graph& graph);

}  // namespace crucible::inductor::detail
