// A language model's loss without its logits: the linear head and the
// cross-entropy fused and computed in chunks of rows, forward and backward
// (Liger Kernel's fused linear cross-entropy), so that neither the [N, V]
// logits nor their gradient is ever whole in memory.
#pragma once

#include <crucible/ir/graph.h>

#include <cstddef>

namespace crucible::ir {

/// Rewrites, before differentiation (a pre-grad pass), the mean
/// cross-entropy of a linear head's logits,
///   nll_loss_forward(_log_softmax(V(mm(x, t(W))), 1), target, None, mean, ignore)
/// where V is a chain of view, _unsafe_view or reshape to [N, vocab] and,
/// under autocast, a _to_copy to float32 (addmm with a bias also matches,
/// and t(W) cast to bf16 or f16 where autocast casts the matmul's operands),
/// into crucible::linear_cross_entropy(x, W, bias, target, ignore), when
/// nothing else reads the logits and the loss reads float32. The
/// log-softmax may also run in bf16 or f16 and be cast to float32 after
/// (CUDA autocast's cross_entropy: it names the logits' dtype); the fused
/// op then computes it in float32, where eager rounds the log-probabilities
/// to the lower precision first (a loss closer to float32's than eager's).
/// crucible::linear_cross_entropy(Tensor input [N, C], Tensor weight [V, C],
/// Tensor? bias [V], Tensor target [N] (int64), int ignore_index) -> Tensor
/// [] float32 is the mean over the targets not ignored of
/// -log_softmax(input @ weight^T + bias, float32)[target], as eager's
/// cross_entropy (NaN when every target is ignored); its autograd formula
/// takes the gradients its forward computed chunk by chunk
/// (crucible::linear_cross_entropy_forward -> loss, grad_input,
/// grad_weight, grad_bias). Returns the number of rewrites.
size_t fuse_linear_cross_entropy(Graph& graph);

}  // namespace crucible::ir
