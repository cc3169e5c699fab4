#include <crucible/ir/error.h>
#include <crucible/ir/verifier.h>

#include "describe.h"
#include "meta_run.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace crucible::ir {

namespace {

[[noreturn]] void fail(const Node* n, const std::string& what) {
  throw IrError("verify: node " + detail::describe(n) + ": " + what);
}

// An undefined tensor a multi-result op was told not to compute (the input
// gradient convolution_backward skips for its first layer, by output_mask):
// the tracer records it with no metadata. It is fine as long as nothing reads
// it and the op's other results, which it did compute, have metadata.
bool uncomputed_result(const Node& n, const Value& r) {
  if (r.has_users()) return false;
  return std::any_of(n.results().begin(), n.results().end(),
                     [&](const auto& other) { return other.get() != &r && other->has_meta(); });
}

// How ATen passes None for a Tensor argument that is not optional (flash
// attention's backward takes cum_seq_q so); the text form spells it None.
bool is_undefined_tensor(const Argument& a) {
  return a.is_constant() && a.constant().isTensor() && !a.constant().toTensor().defined();
}

std::string describe(const Argument& a) {
  if (a.is_value()) return "%" + a.value()->name() + " (" + a.value()->type()->str() + ")";
  if (a.is_value_list()) return "a list of " + std::to_string(a.value_list().size()) + " Values";
  if (a.constant().isNone() || is_undefined_tensor(a)) return "None";
  return "a constant of type " + a.constant().type()->str();
}

// Types as raw pointers: verification runs between passes, and a TypePtr
// copy or cast is an atomic reference count each.
bool is_tensor_type(const c10::Type* t) { return t->kind() == c10::TypeKind::TensorType; }

bool is_optional_tensor_type(const c10::Type* t) {
  const auto* opt = t->castRaw<c10::OptionalType>();
  return opt && is_tensor_type(opt->getElementType().get());
}

// Whether a non-tensor Value or constant of type `actual` may stand where the
// schema says `formal` (the boxed convention's type: ScalarType, Layout and
// MemoryFormat are ints, SymInt is int). Scalar takes bools too.
bool fits(const c10::Type& actual, const c10::Type& formal) {
  if (actual.isSubtypeOf(formal)) return true;
  return formal.kind() == c10::TypeKind::NumberType && actual.kind() == c10::TypeKind::BoolType;
}

void check_argument(const Node* n, const c10::Argument& formal, const Argument& a) {
  const c10::Type* type = formal.type().get();
  auto bad = [&](const std::string& expected) {
    fail(n, "argument '" + formal.name() + "' (" + type->str() + ") takes " + expected + ", got " + describe(a));
  };
  if (const auto* opt = type->castRaw<c10::OptionalType>()) {
    if (a.is_constant() && a.constant().isNone()) return;
    type = opt->getElementType().get();
  }
  if (is_tensor_type(type)) {
    if (is_undefined_tensor(a)) return;
    if (!a.is_value() || !a.value()->is_tensor())
      bad(a.is_constant() && a.constant().isTensor()
              ? "a tensor Value (tensor constants are constant nodes: Graph::add_constant)"
              : "a tensor Value");
    return;
  }
  if (const auto* list = type->castRaw<c10::ListType>();
      list && (is_tensor_type(list->getElementType().get()) || is_optional_tensor_type(list->getElementType().get()))) {
    const bool optional = is_optional_tensor_type(list->getElementType().get());
    if (!a.is_value_list()) bad("a list of tensor Values");
    for (Value* v : a.value_list()) {
      if (!v && !optional) bad("a list of tensor Values without None (None is for Tensor?[])");
      if (v && !v->is_tensor()) bad("a list of tensor Values, and %" + v->name() + " is a " + v->type()->str());
    }
    return;
  }
  if (a.is_value_list()) bad("a constant or a Value (lists of Values are for Tensor[] and Tensor?[])");
  if (a.is_value()) {
    if (!fits(*a.value()->type(), *type)) bad("a constant or a Value of that type");
    return;
  }
  if (a.constant().isNone()) bad("a value (the argument is not optional)");
  if (!fits(*a.constant().type(), *type)) bad("a constant of that type");
}

void check_results(const Node* n) {
  const auto& rets = n->schema().returns();
  size_t list_returns = 0;
  auto tensor_list = [](const c10::Argument& r) {
    const auto* l = r.type()->castRaw<c10::ListType>();
    return l && is_tensor_type(l->getElementType().get());
  };
  for (const auto& r : rets) list_returns += tensor_list(r);
  const size_t fixed = rets.size() - list_returns;
  if (list_returns > 1) fail(n, "the schema has several Tensor[] returns, which the IR cannot split into results");
  if (list_returns == 0 ? n->num_results() != fixed : n->num_results() <= fixed)
    fail(n, "has " + std::to_string(n->num_results()) + " results, the schema returns " + std::to_string(rets.size()) +
                (list_returns ? " values including a Tensor[] that needs at least one result" : " values") +
                "; build it with Graph::add_call (and list_size for Tensor[])");
  size_t next = 0;
  for (const auto& r : rets) {
    const bool list = tensor_list(r);
    const size_t count = list ? n->num_results() - fixed : 1;
    for (size_t j = 0; j < count; ++j, ++next) {
      const Value* v = n->result(next);
      const c10::TypePtr& expected = list ? c10::TensorType::get() : r.type();
      if (*v->type() != *expected)
        fail(n, "result %" + v->name() + " has type " + v->type()->str() + ", the schema returns " + expected->str());
    }
  }
}

void check_signature(const Graph& g, size_t num_placeholders, size_t num_outputs) {
  const auto& sig = g.signature();
  if (sig.inputs.size() != num_placeholders)
    throw IrError("verify: the signature has " + std::to_string(sig.inputs.size()) + " input specs for " +
                  std::to_string(num_placeholders) + " placeholders; keep one InputSpec per placeholder");
  if (sig.outputs.size() != num_outputs)
    throw IrError("verify: the signature has " + std::to_string(sig.outputs.size()) + " output specs for " +
                  std::to_string(num_outputs) + " outputs; keep one OutputSpec per output");
  for (size_t i = 0; i < sig.inputs.size(); ++i)
    if (auto d = sig.inputs[i].duplicate_of; d && *d >= i)
      throw IrError("verify: input " + std::to_string(i) + " is marked duplicate_of " + std::to_string(*d) +
                    ", which is not an earlier placeholder");
  // A backward graph (its inputs all saved values and tangents) names in a
  // Gradient output the primal's index in the forward graph (OutputSpec).
  const bool backward = std::all_of(sig.inputs.begin(), sig.inputs.end(), [](const InputSpec& in) {
    return in.kind == InputKind::SavedValue || in.kind == InputKind::Tangent;
  });
  for (size_t i = 0; i < sig.outputs.size(); ++i) {
    const OutputSpec& o = sig.outputs[i];
    const bool needs_input = o.kind == OutputKind::Gradient || o.kind == OutputKind::MutatedInput ||
                             o.kind == OutputKind::MutatedInputMetadata;
    const std::string what = "verify: output " + std::to_string(i) + " (" + std::string(to_string(o.kind)) + ")";
    if (needs_input && !o.input_index) throw IrError(what + " has no input_index; say which placeholder it belongs to");
    if (o.input_index && *o.input_index >= num_placeholders && !(backward && o.kind == OutputKind::Gradient))
      throw IrError(what + " refers to input " + std::to_string(*o.input_index) + ", but the graph has " +
                    std::to_string(num_placeholders) + " placeholders");
  }
}

// See VerifyOptions::check_meta.
void check_meta(const Graph& graph) {
  detail::run_on_meta(graph, [](const Node& n, const detail::DerivedMetas& derived) {
    for (size_t i = 0; i < n.num_results(); ++i) {
      const Value* r = n.result(i);
      if (!r->is_tensor() || !r->has_meta()) continue;
      if (!derived[i])
        fail(&n, "result %" + r->name() + " is recorded as " + to_string(r->meta()) + ", but " + n.target() +
                     " leaves it undefined on meta tensors of its inputs; drop its metadata (propagate_meta does)");
      if (meta_equivalent(r->meta(), *derived[i])) continue;
      TensorMeta expected = *derived[i];
      expected.requires_grad = r->meta().requires_grad;  // not compared: keep it out of the message
      fail(&n, "result %" + r->name() + " is recorded as " + to_string(r->meta()) + ", but " + n.target() + " gives " +
                   to_string(expected) +
                   " from its inputs (run on meta tensors); the pass that made or changed it set wrong "
                   "metadata: run propagate_meta after it, or fix it");
    }
    return true;
  });
}

}  // namespace

