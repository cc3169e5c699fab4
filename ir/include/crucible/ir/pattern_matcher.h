// A pattern matcher: rewrites given as data (a pattern tree, a replacement
// tree, a check on the metadata of what matched), applied over a graph until
// none matches. The C++ counterpart of torch/_inductor/pattern_matcher.py's
// CallFunction / KeywordArg / Ignored patterns with register_replacement's
// extra_check, and of tinygrad's pattern tables; later passes
// (decompositions, fusions) add their own tables.
//
//   using P = Pattern;
//   Rewrite r{"mm_add", P::call("aten::add.Tensor", {P::call("aten::mm", {P::bind("a"), P::bind("b")}),
//                                                    P::bind("bias"), P::constant(int64_t{1})}),
//             P::call("aten::addmm", {P::bind("bias"), P::bind("a"), P::bind("b")}),
//             [](const Match& m) { return m.meta("bias").sizes.size() <= 1; }};
//   apply_rewrites(graph, {r});
#pragma once

#include <crucible/ir/graph.h>

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace crucible::ir {

/// One node of a pattern tree. In a pattern it matches an argument of a
/// call; in a replacement it says what to put there.
class Pattern {
 public:
  enum class Kind : uint8_t { Bind, Ignored, Constant, Call, AnyOf };

  /// Pattern: matches whatever stands there (a Value, a list of Values, a
  /// constant) and binds it to `name`; a name met twice must bind the same
  /// Values, or equal constants, both times. Replacement: what `name` bound.
  static Pattern bind(std::string name);
  /// Pattern: matches anything and binds nothing. Not in replacements.
  static Pattern ignored();
  /// Pattern: matches a constant equal to `value` (of the same kind: 1 and
  /// 1.0 differ, as CSE compares constants). Replacement: that constant.
  static Pattern constant(c10::IValue value);
  /// Pattern: matches a Value that is the only result of a call to `op`
  /// ("aten::mm", "aten::add.Tensor") whose arguments match `args` in schema
  /// order; arguments left out at the end must hold the schema's defaults.
  /// Calls with side effects (effects.h) do not match (a rewrite would drop
  /// or move them), but for a root that only writes in place storage the
  /// match's inner calls allocated (see apply_rewrites). Replacement: a new call to `op` with those arguments
  /// (left out: the defaults). Throws IrError for an unknown operator, an
  /// operator with other than one result, or more arguments than its schema
  /// takes.
  static Pattern call(std::string_view op, std::vector<Pattern> args);
  /// Pattern: matches where the first of `alternatives` that matches does
  /// (the ways one computation is spelled: at::matmul's operands are
  /// `view(expand(x))` or `_unsafe_view(clone(expand(x)))` by their
  /// layout); its bindings are that alternative's. A replacement may use
  /// the names every alternative binds. Not in replacements. Throws IrError
  /// for fewer than two alternatives.
  static Pattern any_of(std::vector<Pattern> alternatives);
  /// The same call pattern, also binding the call's result to `name` (for a
  /// check that reads its metadata, or a replacement that keeps it).
  /// Throws IrError unless this is a call pattern.
  Pattern named(std::string name) &&;

  Kind kind() const { return kind_; }
  /// Bind: the name; Call: the name given by named(), or empty.
  const std::string& name() const { return name_; }
  const c10::IValue& constant_value() const { return constant_; }
  /// Call only.
  const c10::OperatorHandle& op() const { return *op_; }
  /// Call: the arguments; AnyOf: the alternatives.
  const std::vector<Pattern>& args() const { return args_; }

 private:
  explicit Pattern(Kind kind) : kind_(kind) {}
  Kind kind_;
  std::string name_;
  c10::IValue constant_;
  std::optional<c10::OperatorHandle> op_;
  std::vector<Pattern> args_;
};

/// Where a pattern matched.
class Match {
 public:
  /// The call that computes the pattern's root (the node the replacement replaces).
  Node* root() const { return nodes_.front(); }
  /// Every call the pattern matched, the root first.
  const std::vector<Node*>& nodes() const { return nodes_; }
  /// True when the pattern bound `name`.
  bool has(std::string_view name) const { return bindings_.find(name) != bindings_.end(); }
  /// What `name` bound. Throws IrError for a name the pattern does not bind.
  const Argument& operator[](std::string_view name) const;
  /// The Value `name` bound. Throws IrError if it bound something else.
  Value* value(std::string_view name) const;
  /// value(name)->meta().
  const TensorMeta& meta(std::string_view name) const;
  /// The constant `name` bound. Throws IrError if it bound something else.
  const c10::IValue& constant(std::string_view name) const;

 private:
  friend class Matcher;
  std::vector<Node*> nodes_;
  std::map<std::string, Argument, std::less<>> bindings_;
};

/// A rewrite: where `pattern` matches and `check` agrees, the root's result
/// is replaced by what `replacement` builds from the bindings, and the
/// matched calls nobody reads any more are erased.
struct Rewrite {
  /// For messages and reports.
  std::string name;
  /// A call pattern.
  Pattern pattern;
  /// A call pattern (new nodes) or a Bind of a Value the pattern bound.
  Pattern replacement;
  /// Constraints on what matched (typically on metadata: dtypes, ranks,
  /// broadcasting); empty: none.
  std::function<bool(const Match&)> check;
};

/// Applies `rewrites` to `graph` until none matches anywhere: each sweep
/// walks the calls in order and tries, at each, the rewrites whose pattern
/// root is its op, in the order given; the first that applies wins. A match
/// is taken only where
///  * every matched call but the root is read by matched calls alone (else
///    its result would be computed twice: once for its other readers, once
///    inside the replacement);
///  * no call between the first matched call and the root writes storage
///    an input of the match lives on (the replacement reads its inputs
///    where the root stood); a placeholder's storage counts as every
///    input's, as inputs may alias;
///  * a root that writes an argument in place (add_) writes only storage an
///    inner call of the match allocated (its result, or a view of it), so
///    that nothing outside the match sees the write;
///  * `check` agrees;
///  * the replacement gives the root's metadata (meta_equivalent; every new
///    call's metadata is derived by infer_meta, propagate_meta.h), else it
///    is undone: a replacement never changes what a reader of the root
///    sees, and an op that rejects the bound shapes skips the match.
/// New calls go where the root stood and take its source and tags
/// ("backward" stays "backward"), and the root's readers read the
/// replacement's result (with the root's requires_grad). Returns the number of
/// rewrites applied. Throws IrError if a rewrite is malformed (a pattern
/// root that is not a call, a replacement naming a name the pattern does
/// not bind, or an Ignored or AnyOf in a replacement), or if `rewrites` still match
/// after 64 sweeps (rewrites that undo each other).
size_t apply_rewrites(Graph& graph, const std::vector<Rewrite>& rewrites);

}  // namespace crucible::ir
