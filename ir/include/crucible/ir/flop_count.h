// The floating-point operations a graph performs in its matmuls,
// convolutions and attention kernels, from its values' metadata: what
// torch.utils.flop_counter's FlopCounterMode counts, for the bench's
// TFLOPS and MFU (model FLOPs utilization).
#pragma once

#include <crucible/ir/graph.h>

#include <cstdint>
#include <map>
#include <string>

namespace crucible::ir {

/// FLOPs per op (its target, "aten::mm") and in all, one multiply-add
/// counting 2. Counted: mm, addmm, bmm, baddbmm, convolution and its
/// backward, and the fused attention kernels (flash, memory-efficient,
/// cuDNN, CPU flash) forward and backward, as torch/utils/flop_counter.py
/// counts them (no discount for causal masks, no recomputation). Other ops
/// (elementwise, reductions, normalizations) count nothing: the figure is
/// the work a GPU's tensor cores do, which MFU is measured against.
struct FlopCount {
  int64_t total = 0;
  std::map<std::string, int64_t> by_op;
};

/// The FLOPs of one node (0 for a node of another op, or without the
/// metadata its formula reads). Throws nothing.
int64_t count_flops(const Node& node);

/// Counts `graph`'s call nodes (a node without metadata on what the
/// formula reads counts nothing). Every node counts once: a graph run once
/// per step (a compiled training step) gives a step's FLOPs.
FlopCount count_flops(const Graph& graph);

}  // namespace crucible::ir
