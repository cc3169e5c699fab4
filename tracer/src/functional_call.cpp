#include "trace_session.h"

#include <crucible/tracer/error.h>
#include <crucible/tracer/functional_call.h>

#include <torch/nn/module.h>

#include <unordered_map>

namespace crucible::tracer {

TraceResult functional_call(torch::nn::Module& module, const ModuleFn& fn,
                            const std::vector<at::Tensor>& example_inputs, const ModuleTraceOptions& options) {
  // Module state is reached: Note [Swapping reached tensors] in trace_session.cpp.
  std::vector<detail::TraceInput> inputs;
  std::unordered_map<const c10::TensorImpl*, size_t> first;
  auto lift = [&](const std::string& fqn, const at::Tensor& t, ir::InputKind kind) {
    ir::InputSpec spec{kind, fqn, std::nullopt};
    if (auto it = first.find(t.unsafeGetTensorImpl()); it != first.end())
      spec.duplicate_of = it->second;
    else
      first.emplace(t.unsafeGetTensorImpl(), inputs.size());
    inputs.push_back({t, fqn, std::move(spec), /*reached=*/true});
  };
  const ModuleState state = module_state(module);
  for (size_t i = 0; i < state.tensors.size(); ++i)
    lift(state.tensors[i].name, state.tensors[i].tensor,
         i < state.num_parameters ? ir::InputKind::Parameter : ir::InputKind::Buffer);
  const size_t num_state = inputs.size();
  for (size_t i = 0; i < example_inputs.size(); ++i)
    inputs.push_back({example_inputs[i], "arg" + std::to_string(i), ir::InputSpec{}});
  detail::mark_lifted_inputs(inputs, num_state, options.trace);

  detail::TraceHooks hooks;
  hooks.body = [&](const std::vector<at::Tensor>& traced) {
    std::vector<at::Tensor> args(traced.begin() + static_cast<std::ptrdiff_t>(num_state), traced.end());
    std::vector<detail::TraceOutput> outs;
    for (at::Tensor& t : fn(module, args)) outs.push_back({std::move(t), ir::OutputSpec{}});
    return outs;
  };
  hooks.parameter_gradients = options.gradients_as_outputs;
  return detail::trace(inputs, hooks, options.trace);
}

ModuleState module_state(const torch::nn::Module& module, const std::string& prefix) {
  ModuleState state;
  const std::string dot = prefix.empty() ? "" : prefix + ".";
  for (const auto& p : module.named_parameters(/*recurse=*/true))
    if (p.value().defined()) state.tensors.push_back({dot + p.key(), p.value()});
  state.num_parameters = state.tensors.size();
  for (const auto& b : module.named_buffers(/*recurse=*/true))
    if (b.value().defined()) state.tensors.push_back({dot + b.key(), b.value()});
  return state;
}

}  // namespace crucible::tracer
