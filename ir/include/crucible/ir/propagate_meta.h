// Metadata propagation.
//
// TensorMeta comes from the trace, and a pass that adds or rewrites nodes
// would otherwise have to work out its new values' sizes, strides and dtypes
// by hand, for every op it emits. This pass recomputes all of it from the
// placeholders by running the graph on meta tensors, so any rewrite can be
// followed by it, and later stages (lowering, memory planning) can trust the
// metadata they read. Mirrors inductor's fake_tensor_prop
// (torch/_inductor/compile_fx.py) over torch.fx.passes.fake_tensor_prop's
// FakeTensorProp.
#pragma once

#include <crucible/ir/graph.h>

#include <cstddef>

namespace crucible::ir {

/// Recomputes the TensorMeta of every call result from its inputs: runs the
/// graph in order on meta tensors made from the placeholders' and tensor
/// constants' metadata (which stay as they are), each call on its Meta
/// kernel, or, where LibTorch has none, on zero-filled CPU stand-ins (see
/// Note [CPU stand-ins] in meta_call.cpp, and Note [Deriving metadata] in
/// meta_run.cpp for views, in-place ops and devices). Sizes, strides, storage offset, dtype and device are replaced;
/// requires_grad is kept (false for a result that had no metadata). A result
/// the op leaves undefined (a gradient a backward op was told not to
/// compute) loses its metadata. Returns the number of tensor results whose
/// metadata changed (by TensorMeta's ==).
/// Throws IrError naming the call whose op rejects the metadata it gets (a
/// graph whose shapes do not fit together), or that cannot run without
/// real data or a process group (a collective without a Meta kernel), and a
/// placeholder without metadata; the graph is unchanged then.
size_t propagate_meta(Graph& graph);

/// Sets the TensorMeta of `node`'s tensor results from its inputs' recorded
/// metadata, each input a meta tensor of its own, as propagate_meta derives
/// it: for nodes a rewrite has just added (no input of a call that writes
/// its inputs may alias another then). requires_grad as propagate_meta.
/// Throws IrError if `node` is not a call, if an input has no metadata (a
/// non-tensor Value other than a constant node's), or if the op rejects it.
void infer_meta(Node& node);

}  // namespace crucible::ir
