// Attention written out -> aten::scaled_dot_product_attention.
//
// The C++ counterpart of torch/_inductor/fx_passes/fuse_attention.py. A
// transformer that computes attention from its parts (nanoGPT's
// `softmax(masked_fill(q @ k^T * scale, mask == 0, -inf)) @ v`, LibTorch's
// own MultiheadAttention) materializes the [B, H, T, S] scores, reads and
// writes them in the softmax, and saves the probabilities for the backward:
// at GPT-2 small's size 400 MB a layer in float32. The fused kernels behind
// scaled_dot_product_attention (flash attention on CPUs, memory-efficient
// or flash attention on CUDA) keep the scores on chip and save only the
// rows' log-sum-exp; their backward recomputes the scores.
//
// The rewrite runs on a forward graph before differentiation (a pre-grad
// pass: Note [Pre-grad graphs] in pipeline/builder.cpp), where the
// attention's parts have no backward readers yet; differentiating the
// rewritten graph then records the fused op's own backward.
#pragma once

#include <crucible/ir/graph.h>
#include <crucible/ir/pattern_matcher.h>

#include <cstddef>
#include <vector>

namespace crucible::ir {

/// The rewrites fuse_attention applies. With q [B, H, T, E], k [B, H, S, E]
/// and v [B, H, S, Ev] (4-D, one floating dtype and device, no broadcasting
/// between them) and at::matmul's batched products as the tracer records
/// them (operands expanded and flattened to 3-D by a view, _reshape_alias
/// or a contiguous copy, bmm, an _unsafe_view back to 4-D), each pattern
///   matmul(softmax(mask(scale(matmul(q, k.transpose(-2, -1)))), -1), v)
/// where scale(x) is `x * s` (mul.Scalar), `x / d` (div.Scalar) or x, and
/// mask(x) is `x.masked_fill(cond, -inf)` (cond boolean), `x + bias`
/// (bias of q's dtype) or x, the mask broadcasting to [B, H, T, S] (for q
/// of bf16 or f16, the softmax may run on the scores cast to float32, the
/// probabilities cast back: what CUDA autocast records), becomes
///   scaled_dot_product_attention(q', k, v, attn_mask, 0.0, false, scale)
/// copied to a contiguous [B, H, T, Ev], with attn_mask = logical_not(cond)
/// or bias, and q' = q / d (scale 1) for a division. Where every key of a
/// query is masked, the written-out form gives NaN (the softmax of -inf's)
/// and the fused kernels 0: q' fills such query rows with NaN, so the
/// results stay NaN there as eager's, and the backward's NaN reaches v's
/// gradient (so the parameters) as eager's does.
/// Dropout on the probabilities is left as it is (its random draws would
/// change), and so are masks filled with finite values.
std::vector<Rewrite> attention_rewrites();

/// Applies attention_rewrites() (apply_rewrites in pattern_matcher.h);
/// returns the number of attentions fused. Not bitwise: the fused kernels
/// sum the products and the softmax in another order (float32: about 1e-6
/// relative).
size_t fuse_attention(Graph& graph);

/// fuse_attention where q is bf16 or f16 (under autocast, say), where a GPU
/// runs flash or cuDNN attention; in float32 it runs the memory-efficient
/// kernel, slower than the matmuls and the fused softmax it would replace
/// (GPT-2 small on an H200: 49.1 to 69.3 ms a step).
size_t fuse_reduced_precision_attention(Graph& graph);

/// fuse_attention where the fused op runs a flash kernel: q in bf16 or f16
/// (as fuse_reduced_precision_attention), or q on a CPU in any floating
/// dtype, where ATen's flash attention for CPUs takes float32 and float64
/// too (GPT-2 small at batch 1 in float32 on a 2-core CPU: a peak RSS of
/// 2.9 GiB against 3.3, at the same speed). The inductor backends' default
/// pre-grad pass (runtime::BackendInfo::pre_grad_passes).
size_t fuse_flash_attention(Graph& graph);

}  // namespace crucible::ir
