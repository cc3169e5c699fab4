// The partitioner interface: a joint forward+backward graph to a forward and
// a backward graph (torch/_functorch/partitioners.py's contract).
#pragma once

#include <crucible/ir/graph.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace crucible::partitioner {

// Note [Joint graph contract]
// A joint graph computes `joint(primals, tangents) -> (outputs, input grads)`:
//  - placeholders: the primals (any InputKind but Tangent: user inputs,
//    parameters, buffers, state), then the tangents (InputKind::Tangent), one
//    per forward output that has a gradient. A primal after a tangent is an
//    error.
//  - outputs: the `num_fwd_outputs` forward outputs first (their OutputSpecs
//    say what they are: user outputs, the loss, mutated inputs), then the
//    input gradients, each with OutputKind::Gradient and `input_index` = the
//    placeholder index of the primal it is the gradient of.
//  - a primal whose gradient is None (it does not require grad, or the
//    outputs do not depend on it) has no gradient output at all: the graph
//    IR has no None value, so the caller maps gradients back to primals by
//    input_index, and treats primals with no Gradient output as None.
// No forward output may depend on a tangent.
//
// A partition of it is two graphs with this interface:
//  - forward(primals) -> (forward outputs..., saved tensors...): every primal
//    is a placeholder (unused ones too, so the calling convention does not
//    depend on the partition);
//  - backward(saved tensors..., tangents...) -> (gradients...): in the joint
//    graph's gradient order, with the same Gradient OutputSpecs (whose
//    input_index is the primal's, in the joint graph). Saved values are
//    placeholders with InputKind::SavedValue and `target` = the name of the
//    joint value they carry; every tangent is a placeholder (unused ones
//    too).

/// What a partition produced.
struct PartitionResult {
  ir::Graph forward;
  ir::Graph backward;
  /// Names (in the joint graph, kept in both parts) of the tensors the
  /// forward returns after its outputs and the backward takes first, in order.
  std::vector<std::string> saved_values;
  /// Non-tensor values of the forward part (sizes, scalars) the backward
  /// needs. They cannot cross a CompiledFn boundary (it passes tensors only),
  /// so the backward recomputes them; listed for inspection.
  std::vector<std::string> saved_symbols;
  size_t num_fwd_outputs = 0;
  /// Per backward output: the primal's placeholder index (in the joint and
  /// in the forward graph).
  std::vector<size_t> gradient_inputs;
};

/// A partitioner: the joint graph (see Note [Joint graph contract]) and the
/// number of its outputs that are forward outputs, to the two parts.
using PartitionFn = std::function<PartitionResult(const ir::Graph& joint, size_t num_fwd_outputs)>;

}  // namespace crucible::partitioner
