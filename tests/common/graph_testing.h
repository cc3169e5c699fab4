// Helpers for tests that inspect an ir::Graph.
#pragma once

#include <crucible/ir/graph.h>

#include <cstddef>
#include <string>

namespace crucible::testing {

/// Number of call nodes whose target is `op`.
inline size_t count_calls(const ir::Graph& g, const std::string& op) {
  size_t n = 0;
  for (const ir::Node* node : g.nodes()) n += node->is_call() && node->target() == op;
  return n;
}

}  // namespace crucible::testing
