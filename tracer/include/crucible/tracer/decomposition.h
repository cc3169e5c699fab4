// Decomposition tables: ops rewritten into other ATen ops while tracing, as
// make_fx's `decomposition_table` does (torch/fx/experimental/proxy_tensor.py).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace crucible::tracer {

/// A decomposition, in the dispatcher's boxed convention: on entry `stack`
/// holds exactly the op's arguments in schema order; on return it must hold
/// exactly the op's results in schema order. It computes them with ordinary
/// ATen calls (at::add, at::_foreach_mul, Tensor::copy_ ...), which the tracer
/// records in place of the decomposed op. It runs below autograd.
using Decomposition = std::function<void(const c10::OperatorHandle& op, std::vector<c10::IValue>& stack)>;

/// Op schema name with overload ("aten::_foreach_add_.List") → decomposition.
/// make_fx throws TraceError for a name the dispatcher does not know.
using DecompositionTable = std::unordered_map<std::string, Decomposition>;

/// The table torch.distributed._spmd compiles train steps with
/// (SPMD_DECOMP_TABLE in torch/distributed/_spmd/api.py): in-place
/// `_foreach_*_` ops and `_fused_adam_` become their functional variants
/// followed by `copy_` into the mutated inputs, so the update reads as plain
/// functional math plus explicit write-backs; `native_layer_norm_backward`
/// becomes pointwise ops and reductions (torch._decomp's formula). Only ops
/// this LibTorch registers are included. Extend it with your own entries:
/// `auto t = spmd_decomposition_table(); t["aten::foo"] = ...;`.
DecompositionTable spmd_decomposition_table();

/// Fused ATen ops rewritten into the pointwise ops and reductions they
/// compute, so that a code generator fuses them with their neighbours (the
/// part of torch._decomp's core_aten_decompositions, and of inductor's
/// select_decomp_table, that the zoo's graphs reach): _softmax, _log_softmax
/// and their backwards, gelu and gelu_backward (exact and tanh), silu and
/// its backward, threshold_backward (relu's backward), addcmul, addcdiv,
/// mse_loss and its backward, the native_layer_norm forward and backward,
/// native_batch_norm (and its functional variant, what a training step
/// records) and its backward, embedding_dense_backward, nll_loss_forward
/// and nll_loss_backward (cross_entropy is log_softmax then nll_loss).
/// cuDNN's batch norm (CUDA, float and half), its functional variant and
/// its backward too; on a GPU a batch norm's statistics and its backward's
/// sums are ATen's one-pass CUDA kernels (batch_norm_stats,
/// batch_norm_backward_reduce), the rest generated math (Note [Batch norm
/// on cuDNN] in decomposition.cpp). Values agree with the fused kernels up to the
/// order of floating-point sums, not bitwise (Note [Core ATen decompositions] in decomposition.cpp): use it for a
/// fusing backend, not where bitwise equality with eager is wanted. Give it to Builder::decompositions or
/// TraceOptions::decompositions; extend it as spmd_decomposition_table.
DecompositionTable core_aten_decompositions();

}  // namespace crucible::tracer
