#include <crucible/autograd/runtime_wrapper.h>

#include "metadata_mutation.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <memory>

namespace crucible::autograd {

namespace {

// What the epilogue does, computed once per compilation.
struct EpiloguePlan {
  bool trace_joint = false;
  std::vector<size_t> detach;
  struct Mutation {
    size_t input;
    InputAliasInfo info;
    std::optional<size_t> new_value;  // graph output holding the new data
  };
  std::vector<Mutation> mutations;
  std::vector<size_t> graph_output_of;  // per user output: its graph output (computed ones)
  size_t first_base = 0;                // graph output of intermediate base 0
  std::vector<OutputAliasInfo> outputs;
  // (input, graph output): gradients to accumulate into the input's .grad.
  std::vector<std::pair<size_t, size_t>> gradients;
  bool needs_inputs = false;  // the epilogue reads the caller's inputs
};

at::Tensor patch_requires_grad(at::Tensor t, const OutputAliasInfo& info) {
  return !info.meta.requires_grad && t.requires_grad() ? t.detach() : t;
}

// `base`'s whole storage as a flat tensor of `dtype`, from the storage's
// first byte (offset 0), or `base` itself for its own dtype. See Note [Views
// with another dtype].
at::Tensor reinterpret(const at::Tensor& base, c10::ScalarType dtype) {
  if (base.scalar_type() == dtype) return base;
  const int64_t numel = static_cast<int64_t>(base.storage().nbytes()) / static_cast<int64_t>(base.element_size());
  return base.as_strided({numel}, {1}, 0).view(dtype);
}

// The storage offset of `base` in elements of `dtype`.
int64_t offset_in(const at::Tensor& base, int64_t base_offset, c10::ScalarType dtype) {
  return base_offset * static_cast<int64_t>(base.element_size()) / static_cast<int64_t>(c10::elementSize(dtype));
}

// A view of `base` with the geometry of the graph's `view` when that really
// views `base`, else with the recorded metadata. See Note [Regenerating aliased outputs].
at::Tensor regenerate_from(const at::Tensor& base, const at::Tensor& view, const OutputAliasInfo& info) {
  const at::Tensor typed = reinterpret(base, info.meta.dtype);
  if (view.defined() && view.is_alias_of(base))
    return patch_requires_grad(typed.as_strided(view.sizes(), view.strides(), view.storage_offset()), info);
  return patch_requires_grad(
      typed.as_strided(info.meta.sizes, info.meta.strides,
                       offset_in(base, base.storage_offset(), info.meta.dtype) + info.offset_delta),
      info);
}

std::vector<at::Tensor> run_epilogue(const EpiloguePlan& plan, const ir::CompiledFn& compiled,
                                     std::vector<at::Tensor>& args) {
  // The compiled callable may steal its arguments: keep what the epilogue reads.
  std::vector<at::Tensor> inputs;
  std::vector<int64_t> offsets;
  if (plan.needs_inputs) {
    inputs = args;
    offsets.reserve(inputs.size());
    for (const at::Tensor& t : inputs) offsets.push_back(t.defined() ? t.storage_offset() : 0);
  }
  for (size_t i : plan.detach) args[i] = args[i].detach();
  std::vector<at::Tensor> outs;
  {
    // See Note [Autocast in compiled graphs].
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    if (plan.trace_joint) {
      outs = compiled(args);
    } else {
      at::NoGradGuard no_grad;
      outs = compiled(args);
    }
  }
  for (const EpiloguePlan::Mutation& m : plan.mutations) {
    at::Tensor& t = inputs[m.input];
    if (m.info.mutates_metadata)
      detail::apply_metadata(t, m.info.final_sizes, m.info.final_strides, offsets[m.input] + m.info.final_offset_delta);
    if (m.new_value) {
      if (m.info.mutations_under_no_grad || !m.info.requires_grad || !plan.trace_joint) {
        at::NoGradGuard no_grad;
        t.copy_(outs[*m.new_value]);
      } else {
        t.copy_(outs[*m.new_value]);
      }
    }
  }
  // See Note [Gradients a function accumulates].
  for (const auto& [input, output] : plan.gradients) {
    const at::Tensor& t = inputs[input];
    at::NoGradGuard no_grad;
    if (t.grad().defined())
      t.mutable_grad().add_(outs[output]);
    else
      t.mutable_grad() = std::move(outs[output]);
  }
  std::vector<at::Tensor> user(plan.outputs.size());
  // Outputs the graph computes first: the aliases of outputs need them.
  for (size_t k = 0; k < plan.outputs.size(); ++k) {
    const OutputAliasInfo& info = plan.outputs[k];
    switch (info.output_type) {
      case OutputType::non_alias:
        user[k] = std::move(outs[plan.graph_output_of[k]]);
        break;
      case OutputType::is_input:
        user[k] = inputs[*info.base_idx];
        break;
      case OutputType::alias_of_input: {
        const at::Tensor& base = inputs[*info.base_idx];
        user[k] = patch_requires_grad(
            reinterpret(base, info.meta.dtype)
                .as_strided(info.meta.sizes, info.meta.strides,
                            offset_in(base, offsets[*info.base_idx], info.meta.dtype) + info.offset_delta),
            info);
        break;
      }
      case OutputType::alias_of_intermediate:
        user[k] = plan.trace_joint
                      ? regenerate_from(outs[plan.first_base + *info.base_idx], outs[plan.graph_output_of[k]], info)
                      : std::move(outs[plan.graph_output_of[k]]);
        break;
      case OutputType::alias_of_intermediate_base_is_user_output:
        break;  // below
    }
  }
  for (size_t k = 0; k < plan.outputs.size(); ++k) {
    const OutputAliasInfo& info = plan.outputs[k];
    if (info.output_type != OutputType::alias_of_intermediate_base_is_user_output) continue;
    user[k] = plan.trace_joint ? regenerate_from(user[*info.base_idx], outs[plan.graph_output_of[k]], info)
                               : std::move(outs[plan.graph_output_of[k]]);
  }
  return user;
}

}  // namespace

ir::CompiledFn RuntimeWrapper::post_compile(ir::CompiledFn compiled, const AotRequest& request) {
  const ViewAndMutationMeta& meta = request.fw_metadata;
  auto plan = std::make_shared<EpiloguePlan>();
  plan->trace_joint = request.trace_joint;
  if (request.trace_joint) plan->detach = indices_of_inps_to_detach_;
  plan->outputs = meta.output_info;
  plan->graph_output_of.assign(meta.output_info.size(), 0);
  const std::vector<size_t> computed = meta.graph_computed_outputs();
  for (size_t g = 0; g < computed.size(); ++g) plan->graph_output_of[computed[g]] = g;
  plan->first_base = computed.size();
  size_t next_value = computed.size() + (request.trace_joint ? meta.intermediate_bases.size() : 0);
  for (size_t i : meta.mutated_inp_runtime_indices()) {
    const InputAliasInfo& info = meta.input_info[i];
    std::optional<size_t> value;
    if (info.mutates_data && !info.mutation_in_graph) value = next_value++;
    plan->mutations.push_back({i, info, value});
  }
  for (size_t i : meta.grad_accumulating_inputs()) plan->gradients.emplace_back(i, next_value++);
  bool aliases_input = false;
  for (const OutputAliasInfo& o : meta.output_info)
    aliases_input |= o.output_type == OutputType::is_input || o.output_type == OutputType::alias_of_input;
  plan->needs_inputs = !plan->mutations.empty() || !plan->gradients.empty() || aliases_input;
  return [plan, compiled = std::move(compiled)](std::vector<at::Tensor>& args) {
    return run_epilogue(*plan, compiled, args);
  };
}

}  // namespace crucible::autograd
