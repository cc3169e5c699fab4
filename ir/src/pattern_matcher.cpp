#include <crucible/ir/aliasing.h>
#include <crucible/ir/effects.h>
#include <crucible/ir/error.h>
#include <crucible/ir/pattern_matcher.h>
#include <crucible/ir/propagate_meta.h>

#include "alias_annotations.h"
#include "constant_key.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace crucible::ir {

// Note [Rewriting safely]
// A pattern matches a tree of pure calls ending at the root; the replacement
// is built where the root stands and the root's readers are moved to it.
// Three things could make that change the program, and apply_rewrites
// refuses the match instead:
//  * A matched call that someone else also reads: its result would then be
//    computed twice, once for that reader and once inside the replacement
//    (mm read by a second add: fusing one add into an addmm keeps the mm
//    and adds a second product). Only the root may have outside readers.
//  * A write between the first matched call and the root: the replacement
//    reads the bound inputs at the root's position, the matched calls read
//    them at theirs; a write in between (an optimizer's in-place update of a
//    weight) would make them read different values. A mutating call in
//    that stretch refuses the match when it writes storage an input of the
//    match lives on (through views; a placeholder's storage counts as any
//    input's, since inputs may alias); functional graphs have none.
//  * A replacement whose result differs from the root's in metadata: a
//    reader that saw a contiguous [B, T, N] float tensor must see exactly
//    that. The new calls' metadata is derived from their inputs (infer_meta)
//    and the replacement's result compared with the root's (meta_equivalent);
//    on a difference, or when an op rejects the bound shapes, the new calls
//    are erased again. A check (Rewrite::check) states what the rewrite
//    needs (dtypes that match, a bias that broadcasts the same way); this
//    comparison is the net under it.
// Calls with side effects do not match (has_side_effects): a rewrite would
// drop or move them. One exception: a root that writes only results of the
// match's own inner calls, which nobody else reads (the first rule), as
// LibTorch's linear adds its bias in place to the product it has just made
// (`output.add_(bias)`): the write must land on storage an inner call
// allocated (a result, or a view of one, never a view of a bound input), so
// that only the match sees it; the root is then a pure function of the
// match's inputs, and its readers read the replacement instead.

// --- Pattern ---------------------------------------------------------------------

Pattern Pattern::bind(std::string name) {
  Pattern p(Kind::Bind);
  p.name_ = std::move(name);
  return p;
}

Pattern Pattern::ignored() { return Pattern(Kind::Ignored); }

Pattern Pattern::constant(c10::IValue value) {
  Pattern p(Kind::Constant);
  p.constant_ = std::move(value);
  return p;
}

Pattern Pattern::call(std::string_view op, std::vector<Pattern> args) {
  Pattern p(Kind::Call);
  p.op_ = resolve_operator(op);
  const auto& schema = p.op_->schema();
  if (schema.returns().size() != 1 || detail::is_tensor_list(schema.returns()[0].type()))
    throw IrError("pattern: " + std::string(op) +
                  " does not return exactly one value; patterns match calls with one result");
  if (args.size() > schema.arguments().size())
    throw IrError("pattern: " + std::string(op) + " given " + std::to_string(args.size()) +
                  " arguments, its schema takes " + std::to_string(schema.arguments().size()) + " (" +
                  toString(schema) + ")");
  p.args_ = std::move(args);
  return p;
}

Pattern Pattern::any_of(std::vector<Pattern> alternatives) {
  if (alternatives.size() < 2) throw IrError("pattern: any_of takes two alternatives or more");
  Pattern p(Kind::AnyOf);
  p.args_ = std::move(alternatives);
  return p;
}

Pattern Pattern::named(std::string name) && {
  if (kind_ != Kind::Call) throw IrError("pattern: named(\"" + name + "\") applies to call patterns only");
  name_ = std::move(name);
  return std::move(*this);
}

// --- Match -----------------------------------------------------------------------

const Argument& Match::operator[](std::string_view name) const {
  auto it = bindings_.find(name);
  if (it == bindings_.end()) throw IrError("match: the pattern binds nothing named '" + std::string(name) + "'");
  return it->second;
}

Value* Match::value(std::string_view name) const {
  const Argument& a = (*this)[name];
  if (!a.is_value()) throw IrError("match: '" + std::string(name) + "' bound a constant or a list, not a Value");
  return a.value();
}

const TensorMeta& Match::meta(std::string_view name) const { return value(name)->meta(); }

