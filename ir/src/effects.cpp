#include <crucible/ir/effects.h>

#include <array>
#include <string_view>

namespace crucible::ir {

bool is_collective(const Node& node) {
  if (!node.is_call()) return false;
  const std::string_view target = node.target();
  const auto sep = target.find("::");
  const std::string_view ns = target.substr(0, sep), name = target.substr(sep + 2);
  if (ns == "c10d" || ns == "_c10d_functional" || ns == "_c10d_functional_autograd") return true;
  if (ns != "crucible") return false;
  static constexpr std::array<std::string_view, 7> kCollectives{
      "all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "wait_tensor", "barrier"};
  for (std::string_view c : kCollectives)
    if (name.substr(0, c.size()) == c) return true;
  return false;
}

bool has_side_effects(const Node& node) {
  if (!node.is_call()) return false;
  return node.is_mutating() || node.is_nondeterministic() || is_collective(node) || node.schema().returns().empty();
}

std::vector<const Node*> side_effect_order(const Graph& graph) {
  std::vector<const Node*> chain;
  for (const Node* n : graph.nodes())
    if (has_side_effects(*n)) chain.push_back(n);
  return chain;
}

}  // namespace crucible::ir
