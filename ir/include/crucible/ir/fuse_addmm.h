// mm + add -> addmm.
//
// A Linear traces as a matrix product and a separate bias add whenever
// LibTorch's linear does not take its fused path (input of other than 2 or 3
// dimensions, not contiguous, or the autograd/functionalization path of a
// training trace), and at::matmul on 3-D input adds a view around the
// product: `view -> mm -> _unsafe_view -> add`. The add is one more kernel
// and one more pass over the output; addmm adds the bias inside the GEMM
// (BLAS's beta * C), as LibTorch's fused linear path emits it (`view ->
// addmm -> view`, aten/src/ATen/native/Linear.cpp). For graphs that run ATen
// kernels one by one this is the better form; inductor, which generates the
// pointwise code itself, goes the other way where the add can join a fused
// kernel (unfuse_bias_add_to_pointwise in torch/_inductor/fx_passes/post_grad.py).
#pragma once

#include <crucible/ir/graph.h>
#include <crucible/ir/pattern_matcher.h>

#include <cstddef>
#include <vector>

namespace crucible::ir {

/// The rewrites fuse_addmm applies (for callers that combine pattern tables):
///   add.Tensor(mm(a, b), bias, alpha)  -> addmm(bias, a, b, beta=alpha, alpha=1)
///   add.Tensor(bias, mm(a, b), alpha)  -> addmm(bias, a, b, beta=1, alpha=alpha)
/// and the same through a view of the product, for v in {_unsafe_view, view}:
///   add.Tensor(v(mm(a, b), size), bias, alpha) -> v(addmm(bias, a, b, beta=alpha, alpha=1), size)
///   add.Tensor(bias, v(mm(a, b), size), alpha) -> v(addmm(bias, a, b, beta=1, alpha=alpha), size)
/// and add_.Tensor in place of add.Tensor with the product first (what
/// LibTorch's linear does outside its fused path: `output.add_(bias)` on the
/// product it has just made; see apply_rewrites for in-place roots).
/// Each applies only where addmm computes what the add did: bias of the
/// product's dtype and device, broadcasting to the product [M, N] (at most 2
/// dimensions, each 1 or the product's) — through a view, at most 1
/// dimension and the view's last size N, so the bias meets the same columns.
std::vector<Rewrite> addmm_rewrites();

/// Applies addmm_rewrites() (apply_rewrites in pattern_matcher.h); returns
/// the number of adds fused. Not bitwise: BLAS adds the bias inside the
/// product's accumulation, so the result may differ from mm then add in the
/// last bits (float32: about 1e-6 relative).
size_t fuse_addmm(Graph& graph);

}  // namespace crucible::ir
