#include <crucible/ir/error.h>
#include <crucible/ir/propagate_meta.h>

#include "meta_run.h"

#include <optional>
#include <vector>

namespace crucible::ir {

namespace {

// Writes `derived` into `n`'s results; returns how many changed.
size_t set_metas(Node& n, const detail::DerivedMetas& derived) {
  size_t changed = 0;
  for (size_t i = 0; i < n.num_results(); ++i) {
    Value* r = n.result(i);
    if (!r->is_tensor()) continue;
    const std::optional<TensorMeta>& d = derived[i];
    if (!d) {
      if (r->has_meta()) {
        r->clear_meta();
        ++changed;
      }
      continue;
    }
    TensorMeta meta = *d;
    if (r->has_meta()) meta.requires_grad = r->meta().requires_grad;
    if (!r->has_meta() || r->meta() != meta) {
      r->set_meta(std::move(meta));
      ++changed;
    }
  }
  return changed;
}

}  // namespace

size_t propagate_meta(Graph& graph) {
  // Derive everything first: a graph that fails is left as it was.
  std::vector<detail::DerivedMetas> derived;
  detail::run_on_meta(graph, [&](const Node&, const detail::DerivedMetas& d) {
    derived.push_back(d);
    return true;
  });
  size_t changed = 0, next = 0;
  for (Node* n : graph.nodes())
    if (n->is_call()) changed += set_metas(*n, derived[next++]);
  return changed;
}

void infer_meta(Node& node) {
  if (!node.is_call())
    throw IrError("infer_meta: node " + node.target() + " is a " + std::string(to_string(node.kind())) +
                  "; only calls derive metadata from their inputs");
  set_metas(node, detail::derive_meta(node));
}

}  // namespace crucible::ir
