// The graph verifier: the invariants every stage may assume of a Graph, and
// that the pass manager checks between passes (MLIR's verifier, FX's
// Graph.lint).
#pragma once

#include <crucible/ir/graph.h>

namespace crucible::ir {

/// Checks that `graph` is well formed and throws IrError naming the first
/// node at fault (and what to fix) if it is not:
///  * structure: placeholders first, then constants and calls, exactly one
///    output node, last; placeholders and constants have one result;
///  * order: every Value a node reads is defined earlier in this graph;
///  * use lists: each Value's users() lists exactly the nodes that read it,
///    once per mention;
///  * schema: a call has one argument per schema argument, each of the kind
///    the schema type takes (Tensor: a tensor Value; Tensor?: a tensor Value
///    or None; Tensor[] / Tensor?[]: a list of Values (None only in Tensor?[]);
///    int, float, bool, Scalar, int[], ScalarType, ...: a constant of that
///    type or a Value of that type), and one result per schema return of the
///    return's type, with at least one for a Tensor[] return;
///  * metadata: every tensor Value has TensorMeta, except an unread result of
///    a call whose other results have it (an output a backward op was told
///    not to compute, e.g. by convolution_backward's output_mask, which the
///    tracer leaves without metadata and the text form prints as `Tensor`);
///  * signature: one InputSpec per placeholder and one OutputSpec per output;
///    input_index present for gradients and mutated inputs and in range
///    (a backward graph's gradients name the forward's inputs: OutputSpec);
///    duplicate_of names an earlier placeholder;
///  * names: Value names are unique and Graph::find_value finds each Value.
void verify(const Graph& graph);

struct VerifyOptions {
  /// Also check the metadata against the ops: re-derive every call result's
  /// TensorMeta from the placeholders' and constants' as propagate_meta
  /// does (propagate_meta.h; it runs every call on meta tensors, so it costs
  /// a dispatcher call per node) and throw IrError at the first result, in
  /// graph order, whose recorded metadata is not meta_equivalent to the
  /// derived one (sizes, strides where they matter, storage offset, dtype,
  /// device), naming the node, its op and both metadata. An unread result
  /// without metadata (see above) is not compared. The IrError of
  /// propagate_meta is thrown when the graph cannot be run on meta tensors.
  bool check_meta = false;
};

/// verify(graph), then the checks `options` adds.
void verify(const Graph& graph, const VerifyOptions& options);

}  // namespace crucible::ir
