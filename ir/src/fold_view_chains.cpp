#include <crucible/ir/fold_view_chains.h>

#include <ATen/TensorUtils.h>

#include <string>

namespace crucible::ir {

// Note [Folding views]
// outer(inner(x, s1), s2) becomes outer(x, s2): the same sizes, and, when
// every step was a view, the same strides and offset (meta_equivalent is
// checked by apply_rewrites) and the same storage, so a reader cannot tell.
// What may change is what the schema says about aliasing: view and reshape
// return `Tensor(a)` (an alias of self), _unsafe_view returns a fresh
// `Tensor` though it shares storage all the same (it is how at::matmul and
// autograd hide a view from view tracking). The folded call is of the outer
// op's kind, so its readers see the annotation they saw; towards x it may now
// claim an alias the chain hid (view(_unsafe_view(x))), never hide one the
// chain claimed except where outer was already _unsafe_view. Claiming more
// aliasing only makes CSE and DCE more careful, and at run time the storage
// was shared either way.
// A reshape is a view only where its input's strides allow one (else it
// copies, and its readers see a fresh tensor): the fold requires every
// reshape in the chain to be a view, so the chain's end is on x's storage,
// and x to be viewable as s2, so the folded call is a view too.

namespace {

using P = Pattern;

bool viewable(const TensorMeta& from, const std::vector<int64_t>& sizes) {
  return at::detail::computeStride(from.sizes, from.strides, sizes).has_value();
}

}  // namespace

std::vector<Rewrite> view_chain_rewrites() {
  static const std::vector<std::string> kViews = {"aten::view", "aten::_unsafe_view", "aten::reshape"};
  std::vector<Rewrite> r;
  for (const std::string& outer : kViews)
    for (const std::string& inner : kViews) {
      const bool inner_reshape = inner == "aten::reshape", outer_reshape = outer == "aten::reshape";
      r.push_back(
          Rewrite{"fold " + outer + "(" + inner + ")",
                  P::call(outer, {P::call(inner, {P::bind("x"), P::ignored()}).named("inner"), P::bind("size")}),
                  P::call(outer, {P::bind("x"), P::bind("size")}),
                  [inner_reshape, outer_reshape](const Match& m) {  // see Note [Folding views]
                    const TensorMeta &x = m.meta("x"), &mid = m.meta("inner"), &end = m.root()->result()->meta();
                    return (!inner_reshape || viewable(x, mid.sizes)) && (!outer_reshape || viewable(mid, end.sizes)) &&
                           viewable(x, end.sizes);
                  }});
    }
  return r;
}

size_t fold_view_chains(Graph& graph) {
  static const std::vector<Rewrite> rewrites = view_chain_rewrites();
  return apply_rewrites(graph, rewrites);
}

}  // namespace crucible::ir