const c10::IValue& Match::constant(std::string_view name) const {
  const Argument& a = (*this)[name];
  if (!a.is_constant()) throw IrError("match: '" + std::string(name) + "' bound a Value or a list, not a constant");
  return a.constant();
}

// --- matching --------------------------------------------------------------------

namespace {

// A call whose only effect is writing some of its arguments (no RNG, no
// collective, a result).
bool writes_in_place_only(const Node& n) {
  return n.is_mutating() && !n.is_nondeterministic() && !is_collective(n) && !n.schema().returns().empty();
}

bool same_argument(const Argument& a, const Argument& b) {
  if (a.is_value() != b.is_value() || a.is_value_list() != b.is_value_list()) return false;
  if (a.is_value()) return a.value() == b.value();
  if (a.is_value_list()) return a.value_list() == b.value_list();
  return detail::same_constant(a.constant(), b.constant());
}

}  // namespace

// Matches a pattern tree against the graph, filling a Match.
class Matcher {
 public:
  explicit Matcher(Match& m) : m_(m) {}

  // `root`: see Note [Rewriting safely] for the in-place root.
  bool call(const Pattern& p, Node* n, bool root = false) {
    if (!n->is_call() || n->num_results() != 1 || n->op() != p.op()) return false;
    if (has_side_effects(*n) && !(root && writes_in_place_only(*n))) return false;
    // A tree pattern may meet one call twice (add(mm(a, b), mm(a, b)) over one mm).
    if (std::find(m_.nodes_.begin(), m_.nodes_.end(), n) == m_.nodes_.end()) m_.nodes_.push_back(n);
    if (!p.name().empty() && !bind(p.name(), n->result())) return false;
    const auto& formals = n->schema().arguments();
    for (size_t i = 0; i < formals.size(); ++i) {
      if (i < p.args().size()) {
        if (!match(p.args()[i], n->arg(i))) return false;
        continue;
      }
      const auto& d = formals[i].default_value();
      if (!d || !n->arg(i).is_constant() || !detail::same_constant(n->arg(i).constant(), *d)) return false;
    }
    return true;
  }

 private:
  bool match(const Pattern& p, const Argument& a) {
    switch (p.kind()) {
      case Pattern::Kind::Ignored:
        return true;
      case Pattern::Kind::Bind:
        return bind(p.name(), a);
      case Pattern::Kind::Constant:
        return a.is_constant() && detail::same_constant(a.constant(), p.constant_value());
      case Pattern::Kind::Call:
        return a.is_value() && call(p, a.value()->node());
      case Pattern::Kind::AnyOf:
        for (const Pattern& alternative : p.args()) {
          // A failed alternative leaves nothing behind: what it matched and bound is undone.
          const size_t num_nodes = m_.nodes_.size();
          const auto bindings = m_.bindings_;
          if (match(alternative, a)) return true;
          m_.nodes_.resize(num_nodes);
          m_.bindings_ = bindings;
        }
        return false;
    }
    return false;
  }

  bool bind(const std::string& name, const Argument& a) {
    auto [it, inserted] = m_.bindings_.try_emplace(name, a);
    return inserted || same_argument(it->second, a);
  }

  Match& m_;
};

