// Channels-last convolutions on a GPU: Note [Channels-last convolutions] in
// layout_opt.cpp.
#pragma once

namespace crucible::ir {
class Graph;
}

namespace crucible::inductor::detail {

/// In a graph whose loops run on a GPU and that has 2-D convolutions, copies
/// every 4-D operand of a convolution (and convolution_backward) that is not
/// channels-last to channels-last first, so that cuDNN runs its NHWC kernels
/// and the layout carries through the graph (Note [Channels-last
/// convolutions]). The graph computes the same values. Leaves the graph as
/// it was when its metadata cannot be derived.
void channels_last_convolutions(ir::Graph& graph);

}  // namespace crucible::inductor::detail
