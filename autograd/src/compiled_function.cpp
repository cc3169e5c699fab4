#include "compiled_function.h"
#include "compile_record.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <crucible/autograd/error.h>

namespace crucible::autograd::detail {

const ir::CompiledFn& CompiledGraphs::compiled_backward(const std::vector<at::Tensor>& example_inputs) {
  std::call_once(backward_compiled, [&] {
    // The lazy part of the compilation: a "compile" of its own (Note [Compilation stages]).
    ir::StageScope compile(instruments,
                           ir::StageEvent{.stage = "compile", .id = compile_id, .detail = "first backward"});
    try {
      backward = run_backend(instruments, "bw_compiler", "backward", bw_compiler, cache, compiler_key, "backward",
                             backward_graph, example_inputs)
                     .fn;
    } catch (const std::exception& e) {
      compile.failed(e.what());
      throw;
    }
    compile.done({});
  });
  return backward;
}

torch::autograd::variable_list NoDoubleBackward::forward(torch::autograd::AutogradContext* ctx,
                                                         const std::string& compile_id,
                                                         at::TensorList /*backward_inputs*/, at::TensorList grads) {
  ctx->saved_data["compile_id"] = compile_id;
  torch::autograd::variable_list out;
  for (const at::Tensor& g : grads) out.push_back(g.defined() ? g.view_as(g) : g);
  return out;
}

torch::autograd::variable_list NoDoubleBackward::backward(torch::autograd::AutogradContext* ctx,
                                                          torch::autograd::variable_list /*grad_outputs*/) {
  throw AotError("compilation " + ctx->saved_data.at("compile_id").toStringRef() +
                 ": double backward through a compiled function is not supported (its backward was compiled "
                 "without a graph of its own to differentiate); compute the second derivative eagerly");
}

torch::autograd::variable_list CompiledFunction::forward(torch::autograd::AutogradContext* ctx,
                                                         const c10::intrusive_ptr<CompiledGraphs>& graphs,
                                                         at::TensorList primals) {
  std::vector<at::Tensor> args(primals.begin(), primals.end());
  std::vector<at::Tensor> results = graphs->forward(args);
  const auto num_outs = static_cast<std::ptrdiff_t>(graphs->num_fwd_outputs);
  std::vector<at::Tensor> outs(results.begin(), results.begin() + num_outs);
  // Saved values that are views (of an input, or of each other) are saved
  // detached, as the seed's CompiledFunction does: autograd then keeps no
  // view-replay information for them.
  // A detached tensor shares its version counter, so writing the input
  // before the backward fails the backward, as it does in eager.
  torch::autograd::variable_list saved;
  saved.reserve(results.size() - graphs->num_fwd_outputs);
  for (auto it = results.begin() + num_outs; it != results.end(); ++it)
    saved.push_back(it->is_view() ? it->detach() : *it);
  ctx->save_for_backward(saved);
  ctx->saved_data["graphs"] = c10::IValue::make_capsule(graphs);
  // A backend may return one tensor for two outputs (a mutated input's new
  // value that is also a user output) or return an input; autograd needs a
  // distinct tensor per output of the Function.
  for (size_t i = 0; i < outs.size(); ++i) {
    bool seen = false;
    for (size_t j = 0; j < i && !seen; ++j) seen = outs[j].is_same(outs[i]);
    for (size_t j = 0; j < primals.size() && !seen; ++j) seen = primals[j].is_same(outs[i]);
    if (seen) outs[i] = outs[i].clone();
  }
  torch::autograd::variable_list non_diff;
  for (size_t i = 0; i < outs.size(); ++i)
    if (!graphs->differentiable_outputs[i]) non_diff.push_back(outs[i]);
  if (!non_diff.empty()) ctx->mark_non_differentiable(non_diff);
  return outs;
}

torch::autograd::variable_list CompiledFunction::backward(torch::autograd::AutogradContext* ctx,
                                                          torch::autograd::variable_list grad_outputs) {
  auto graphs = c10::static_intrusive_pointer_cast<CompiledGraphs>(ctx->saved_data.at("graphs").toCapsule());
  std::vector<at::Tensor> inputs = ctx->get_saved_variables();
  for (size_t t = 0; t < graphs->tangent_outputs.size(); ++t) {
    const at::Tensor& g = grad_outputs.at(graphs->tangent_outputs[t]);
    const ir::TensorMeta& m = graphs->tangent_meta[t];
    // The backward graph was traced with contiguous tangents, and one for
    // every output with a gradient; see Note [AOT dispatch].
    inputs.push_back(g.defined() ? g.contiguous()
                                 : at::zeros(m.sizes, at::TensorOptions().dtype(m.dtype).device(m.device)));
  }
  const ir::CompiledFn& bw = graphs->compiled_backward(inputs);
  // See Note [Double backward]: create_graph runs the backward in grad mode.
  const bool create_graph = at::GradMode::is_enabled();
  const std::vector<at::Tensor> backward_inputs =
      create_graph ? inputs : std::vector<at::Tensor>{};  // bw may steal them
  std::vector<at::Tensor> grads;
  {
    // See Note [Autocast in compiled graphs].
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    at::NoGradGuard no_grad;
    grads = bw(inputs);
  }
  if (create_graph)
    grads = NoDoubleBackward::apply(graphs->compile_id, at::TensorList(backward_inputs), at::TensorList(grads));
  // One entry per forward() argument: the graphs capsule, then each primal.
  torch::autograd::variable_list result(1 + graphs->num_primals);
  for (size_t i = 0; i < grads.size(); ++i) result[1 + graphs->gradient_inputs[i]] = grads[i];
  return result;
}

}  // namespace crucible::autograd::detail
