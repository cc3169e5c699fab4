#include "trace_session.h"

#include <crucible/tracer/error.h>
#include <crucible/tracer/functional_call.h>

#include <torch/nn/module.h>

#include <unordered_map>

namespace crucible::tracer {

// Note [Swapping module state]
// A torch::nn module reads its tensors through members (Linear::weight) that
// share their TensorImpl with the entries of named_parameters(), so replacing
// the dictionary entries would change nothing the forward reads. Instead the
// tracer swaps what the TensorImpl holds: Tensor::set_data points each
// parameter and buffer at the traced copy (same sizes, strides and dtype; a
// meta tensor in fake mode), and the original storage and metadata, kept in
// a shallow copy, are put back afterwards. Gradients are detached for the
// trace (so a .backward() inside it starts from none and never accumulates
// into the module's) and restored with the data. Restoring runs in the
// trace's teardown, which also runs when tracing throws.
namespace {

struct SavedState {
  at::Tensor tensor;  // shares the module's TensorImpl
  at::Tensor data;    // the original storage and metadata
  at::Tensor grad;
};

// Tensor::set_data refuses to turn a CPU tensor into a meta one (fake mode),
// so the swap between devices copies the TensorImpl's metadata directly,
// which is what set_data does once its checks pass.
void swap_data(const at::Tensor& t, const at::Tensor& data) {
  if (t.device() == data.device())
    t.set_data(data);
  else
    t.unsafeGetTensorImpl()->shallow_copy_from(data.getIntrusivePtr());
}

}  // namespace

TraceResult functional_call(torch::nn::Module& module, const ModuleFn& fn, const std::vector<at::Tensor>& example_inputs,
                            const ModuleTraceOptions& options) {
  std::vector<detail::TraceInput> inputs;
  std::vector<at::Tensor> state;  // the module's tensors, one per state input
  std::unordered_map<const c10::TensorImpl*, size_t> first;
  auto lift = [&](const std::string& fqn, const at::Tensor& t, ir::InputKind kind) {
    if (!t.defined()) return;
    ir::InputSpec spec{kind, fqn, std::nullopt};
    if (auto it = first.find(t.unsafeGetTensorImpl()); it != first.end())
      spec.duplicate_of = it->second;
    else
      first.emplace(t.unsafeGetTensorImpl(), inputs.size());
    inputs.push_back({t, fqn, std::move(spec)});
    state.push_back(t);
  };
  for (const auto& p : module.named_parameters(/*recurse=*/true)) lift(p.key(), p.value(), ir::InputKind::Parameter);
  for (const auto& b : module.named_buffers(/*recurse=*/true)) lift(b.key(), b.value(), ir::InputKind::Buffer);
  const size_t num_state = inputs.size();
  for (size_t i = 0; i < example_inputs.size(); ++i)
    inputs.push_back({example_inputs[i], "arg" + std::to_string(i), ir::InputSpec{}});

  // See Note [Swapping module state].
  std::vector<SavedState> saved;
  detail::TraceHooks hooks;
  hooks.setup = [&](const std::vector<at::Tensor>& traced) {
    for (size_t i = 0; i < num_state; ++i) {
      if (inputs[i].spec.duplicate_of) continue;
      const at::Tensor& t = state[i];
      saved.push_back({t, t.variable_data(), t.grad()});
      if (t.grad().defined()) t.mutable_grad() = at::Tensor();
      swap_data(t, traced[i]);
    }
  };
  hooks.teardown = [&] {
    for (SavedState& s : saved) {
      swap_data(s.tensor, s.data);
      if (s.grad.defined() || s.tensor.grad().defined()) s.tensor.mutable_grad() = s.grad;
    }
  };
  hooks.body = [&](const std::vector<at::Tensor>& traced) {
    std::vector<at::Tensor> args(traced.begin() + static_cast<std::ptrdiff_t>(num_state), traced.end());
    std::vector<detail::TraceOutput> outs;
    for (at::Tensor& t : fn(module, args)) outs.push_back({std::move(t), ir::OutputSpec{}});
    if (options.gradients_as_outputs) {
      for (size_t i = 0; i < num_state; ++i) {
        if (inputs[i].spec.kind != ir::InputKind::Parameter || inputs[i].spec.duplicate_of) continue;
        if (at::Tensor g = state[i].grad(); g.defined())
          outs.push_back({g, ir::OutputSpec{ir::OutputKind::Gradient, i}});
      }
    }
    return outs;
  };
  return detail::trace(inputs, hooks, options.trace);
}

}  // namespace crucible::tracer
