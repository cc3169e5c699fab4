#include <crucible/ir/dce.h>
#include <crucible/ir/effects.h>

#include <vector>

namespace crucible::ir {

// Note [DCE keeps what it cannot prove dead]
// A node is dead when none of its results has a user and it has no effect
// besides them (has_side_effects). Three cases look subtle and need nothing
// more than that rule:
//  * views of a value that is later mutated: the mutating op is kept, and it
//    reads the view, so the view has a user and stays, and with it the
//    chain of views back to the base;
//  * ops on inputs that are mutated: the mutation is kept and reads its
//    input; an unused pure op reading the same input is genuinely dead;
//  * RNG ops are kept even when unused: dropping one shifts the random stream
//    of every RNG op after it, and results would no longer match eager.
// Walking the nodes backwards removes chains in one sweep: erasing a node
// drops its uses, so its producers are dead by the time the walk reaches them.

size_t eliminate_dead_code(Graph& graph) {
  const std::vector<Node*> order(graph.nodes().begin(), graph.nodes().end());
  size_t removed = 0;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* n = *it;
    if (n->is_placeholder() || n->is_output() || has_side_effects(*n)) continue;
    bool used = false;
    for (const auto& r : n->results()) used = used || r->has_users();
    if (used) continue;
    graph.erase(n);
    ++removed;
  }
  return removed;
}

}  // namespace crucible::ir
