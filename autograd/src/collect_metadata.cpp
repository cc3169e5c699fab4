#include <crucible/autograd/collect_metadata.h>
#include <crucible/autograd/error.h>
#include <crucible/ir/error.h>

#include "lift_inputs.h"
#include "trace_cache.h"
#include "trace_call.h"

#include <ATen/ATen.h>
#include <ATen/FunctionalTensorWrapper.h>

#include <memory>

namespace crucible::autograd {

namespace {

bool shares_storage(const at::Tensor& a, const at::Tensor& b) {
  return a.has_storage() && b.has_storage() && a.storage().is_alias_of(b.storage());
}

// Fills meta.output_info and the intermediate bases from the outputs of one
// run. `args` are the tensors the function received, `offsets` their storage
// offsets before it ran. See Note [Metadata analysis].
void classify_outputs(const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& args,
                      const std::vector<int64_t>& offsets, ViewAndMutationMeta& meta) {
  std::vector<at::Tensor> bases;  // intermediate bases, in order of first use
  for (size_t k = 0; k < outs.size(); ++k) {
    const at::Tensor& o = outs[k];
    OutputAliasInfo info;
    info.meta = ir::TensorMeta::of(o);
    // The offset from the base's, in the output's elements (Note [Views with another dtype]).
    auto alias_of = [&](const at::Tensor& base, int64_t base_offset, const char*, size_t) {
      info.offset_delta = o.storage_offset() - base_offset * base.element_size() / o.element_size();
    };
    for (size_t j = 0; j < args.size() && info.output_type == OutputType::non_alias; ++j) {
      if (o.is_same(args[j])) {
        info.output_type = OutputType::is_input;
        info.base_idx = j;
      } else if (shares_storage(o, args[j])) {
        info.output_type = OutputType::alias_of_input;
        info.base_idx = j;
        alias_of(args[j], offsets[j], "input", j);
      }
    }
    if (info.output_type == OutputType::non_alias) {
      // The same tensor as an earlier output, or a view (its base is the root
      // of the view chain, never itself a view): of an output, or of an
      // intermediate.
      at::Tensor base;
      for (size_t m = 0; m < k && !base.defined(); ++m)
        if (o.is_same(outs[m])) base = outs[m];
      if (!base.defined() && o.is_view()) base = at::Tensor(o._base());
      if (base.defined()) {
        size_t m = 0;
        while (m < outs.size() && (m == k || !base.is_same(outs[m]))) ++m;
        if (m < outs.size()) {
          info.output_type = OutputType::alias_of_intermediate_base_is_user_output;
          info.base_idx = m;
        } else {
          size_t b = 0;
          while (b < bases.size() && !bases[b].is_same(base)) ++b;
          if (b == bases.size()) {
            bases.push_back(base);
            meta.intermediate_bases.push_back(ir::TensorMeta::of(base));
          }
          info.output_type = OutputType::alias_of_intermediate;
          info.base_idx = b;
        }
        alias_of(base, base.storage_offset(), "intermediate", *info.base_idx);
      }
    }
    meta.output_info.push_back(std::move(info));
  }
  // An output regenerated from another output needs that one to be computed
  // by the graph as it is.
  for (const OutputAliasInfo& info : meta.output_info)
    if (info.output_type == OutputType::alias_of_intermediate_base_is_user_output &&
        meta.output_info[*info.base_idx].output_type != OutputType::non_alias)
      throw AotError("output " + std::to_string(*info.base_idx) +
                     " is returned twice or viewed by another output, and is itself an alias; return a copy of "
                     "one of them (.clone())");
}

ViewAndMutationMeta analyze(const AotRequest& request, bool is_train, std::vector<tracer::NamedTensor>* lifted,
                            std::optional<ir::GraphHash>* graph_hash) {
  const std::vector<at::Tensor>& flat_args = request.flat_args;
  const size_t n = flat_args.size();
  const std::vector<bool> reached = detail::reached_inputs(request);
  ViewAndMutationMeta meta;
  meta.is_train = is_train;
  std::optional<at::NoGradGuard> no_grad;
  if (!is_train) no_grad.emplace();

  // It may run twice (Note [Auto trace mode]): each run starts afresh.
  auto body = [&](const std::vector<at::Tensor>& ins) {
    meta.input_info.assign(n, InputAliasInfo{});
    for (size_t i = 0; i < n; ++i) {
      meta.input_info[i].requires_grad = flat_args[i].requires_grad();
      meta.input_info[i].is_leaf = flat_args[i].is_leaf();
    }
    meta.output_info.clear();
    meta.intermediate_bases.clear();
    std::vector<at::Tensor> args = ins;
    std::vector<std::shared_ptr<torch::autograd::Node>> grad_fn_before(n);
    for (size_t i = 0; i < n; ++i) {
      if (!reached[i] && is_train && meta.input_info[i].requires_grad && !meta.input_info[i].is_leaf) {
        args[i] = ins[i].clone();
        grad_fn_before[i] = args[i].grad_fn();
      }
    }
    std::vector<int64_t> offsets(n);
    for (size_t i = 0; i < n; ++i) offsets[i] = args[i].storage_offset();
    std::vector<at::Tensor> outs = request.flat_fn(args);
    for (size_t i = 0; i < n; ++i)
      if (!reached[i] && args[i].defined() && args[i].is_leaf() && args[i].grad().defined())
        throw AotError("compilation " + request.compile_id + ": the function accumulates a gradient into input " +
                       std::to_string(i) +
                       "'s .grad (a .backward() inside it); a compiled function can return the gradients it "
                       "computes but not write them into a tensor passed as an argument: use "
                       "torch::autograd::grad and return the gradient, or read the tensor from a module");
    for (size_t i = 0; i < n; ++i) {
      if (!at::functionalization::impl::isFunctionalTensor(args[i])) continue;  // module state: below
      at::functionalization::impl::sync(args[i]);
      auto* w = at::functionalization::impl::unsafeGetFunctionalWrapper(args[i]);
      InputAliasInfo& info = meta.input_info[i];
      info.mutates_data = w->has_data_mutation();
      info.mutates_metadata = w->has_metadata_mutation();
      if (info.mutates_metadata) {
        info.final_sizes = args[i].sizes().vec();
        info.final_strides = args[i].strides().vec();
        info.final_offset_delta = args[i].storage_offset() - offsets[i];
      }
      if (info.mutates_data && info.requires_grad)
        info.mutations_under_no_grad = info.is_leaf || !is_train || args[i].grad_fn() == grad_fn_before[i];
    }
    classify_outputs(outs, args, offsets, meta);
    return outs;
  };
  tracer::TraceResult traced =
      detail::trace_functionalized(request, body, flat_args, "metadata analysis", /*allow_lifting=*/true);
  if (graph_hash) {
    try {
      *graph_hash = ir::graph_hash(traced.graph);
    } catch (const ir::IrError&) {  // a constant no key can hold: nothing is cached
      graph_hash->reset();
    }
  }
  for (size_t i = 0; i < n && i < traced.input_mutations.size(); ++i) {
    if (!reached[i]) continue;  // the others were read from their functional wrappers above
    const tracer::InputMutation& m = traced.input_mutations[i];
    const ir::InputSpec& spec = traced.graph.signature().inputs[i];
    if (m.metadata)
      throw AotError(std::string(spec.kind == ir::InputKind::Lifted ? "lifted tensor " : "module state input ") +
                     std::to_string(i) + " (" + spec.target +
                     ") has its sizes or strides changed in place; compiled functions cannot do that: assign a "
                     "new tensor outside the compiled call instead");
    InputAliasInfo& info = meta.input_info[i];
    info.mutates_data = m.data;
    // A parameter is a leaf that requires grad: eager allows writing it only under no_grad.
    info.mutations_under_no_grad = m.data && info.requires_grad;
  }
  // See Note [Gradients a function accumulates].
  for (const ir::OutputSpec& spec : traced.graph.signature().outputs)
    if (spec.kind == ir::OutputKind::Gradient && *spec.input_index < n)
      meta.input_info[*spec.input_index].accumulates_grad = true;
  if (!traced.lifted.empty()) {
    if (!lifted)
      throw AotError("compilation " + request.compile_id + ": the function read a tensor " +
                     std::string(c10::toString(traced.lifted[0].tensor.scalar_type())) +
                     c10::str(traced.lifted[0].tensor.sizes()) +
                     " from outside its arguments (a captured or global tensor, another module's state); an "
                     "exported graph takes every tensor it reads as an input: pass it as an argument, or "
                     "register it as a buffer of the module");
    for (const tracer::LiftedTensor& l : traced.lifted)
      lifted->push_back({traced.graph.signature().inputs[l.input_index].target, l.tensor});
  }
  return meta;
}

}  // namespace

ViewAndMutationMeta collect_metadata(const AotRequest& request, bool is_train, std::vector<tracer::NamedTensor>* lifted,
                                     std::optional<ir::GraphHash>* graph_hash) {
  return detail::fingerprinted_analysis(
      request, lifted, graph_hash,
      [is_train](const AotRequest& r, std::vector<tracer::NamedTensor>* l, std::optional<ir::GraphHash>* h) {
        return analyze(r, is_train, l, h);
      });
}

}  // namespace crucible::autograd
