// How error messages name a node: "%addmm (aten::addmm)", or the target alone
// for a node without results.
#pragma once

#include <crucible/ir/graph.h>

#include <string>

namespace crucible::ir::detail {

inline std::string describe(const Node* n) {
  if (n->num_results() == 0) return n->target();
  return "%" + n->result()->name() + " (" + n->target() + ")";
}

}  // namespace crucible::ir::detail
