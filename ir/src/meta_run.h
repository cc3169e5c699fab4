// Running a graph, or one call, on meta tensors: the metadata every result
// gets from its inputs. propagate_meta writes it into the graph; the
// verifier's meta check compares it with what is recorded.
#pragma once

#include <crucible/ir/graph.h>

#include <functional>
#include <optional>
#include <vector>

namespace crucible::ir::detail {

/// One entry per result of a call: the metadata the op gives it, nullopt for
/// a non-tensor result or an undefined tensor (an output a backward op was
/// told not to compute). requires_grad is always false.
using DerivedMetas = std::vector<std::optional<TensorMeta>>;

/// Runs `graph` on meta tensors made from the recorded metadata of its
/// placeholders and tensor constants, each call through call_on_meta
/// (meta_call.h) in graph order, as the interpreter runs it on real tensors
/// (views share storage, in-place ops change their inputs). After each call
/// it hands the call and what its results got to `visit`, and stops when
/// `visit` returns false. See Note [Deriving metadata] for devices. Throws
/// IrError naming the call whose op rejects its meta inputs, or a
/// placeholder without metadata.
void run_on_meta(const Graph& graph, const std::function<bool(const Node&, const DerivedMetas&)>& visit);

/// What `node`'s results get from its inputs' recorded metadata, each input
/// a meta tensor of its own (so for calls that write no input: a rewrite's
/// new nodes). Throws as run_on_meta.
DerivedMetas derive_meta(const Node& node);

}  // namespace crucible::ir::detail