void verify(const Graph& graph, const VerifyOptions& options) {
  verify(graph);
  if (options.check_meta) check_meta(graph);
}

void verify(const Graph& graph) {
  // Every Value defined so far, numbered in order, and every read as (the
  // Value's number, the reader): the use lists are checked against these
  // at the end, with no container per Value (verification runs between
  // passes, on graphs of thousands of nodes).
  std::unordered_map<const Value*, uint32_t> defined;
  defined.reserve(graph.num_nodes() + graph.num_nodes() / 4);
  std::vector<const Value*> values;
  std::vector<std::pair<uint32_t, const Node*>> reads;
  size_t num_placeholders = 0;
  const Node* output = nullptr;
  bool seen_non_placeholder = false;

  auto read = [&](const Node* n, const Value* v) {
    if (v->node()->graph() != &graph) fail(n, "reads %" + v->name() + ", a Value of another graph");
    auto it = defined.find(v);
    if (it == defined.end())
      fail(n, "reads %" + v->name() + " before it is defined; nodes must be in topological order");
    reads.emplace_back(it->second, n);
  };
  for (const Node* n : graph.nodes()) {
    if (n->graph() != &graph) fail(n, "belongs to another graph");
    if (output) fail(n, "comes after the output node, which must be last");
    switch (n->kind()) {
      case NodeKind::Placeholder:
        if (seen_non_placeholder) fail(n, "placeholders must come before every other node");
        if (n->num_results() != 1 || !n->args().empty()) fail(n, "a placeholder has one result and no arguments");
        ++num_placeholders;
        break;
      case NodeKind::Constant:
        if (n->num_results() != 1 || !n->args().empty()) fail(n, "a constant has one result and no arguments");
        break;
      case NodeKind::Call: {
        const auto& formals = n->schema().arguments();
        if (n->args().size() != formals.size())
          fail(n, "has " + std::to_string(n->args().size()) + " arguments, the schema takes " +
                      std::to_string(formals.size()) + " (" + toString(n->schema()) + ")");
        for (size_t i = 0; i < formals.size(); ++i) check_argument(n, formals[i], n->args()[i]);
        check_results(n);
        break;
      }
      case NodeKind::Output:
        if (graph.output_node() != n) fail(n, "is not the graph's output node; a graph has exactly one");
        for (const Argument& a : n->args())
          if (!a.is_value()) fail(n, "the output node returns Values only, got " + describe(a));
        output = n;
        break;
    }
    if (!n->is_placeholder()) seen_non_placeholder = true;

    for (const Argument& a : n->args()) {
      if (a.is_value()) read(n, a.value());
      if (a.is_value_list())
        for (const Value* v : a.value_list())
          if (v) read(n, v);
    }
    for (const auto& r : n->results()) {
      if (r->node() != n) fail(n, "result %" + r->name() + " points at another node");
      if (r->is_tensor() && !r->has_meta() && !uncomputed_result(*n, *r))
        fail(n, "tensor result %" + r->name() + " has no TensorMeta; set it with Value::set_meta");
      if (const Value* named = graph.find_value(r->name()); named != r.get()) {
        if (named && defined.contains(named)) fail(n, "result name %" + r->name() + " is used twice");
        fail(n, "result %" + r->name() +
                    " is not what Graph::find_value finds under its name; rename through Graph::rename");
      }
      defined.emplace(r.get(), static_cast<uint32_t>(values.size()));
      values.push_back(r.get());
    }
  }
  if (!output) throw IrError("verify: the graph has no output node; call Graph::set_output");

  // Use lists against the arguments, as multisets: the reads sorted by
  // Value, each Value's readers against its users.
  std::sort(reads.begin(), reads.end());
  std::vector<const Node*> users;
  auto next = reads.begin();
  for (uint32_t i = 0; i < values.size(); ++i) {
    const Value* r = values[i];
    const auto end = std::find_if(next, reads.end(), [&](const auto& read) { return read.first != i; });
    users.assign(r->users().begin(), r->users().end());
    std::sort(users.begin(), users.end());
    const bool same =
        static_cast<size_t>(end - next) == users.size() &&
        std::equal(users.begin(), users.end(), next, [](const Node* u, const auto& read) { return u == read.second; });
    if (!same)
      fail(r->node(), "the use list of %" + r->name() + " has " + std::to_string(users.size()) + " entries, but " +
                          std::to_string(end - next) + " argument(s) read it; edit arguments through Node::set_arg");
    next = end;
  }

  check_signature(graph, num_placeholders, output->args().size());
}

}  // namespace crucible::ir
