// Classes of operators that passes tell apart, in one table that every
// library reads instead of listing ops of its own: inductor's lowering and
// CUDA graphs, the min-cut partitioner, the tracer (Note [Op classes] in
// ir/src/op_classes.cpp). PyTorch keeps the same facts in torch.Tag,
// torch/_inductor/ops_handler.py and torch/_functorch/partitioners.py's
// op lists. What a node's schema says (a view by its alias annotations, a
// pointwise op or a random one by its tags) is read from the schema, not
// listed here.
#pragma once

#include <string_view>

namespace crucible::ir {

/// A class of operators. A class lists whole operators (every overload of
/// each: "aten::sum" is sum, sum.dim_IntList, ...) or single overloads
/// ("aten::squeeze.dim"; "aten::squeeze" is then the overload without a
/// name); each says which.
enum class OpClass {
  /// Views whose elements are a fixed map of their base's: reshapes,
  /// permutations, expansions, slices, selections, splits and aliases
  /// (view, _unsafe_view, reshape, expand, permute, transpose.int, t,
  /// unsqueeze, squeeze, squeeze.dim, squeeze.dims, slice.Tensor,
  /// select.int, split.Tensor, split_with_sizes, unbind.int, alias, detach,
  /// lift_fresh; these overloads only). What inductor folds into index
  /// expressions; other views (as_strided, view.dtype, diagonal, ...) are
  /// not in it.
  IndexView,
  /// The IndexViews that keep their base's elements in row-major order:
  /// view, _unsafe_view, reshape and unsqueeze (these overloads only). A
  /// sequence that counts (an arange) still counts seen through one.
  RowMajorView,
  /// Matmuls, convolutions and attention (every overload): many FLOPs per
  /// byte of result, so a partitioner saves them rather than recompute.
  ComputeIntensive,
  /// Besides pointwise ops and views, what costs about its bytes to
  /// recompute (every overload): reductions, cat, copies and casts,
  /// factories and fills, and functionalized RNG's philox_rand draws (a
  /// pure function of the seed and offset).
  CheapToRecompute,
  /// Ops that read a tensor's value back to the host, or size their result
  /// by it (item, nonzero, unique, equal, ...; these overloads only): a
  /// CUDA graph cannot capture them.
  HostSync,
  /// In-place ops that write all of their first argument without reading
  /// it (every overload): fill_, zero_, copy_ and the random fills
  /// (normal_, uniform_, random_, bernoulli_, ...).
  OverwritesSelf,
};

/// Whether the operator `target` ("ns::name.overload", or "ns::name" for
/// the overload without a name, as Node::target() spells it) is of class
/// `c`. For a class of whole operators the overload may be left out (a
/// schema's name()). False for a name no class lists.
bool is_op_class(std::string_view target, OpClass c);

}  // namespace crucible::ir
