// A content hash of a graph, the key of compilation caches (the role
// torch/_inductor/codecache.py's FxGraphCache key and
// torch/_functorch/_aot_autograd/autograd_cache.py's AOTAutogradCache key
// give to the pickled GraphModule).
#pragma once

#include <crucible/ir/graph.h>

#include <cstdint>
#include <string>

namespace crucible::ir {

// Note [Graph hash]
// graph_hash digests what a backend can compute with, and nothing else:
//  - per node in graph order: its kind; a call's operator name
//    ("aten::add.Tensor") and arguments in schema order, constants in their
//    text-form value (dtypes, layouts, memory formats and devices as words,
//    floats by bit pattern, so 1 and 1.0, or 0.0 and -0.0, differ), Values
//    by position; a constant node's value (a tensor constant's metadata and
//    element bytes, little-endian); each result's type and TensorMeta
//    (sizes, strides, storage offset, dtype, device, requires_grad); its
//    tags (passes and backends act on them: "recomputable", "backward");
//  - the signature: each input's kind, target and duplicate_of, each
//    output's kind and input index.
// It leaves out Value names and node sources: they are labels (a graph
// with every Value renamed consistently computes the same thing, and the
// tracer's names depend on the order in which names were taken), so
// α-equivalent graphs hash alike. A Value is identified by the position of
// its result among all results, in graph order.
// The digest is XXH3-128 over a fixed, tagged, length-prefixed little-endian
// encoding of the above: no pointers, no std::hash, no dispatcher state, so
// it is the same in every process and on every machine for the same graph
// and xxHash ≥ 0.8 (whose XXH3 output is frozen). Its 128 bits make a
// collision between two graphs a cache meets practically impossible; a
// cache that keys on it therefore compares the digests, not the graphs.
// Changing the encoding changes every digest: tests/ir/test_hash.cpp pins
// one so that it is never changed by accident. (The pass manager's "did
// this pass change the graph" check is another fingerprint on purpose: a
// rename or a new source must count as a change there, and it must never
// throw.)

/// A 128-bit content digest of a graph.
struct GraphHash {
  uint64_t high = 0;  ///< XXH128's high64
  uint64_t low = 0;   ///< XXH128's low64

  bool operator==(const GraphHash&) const = default;
  /// 32 lowercase hex digits, `high` first (a file or cache-entry name).
  std::string hex() const;
};

/// What graph_hash digests beyond Note [Graph hash]'s defaults.
struct HashOptions {
  /// Whether devices count with their index (cuda:0 and cuda:1 differ), in
  /// TensorMeta and in device arguments. Off, only the device type counts:
  /// the ranks of a data-parallel step, each tracing on its own GPU, compare
  /// the computation they will run, not where (spmd::compile).
  bool device_index = true;
  /// Whether sizes count: tensors' sizes, strides and storage offsets, and
  /// the integers among call arguments (a view's sizes, a slice's end).
  /// Off, a tensor counts by its rank and an integer by its being one: the
  /// graphs one program traces at other batch sizes or sequence lengths
  /// hash alike, which is how the inductor recognizes them (Note [Dynamic
  /// sizes] in inductor/src/dynamic_sizes.cpp).
  bool sizes = true;
};

/// The digest of `graph` (Note [Graph hash]). Linear in the graph's size
/// plus its tensor constants' bytes (copied to the CPU first if they live
/// elsewhere). Throws IrError, naming the node, for what the text form
/// cannot hold either (complex or symbolic scalar constants, generators; see
/// printer.h) and for a signature that refers to a missing placeholder.
GraphHash graph_hash(const Graph& graph, const HashOptions& options = {});

}  // namespace crucible::ir
