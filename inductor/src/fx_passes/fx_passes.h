// The graph rewrites compile_fx_inner applies to its copy of a graph before
// lowering (torch/_inductor's post-grad passes). The matmul and layout
// rewrites leave a graph whose loops run on the CPU as it is (unless
// forced); every rewrite keeps every value the caller sees, with its
// strides.
#pragma once

namespace crucible::ir {
class Graph;
}

namespace crucible::inductor::detail {

/// Rewrites each large aten::mm with a dimension that is not a multiple of
/// the tensor cores' alignment into an mm of zero-padded operands sliced
/// back to its sizes (Note [Padding matmuls] in fx_passes/pad_mm.cpp). Leaves matmuls
/// the graph returns, or returns a view of, as they are. Throws ir::IrError only if LibTorch's meta
/// kernels reject a padded shape.
void pad_mm(ir::Graph& graph);

/// In a graph with 2-D convolutions whose loops run on a GPU (or any, with
/// `force`: InductorOptions::force_layout_optimization), copies every 4-D
/// operand of a convolution (and convolution_backward) that is not
/// channels-last to channels-last first, so that cuDNN runs its NHWC kernels
/// and the layout carries through the graph (Note [Channels-last
/// convolutions] in fx_passes/layout_opt.cpp); every output but a saved value keeps
/// its sizes, strides and storage offset (Note [Eager's strides at the
/// outputs]). Leaves the graph as it was when its metadata cannot be derived
/// again or an output cannot keep its layout; counts the graphs it rewrote
/// (runtime::default_counters(), "inductor" / "channels_last_rewrites").
/// Throws nothing.
void channels_last_convolutions(ir::Graph& graph, bool force);

/// Keeps max_pool2d_with_indices's indices as int32 from the forward to
/// the backward of a training step's graph, widened again before
/// max_pool2d_with_indices_backward reads them (Note [Narrow max-pool
/// indices] in fx_passes/max_pool_indices.cpp), where only backward nodes
/// read them and an input plane has fewer than 2^31 elements. Throws
/// nothing.
void narrow_max_pool_indices(ir::Graph& graph);

}  // namespace crucible::inductor::detail
