#include "split.h"

#include <crucible/partitioner/error.h>

#include <string>
#include <unordered_map>

namespace crucible::partitioner::detail {

namespace {

ir::Argument remap(const ir::Argument& a, const ValueMap& map) {
  if (a.is_value()) return map.at(a.value());
  if (a.is_value_list()) {
    ir::Argument::ValueList out;
    for (ir::Value* v : a.value_list()) out.push_back(v ? map.at(v) : nullptr);
    return out;
  }
  return a.constant();
}

}  // namespace

void copy_node(const ir::Node* n, ir::Graph& g, ValueMap& map, bool keep_names) {
  ir::Node* copy = nullptr;
  if (n->is_constant()) {
    copy = g.add_constant(n->constant_value(), n->result()->name())->node();
  } else {
    std::vector<ir::Argument> args;
    args.reserve(n->args().size());
    for (const auto& a : n->args()) args.push_back(remap(a, map));
    copy = g.add_call(n->op(), std::move(args), n->num_results(),
                      n->num_results() ? std::string_view(n->result()->name()) : std::string_view());
  }
  copy->set_source(n->source());
  for (const auto& t : n->tags()) copy->add_tag(t);
  for (size_t i = 0; i < n->num_results(); ++i) {
    const ir::Value* old = n->result(i);
    ir::Value* v = copy->result(i);
    if (keep_names && v->name() != old->name()) g.rename(v, old->name());
    if (old->has_meta()) v->set_meta(old->meta());
    map[old] = v;
  }
}

PartitionResult split(const ir::Graph& joint, size_t num_fwd_outputs,
                      const std::unordered_set<const ir::Value*>* saved_only, std::string_view who) {
  const std::string fn(who);
  if (!joint.output_node()) throw PartitionError(fn + ": the joint graph has no output node");
  const std::vector<ir::Value*> outputs = joint.outputs();
  if (num_fwd_outputs > outputs.size())
    throw PartitionError(fn + ": num_fwd_outputs is " + std::to_string(num_fwd_outputs) +
                         " but the joint graph has only " + std::to_string(outputs.size()) + " outputs");
  const ir::GraphSignature& sig = joint.signature();
  const std::vector<ir::Value*> placeholders = joint.placeholders();
  auto is_tangent = [&](size_t i) { return i < sig.inputs.size() && sig.inputs[i].kind == ir::InputKind::Tangent; };

  // Primals, then tangents (Note [Joint graph contract]).
  std::vector<size_t> primals, tangents;
  for (size_t i = 0; i < placeholders.size(); ++i) {
    if (is_tangent(i)) {
      tangents.push_back(i);
    } else {
      if (!tangents.empty())
        throw PartitionError(fn + ": primal placeholder %" + placeholders[i]->name() + " follows tangent %" +
                             placeholders[tangents.front()]->name() +
                             "; a joint graph lists all primals before its tangents");
      primals.push_back(i);
    }
  }

  // Nodes that depend on a tangent, in one forward sweep.
  std::unordered_set<const ir::Node*> tangent_dependent;
  for (size_t i : tangents) tangent_dependent.insert(placeholders[i]->node());
  for (const ir::Node* n : joint.nodes()) {
    if (!n->is_call()) continue;
    for (const ir::Value* v : n->inputs())
      if (tangent_dependent.count(v->node())) {
        tangent_dependent.insert(n);
        break;
      }
  }

  // The forward part: every primal, and everything the forward outputs need.
  std::unordered_set<const ir::Node*> forward;
  for (size_t i : primals) forward.insert(placeholders[i]->node());
  std::vector<const ir::Node*> stack;
  for (size_t i = 0; i < num_fwd_outputs; ++i) stack.push_back(outputs[i]->node());
  if (saved_only)
    for (const ir::Value* v : *saved_only) stack.push_back(v->node());  // the forward computes what it saves
  while (!stack.empty()) {
    const ir::Node* n = stack.back();
    stack.pop_back();
    if (n->is_placeholder() && tangent_dependent.count(n)) {
      throw PartitionError(fn + ": a forward output depends on tangent %" + n->result()->name() +
                           "; forward outputs must be computable from the primals alone (is num_fwd_outputs = " +
                           std::to_string(num_fwd_outputs) + " right?)");
    }
    if (!forward.insert(n).second && !n->is_placeholder()) continue;
    for (const ir::Value* v : n->inputs()) stack.push_back(v->node());
  }

  // The backward part: walk back from the gradients, stopping at forward
  // tensors (saved) and tangents; forward non-tensors are recomputed.
  // See Note [Default partition].
  std::unordered_set<const ir::Value*> saved;
  std::unordered_set<const ir::Value*> saved_symbols;
  std::unordered_set<const ir::Node*> backward;
  std::vector<const ir::Value*> value_stack(outputs.begin() + static_cast<std::ptrdiff_t>(num_fwd_outputs),
                                            outputs.end());
  while (!value_stack.empty()) {
    const ir::Value* v = value_stack.back();
    value_stack.pop_back();
    const ir::Node* n = v->node();
    if (n->is_placeholder() && tangent_dependent.count(n)) continue;  // a tangent
    if (forward.count(n) && !n->is_constant()) {
      // A chosen set saves only its own values (and primals, which nothing
      // can recompute); the rest of the forward is recomputed here.
      if (v->is_tensor() && (!saved_only || saved_only->count(v) || n->is_placeholder())) {
        saved.insert(v);
        continue;
      }
      if (!v->is_tensor()) saved_symbols.insert(v);
    }
    if (!backward.insert(n).second) continue;
    for (const ir::Value* in : n->inputs()) value_stack.push_back(in);
  }

  PartitionResult result;
  result.num_fwd_outputs = num_fwd_outputs;

  // Forward graph.
  ValueMap fmap;
  for (size_t i : primals) {
    const ir::Value* p = placeholders[i];
    fmap[p] =
        result.forward.add_placeholder(p->name(), p->meta(), i < sig.inputs.size() ? sig.inputs[i] : ir::InputSpec{});
  }
  std::vector<const ir::Value*> saved_in_order;
  for (const ir::Node* n : joint.nodes()) {
    if (forward.count(n) && !n->is_placeholder() && !n->is_output()) copy_node(n, result.forward, fmap);
    for (size_t r = 0; r < n->num_results(); ++r) {
      if (saved.count(n->result(r))) saved_in_order.push_back(n->result(r));
      if (saved_symbols.count(n->result(r))) result.saved_symbols.push_back(n->result(r)->name());
    }
  }
  std::vector<ir::Value*> fwd_outs;
  for (size_t i = 0; i < num_fwd_outputs; ++i) fwd_outs.push_back(fmap.at(outputs[i]));
  for (const ir::Value* v : saved_in_order) {
    fwd_outs.push_back(fmap.at(v));
    result.saved_values.push_back(v->name());
  }
  result.forward.set_output(fwd_outs);
  for (size_t i = 0; i < fwd_outs.size(); ++i)
    result.forward.signature().outputs[i] = i < num_fwd_outputs && i < sig.outputs.size()
                                                ? sig.outputs[i]
                                                : ir::OutputSpec{ir::OutputKind::SavedValue, std::nullopt};

  // Backward graph.
  ValueMap bmap;
  for (const ir::Value* v : saved_in_order)
    bmap[v] = result.backward.add_placeholder(v->name(), v->meta(),
                                              ir::InputSpec{ir::InputKind::SavedValue, v->name(), std::nullopt});
  for (size_t i : tangents) {
    const ir::Value* p = placeholders[i];
    bmap[p] = result.backward.add_placeholder(p->name(), p->meta(), sig.inputs[i]);
  }
  for (const ir::Node* n : joint.nodes())
    if (backward.count(n) && !n->is_placeholder()) copy_node(n, result.backward, bmap);
  std::vector<ir::Value*> bwd_outs;
  for (size_t i = num_fwd_outputs; i < outputs.size(); ++i) bwd_outs.push_back(bmap.at(outputs[i]));
  result.backward.set_output(bwd_outs);
  for (size_t i = num_fwd_outputs; i < outputs.size(); ++i) {
    const ir::OutputSpec spec = i < sig.outputs.size() ? sig.outputs[i] : ir::OutputSpec{ir::OutputKind::Gradient, {}};
    result.backward.signature().outputs[i - num_fwd_outputs] = spec;
    if (!spec.input_index)
      throw PartitionError(fn + ": output " + std::to_string(i) + " (%" + outputs[i]->name() +
                           ") follows the forward outputs but names no input_index; mark gradients with "
                           "OutputKind::Gradient and the primal's placeholder index");
    result.gradient_inputs.push_back(*spec.input_index);
  }
  return result;
}

}  // namespace crucible::partitioner::detail