namespace {

// Names a pattern binds wherever it matches (Bind names and named calls;
// of an AnyOf, the names all its alternatives bind).
void bound_names(const Pattern& p, std::set<std::string>& names) {
  if (p.kind() == Pattern::Kind::AnyOf) {
    std::optional<std::set<std::string>> common;
    for (const Pattern& a : p.args()) {
      std::set<std::string> these;
      bound_names(a, these);
      if (!common) {
        common = std::move(these);
        continue;
      }
      std::set<std::string> both;
      std::set_intersection(common->begin(), common->end(), these.begin(), these.end(),
                            std::inserter(both, both.begin()));
      common = std::move(both);
    }
    names.insert(common->begin(), common->end());
    return;
  }
  if (p.kind() == Pattern::Kind::Bind || (p.kind() == Pattern::Kind::Call && !p.name().empty())) names.insert(p.name());
  for (const Pattern& a : p.args()) bound_names(a, names);
}

void check_replacement(const Rewrite& r, const Pattern& p, const std::set<std::string>& names) {
  if (p.kind() == Pattern::Kind::Ignored)
    throw IrError("rewrite '" + r.name + "': the replacement holds an Ignored, which stands for nothing to build");
  if (p.kind() == Pattern::Kind::AnyOf)
    throw IrError("rewrite '" + r.name + "': the replacement holds an any_of, which says nothing about what to build");
  if (p.kind() == Pattern::Kind::Bind && !names.count(p.name()))
    throw IrError("rewrite '" + r.name + "': the replacement uses '" + p.name() + "', which the pattern does not bind");
  if (p.kind() == Pattern::Kind::Call) {
    if (!p.name().empty()) throw IrError("rewrite '" + r.name + "': named() means nothing in a replacement");
    const auto& formals = p.op().schema().arguments();
    for (size_t i = p.args().size(); i < formals.size(); ++i)
      if (!formals[i].default_value())
        throw IrError("rewrite '" + r.name + "': the replacement's " + operator_name(p.op()) +
                      " leaves out argument '" + formals[i].name() + "', which has no default");
  }
  for (const Pattern& a : p.args()) check_replacement(r, a, names);
}

void check_rewrite(const Rewrite& r) {
  if (r.pattern.kind() != Pattern::Kind::Call)
    throw IrError("rewrite '" + r.name + "': the pattern's root must be a call pattern");
  if (r.replacement.kind() != Pattern::Kind::Call && r.replacement.kind() != Pattern::Kind::Bind)
    throw IrError("rewrite '" + r.name + "': the replacement's root must be a call pattern or a bound Value");
  std::set<std::string> names;
  bound_names(r.pattern, names);
  check_replacement(r, r.replacement, names);
}

// See Note [Rewriting safely]: only the root is read outside the match.
bool reads_stay_inside(const Match& m, const std::unordered_set<const Node*>& matched) {
  for (size_t i = 1; i < m.nodes().size(); ++i)
    for (const Node* user : m.nodes()[i]->result()->users())
      if (!matched.count(user)) return false;
  return true;
}

// True when `v` lives on storage an inner call of the match allocated: a
// result the schema does not mark as an alias, or a view (a marked alias, or
// an _unsafe_view, which aliases though its schema does not say so) of such
// a result. A view of anything bound from outside the match is not.
bool fresh_inside(const Value* v, const Node* root, const std::unordered_set<const Node*>& matched) {
  const Node* n = v->node();
  if (n == root || !matched.count(n)) return false;
  static const c10::OperatorHandle unsafe_view = resolve_operator("aten::_unsafe_view");
  if (n->op() == unsafe_view) return fresh_inside(n->arg(0).value(), root, matched);
  const c10::AliasInfo* alias = n->schema().returns()[0].alias_info();
  if (!alias) return true;
  const auto& formals = n->schema().arguments();
  for (size_t i = 0; i < formals.size(); ++i)
    if (formals[i].alias_info() && detail::sets_overlap(*alias, *formals[i].alias_info()))
      for (const Value* a : n->arg(i).values())
        if (!fresh_inside(a, root, matched)) return false;
  return true;
}

// See Note [Rewriting safely]: a root that writes may write only storage the
// match's inner calls allocated.
bool root_writes_inside(const Match& m, const std::unordered_set<const Node*>& matched) {
  const Node* root = m.root();
  for (const Value* v : root->written())
    if (!fresh_inside(v, root, matched)) return false;
  return true;
}

// See Note [Rewriting safely]: no call between the first matched call and
// the root writes storage an input of the match lives on (any placeholder's
// counts, since inputs may alias one another); writes to storage the match
// never reads (a mask built in place: empty_like, fill_, sub_) are harmless.
bool no_write_within(const Match& m, const std::unordered_set<const Node*>& matched) {
  std::unordered_set<const Value*> read;
  for (const Node* n : m.nodes())
    for (const Argument& a : n->args())
      for (const Value* v : a.values())
        if (!matched.count(v->node())) read.insert(storage_root(v));
  size_t remaining = m.nodes().size() - 1;
  for (const Node* n = m.root()->prev(); n && remaining > 0; n = n->prev()) {
    if (matched.count(n)) {
      --remaining;
      continue;
    }
    if (!n->is_call() || !n->is_mutating()) continue;
    const std::vector<Value*> written = n->written();
    // A mutating call that writes none of its arguments (an opaque effect)
    // refuses the match as before.
    if (written.empty()) return false;
    for (const Value* v : written) {
      const Value* root = storage_root(v);
      if (!root->node()->is_call() || read.count(root)) return false;
    }
  }
  return true;
}

// Builds the replacement before the root. Throws IrError when an op rejects
// the bound shapes (infer_meta); `created` holds what was built so far.
Argument build(Graph& graph, const Pattern& p, const Match& m, std::vector<Node*>& created) {
  switch (p.kind()) {
    case Pattern::Kind::Bind:
      return m[p.name()];
    case Pattern::Kind::Constant:
      return p.constant_value();
    case Pattern::Kind::Call: {
      std::vector<Argument> args;
      args.reserve(p.args().size());
      for (const Pattern& a : p.args()) args.push_back(build(graph, a, m, created));
      Node* n = graph.add_call(p.op(), std::move(args));
      created.push_back(n);
      n->set_source(m.root()->source());
      for (const std::string& t : m.root()->tags()) n->add_tag(t);
      infer_meta(*n);
      return n->result();
    }
    case Pattern::Kind::Ignored:
    case Pattern::Kind::AnyOf:
      break;
  }
  throw IrError("rewrite: an Ignored or any_of pattern cannot be built");
}

void erase_created(Graph& graph, std::vector<Node*>& created) {
  for (auto it = created.rbegin(); it != created.rend(); ++it) graph.erase(*it);
  created.clear();
}

bool try_rewrite(Graph& graph, const Rewrite& r, Node* root) {
  Match m;
  if (!Matcher(m).call(r.pattern, root, /*root=*/true)) return false;
  const std::unordered_set<const Node*> matched(m.nodes().begin(), m.nodes().end());
  if (!reads_stay_inside(m, matched) || !root_writes_inside(m, matched) || !no_write_within(m, matched)) return false;
  // The new calls take the root's tags; a match across grad modes (Note
  // [Nodes traced under no_grad] in the tracer) would move some calls into
  // the other's.
  for (const Node* n : m.nodes())
    if (n->has_tag("no_grad") != root->has_tag("no_grad")) return false;
  if (r.check && !r.check(m)) return false;

  Value* old = root->result();
  std::vector<Node*> created;
  Value* replacement = nullptr;
  {
    Graph::InsertGuard before_root(graph, root);
    std::optional<Argument> built;
    try {
      built = build(graph, r.replacement, m, created);
    } catch (const IrError&) {  // an op rejected the bound shapes: no match
      erase_created(graph, created);
      return false;
    }
    if (!built->is_value())
      throw IrError("rewrite '" + r.name + "': the replacement '" + r.replacement.name() +
                    "' is bound to a constant or a list; it must name a Value");
    replacement = built->value();
  }
  if (old->has_meta()) {
    if (!replacement->has_meta() || !meta_equivalent(replacement->meta(), old->meta())) {
      erase_created(graph, created);
      return false;
    }
    if (!created.empty()) {
      TensorMeta meta = replacement->meta();
      meta.requires_grad = old->meta().requires_grad;
      replacement->set_meta(std::move(meta));
    }
  }
  old->replace_all_uses_with(replacement);
  // The root, then every matched call that nothing reads any more (a call
  // the replacement kept reading stays).
  std::vector<Node*> dead(m.nodes().begin(), m.nodes().end());
  for (bool erased = true; erased;) {
    erased = false;
    for (auto it = dead.begin(); it != dead.end();) {
      if ((*it)->result()->has_users()) {
        ++it;
        continue;
      }
      graph.erase(*it);
      it = dead.erase(it);
      erased = true;
    }
  }
  return true;
}

}  // namespace

