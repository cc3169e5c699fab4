#include <crucible/ir/cse.h>
#include <crucible/ir/effects.h>

#include "alias_annotations.h"
#include "constant_key.h"

#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace crucible::ir {

using detail::is_tensor_list;
using detail::sets_overlap;

// Note [CSE and mutation]
// In a functional graph equal calls on equal Values give equal results. A
// mutation breaks that in two ways, and CSE guards against both with alias
// classes: Values that may share memory, found by uniting each result with
// the arguments its schema says it aliases (`Tensor(a) self -> Tensor(a)`:
// views, in-place ops, out= ops; a Tensor[] return without annotation of its
// own is united with every annotated argument).
//  1. The inputs change: `a = add(x, y); x.add_(1); b = add(x, y)` must keep
//     both adds. When the walk reaches a mutation of x, it forgets every
//     recorded call that reads or produces a Value of x's alias class. If
//     that class holds a placeholder or a constant, it forgets everything:
//     graph inputs may alias each other at run time, which the graph cannot
//     see.
//  2. A result changes: with `a = add(x, y); b = add(x, y); a.add_(1)`,
//     merging b into a would let b's readers see the write. Calls whose
//     results lie in a class that is written anywhere in the graph are never
//     merged.
// Being conservative costs only missed merges; the classes are a coarse
// over-approximation (an op with an annotated argument unites more than it
// must), never an under-approximation.

namespace {

// Union-find over Values.
class AliasClasses {
 public:
  const Value* find(const Value* v) {
    auto it = parent_.find(v);
    if (it == parent_.end() || it->second == v) return v;
    const Value* root = find(it->second);
    it->second = root;
    return root;
  }
  void unite(const Value* a, const Value* b) {
    const Value *ra = find(a), *rb = find(b);
    if (ra != rb) parent_[ra] = rb;
  }

 private:
  std::unordered_map<const Value*, const Value*> parent_;
};

// Unites the results of `n` with the arguments they may alias (see the Note).
void record_aliases(const Node* n, AliasClasses& classes) {
  const auto& formals = n->schema().arguments();
  const auto& rets = n->schema().returns();
  size_t next = 0;
  for (const auto& r : rets) {
    const size_t count = is_tensor_list(r.type()) ? n->num_results() - (rets.size() - 1) : 1;
    for (size_t j = 0; j < count; ++j, ++next) {
      const Value* result = n->result(next);
      for (size_t i = 0; i < formals.size(); ++i) {
        const c10::AliasInfo* ai = formals[i].alias_info();
        if (!ai) continue;
        const bool aliases = r.alias_info() ? sets_overlap(*r.alias_info(), *ai) : is_tensor_list(r.type());
        if (!aliases) continue;
        for (Value* v : n->args()[i].values()) classes.unite(result, v);
      }
    }
  }
}

// Calls traced under no_grad run so (Note [Nodes traced under no_grad] in
// the tracer): merged with an equal call that records autograd's graph, one
// of the two would run in the other's grad mode.
bool runs_without_grad(const Node* n) { return n->has_tag("no_grad"); }

size_t hash_call(const Node* n) {
  size_t h = std::hash<const void*>{}(&n->schema());
  detail::hash_mix(h, n->num_results());
  detail::hash_mix(h, runs_without_grad(n));
  for (const Argument& a : n->args()) {
    if (a.is_value()) {
      detail::hash_mix(h, std::hash<const void*>{}(a.value()));
    } else if (a.is_value_list()) {
      detail::hash_mix(h, a.value_list().size());
      for (const Value* v : a.value_list()) detail::hash_mix(h, std::hash<const void*>{}(v));
    } else {
      detail::hash_mix(h, detail::hash_constant(a.constant()));
    }
  }
  return h;
}

bool same_call(const Node* a, const Node* b) {
  if (&a->schema() != &b->schema() || a->num_results() != b->num_results() || a->args().size() != b->args().size() ||
      runs_without_grad(a) != runs_without_grad(b))
    return false;
  for (size_t i = 0; i < a->args().size(); ++i) {
    const Argument &x = a->args()[i], &y = b->args()[i];
    if (x.is_value() != y.is_value() || x.is_value_list() != y.is_value_list()) return false;
    if (x.is_value()        ? x.value() != y.value()
        : x.is_value_list() ? x.value_list() != y.value_list()
                            : !detail::same_constant(x.constant(), y.constant()))
      return false;
  }
  return true;
}

}  // namespace

size_t eliminate_common_subexpressions(Graph& graph) {
  const std::vector<Node*> order(graph.nodes().begin(), graph.nodes().end());

  // Alias classes, and which of them are written anywhere (see the Note, case 2).
  AliasClasses classes;
  std::vector<const Value*> all_written;
  for (const Node* n : order)
    if (n->is_call()) {
      record_aliases(n, classes);
      if (n->is_mutating())
        for (const Value* v : n->written()) all_written.push_back(v);
    }
  std::unordered_set<const Value*> written_classes, external_classes;
  for (const Value* v : all_written) written_classes.insert(classes.find(v));
  for (const Node* n : order)
    if (n->is_placeholder() || n->is_constant()) external_classes.insert(classes.find(n->result()));

  std::unordered_multimap<size_t, Node*> table;
  std::unordered_map<const Value*, std::vector<Node*>> entries_of_class;  // class → recorded calls touching it
  std::unordered_set<const Node*> forgotten;
  size_t removed = 0;

  for (Node* n : order) {
    if (!n->is_call()) continue;
    if (n->is_mutating()) {  // case 1 of the Note
      for (const Value* v : n->written()) {
        const Value* root = classes.find(v);
        if (external_classes.count(root)) {
          table.clear();
          entries_of_class.clear();
          forgotten.clear();
          break;
        }
        if (auto it = entries_of_class.find(root); it != entries_of_class.end()) {
          forgotten.insert(it->second.begin(), it->second.end());
          entries_of_class.erase(it);
        }
      }
    }
    if (has_side_effects(*n)) continue;
    bool result_written = false;
    for (const auto& r : n->results()) result_written = result_written || written_classes.count(classes.find(r.get()));
    if (result_written) continue;

    const size_t h = hash_call(n);
    Node* same = nullptr;
    for (auto [it, end] = table.equal_range(h); it != end && !same; ++it)
      if (!forgotten.count(it->second) && same_call(it->second, n)) same = it->second;
    if (same) {
      for (size_t i = 0; i < n->num_results(); ++i) n->result(i)->replace_all_uses_with(same->result(i));
      graph.erase(n);
      ++removed;
      continue;
    }
    table.emplace(h, n);
    for (const Value* v : n->inputs()) entries_of_class[classes.find(v)].push_back(n);
    for (const auto& r : n->results()) entries_of_class[classes.find(r.get())].push_back(n);
  }
  return removed;
}

}  // namespace crucible::ir