size_t apply_rewrites(Graph& graph, const std::vector<Rewrite>& rewrites) {
  std::unordered_map<const c10::FunctionSchema*, std::vector<const Rewrite*>> by_root;
  for (const Rewrite& r : rewrites) {
    check_rewrite(r);
    by_root[&r.pattern.op().schema()].push_back(&r);
  }
  constexpr int kMaxSweeps = 64;
  size_t applied = 0;
  for (int sweep = 0; sweep < kMaxSweeps; ++sweep) {
    size_t this_sweep = 0;
    for (Node* n = graph.nodes().begin() == graph.nodes().end() ? nullptr : *graph.nodes().begin(); n;) {
      Node* next = n->next();
      if (n->is_call()) {
        if (auto it = by_root.find(&n->schema()); it != by_root.end())
          for (const Rewrite* r : it->second)
            if (try_rewrite(graph, *r, n)) {
              ++this_sweep;
              break;
            }
      }
      n = next;
    }
    if (this_sweep == 0) return applied;
    applied += this_sweep;
  }
  std::string names;
  for (const Rewrite& r : rewrites) names += (names.empty() ? "" : ", ") + r.name;
  throw IrError("apply_rewrites: still rewriting after " + std::to_string(kMaxSweeps) +
                " sweeps over the graph; some of the rewrites (" + names + ") undo each other");
}

}  // namespace crucible::ir
