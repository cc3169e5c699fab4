#include <crucible/autograd/aot_export.h>
#include <crucible/autograd/aot_module.h>
#include <crucible/autograd/collect_metadata.h>
#include <crucible/autograd/error.h>
#include <crucible/ir/instrument.h>
#include <crucible/runtime/rng_state_guard.h>

#include "graph_capture.h"
#include "module_trace.h"
#include "trace_call.h"
#include "traced_function_transforms.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/module.h>

#include <optional>

namespace crucible::autograd {

namespace {

// "input 3 (fc1.weight)": inputs named as their placeholders will be.
std::string describe_input(const std::vector<std::string>& names, size_t i) {
  return "input " + std::to_string(i) + " (" + names[i] + ")";
}

void check_export_inputs(const ViewAndMutationMeta& meta, const std::vector<at::Tensor>& args,
                         const std::vector<std::string>& names, bool trace_joint) {
  for (size_t i = 0; i < meta.input_info.size(); ++i) {
    const InputAliasInfo& in = meta.input_info[i];
    // The seed refuses this too: an exported graph has no synthetic base to
    // keep two inputs' storage shared while one is written.
    if (in.mutates_data || in.mutates_metadata)
      for (size_t j = 0; j < args.size(); ++j)
        if (j != i && args[j].defined() && args[i].defined() && args[j].has_storage() && args[i].has_storage() &&
            args[j].is_alias_of(args[i]) && !args[j].is_same(args[i]))
          throw AotError("aot_export_module: " + describe_input(names, i) +
                         " is written in place and shares storage "
                         "with " +
                         describe_input(names, j) +
                         "; an exported graph takes its inputs as separate "
                         "tensors: pass copies, or one tensor and compute the other from it inside fn");
    if (in.mutates_metadata)
      throw AotError("aot_export_module: " + describe_input(names, i) +
                     " has its metadata written in place (e.g. transpose_, resize_, as_strided_); export does not "
                     "allow metadata mutations of inputs: return the new view as an output instead");
    if (trace_joint && in.requires_grad && in.mutates_data)
      throw AotError("aot_export_module: " + describe_input(names, i) +
                     " requires grad and its data is written in place; export does not allow that with "
                     "trace_joint (the gradient would be of the value before the write): write a copy of it, or "
                     "detach it first");
  }
}

void check_loss(const ViewAndMutationMeta& meta, size_t loss) {
  const size_t n = meta.output_info.size();
  if (loss >= n)
    throw AotError("aot_export_module: output_loss_index is " + std::to_string(loss) + " but fn returns " +
                   std::to_string(n) + " outputs; give the index of the scalar loss among them");
  const ir::TensorMeta& m = meta.output_info[loss].meta;
  if (!m.requires_grad)
    throw AotError("aot_export_module: the output at index " + std::to_string(loss) +
                   " was marked as the loss, but it does not require gradients; compute it from parameters or "
                   "inputs that require grad, with grad mode on");
  if (m.numel() != 1)
    throw AotError("aot_export_module: the output marked as the loss (at index " + std::to_string(loss) +
                   ") must be a scalar, but it has shape " + ir::to_string(m) + "; reduce it (.mean(), .sum())");
  for (size_t k = 0; k < n; ++k)
    if (k != loss && meta.output_info[k].meta.requires_grad)
      throw AotError("aot_export_module: output " + std::to_string(k) +
                     " requires gradients but is not the loss (index " + std::to_string(loss) +
                     "); the exported backward is of the loss alone, so every other output must not require "
                     "grad: call .detach() on it");
}

}  // namespace

ir::Graph aot_export_module(torch::nn::Module& module, const tracer::ModuleFn& fn, const std::vector<at::Tensor>& args,
                            const AotExportOptions& options) {
  const ir::Instruments& instruments = options.instruments;
  ir::StageScope compile(instruments,
                         ir::StageEvent{.stage = "compile", .id = "export", .detail = "aot_export_module"});
  // Non-owning: the caller keeps the module alive for the call.
  std::shared_ptr<torch::nn::Module> m(std::shared_ptr<torch::nn::Module>(), &module);
  std::vector<at::Tensor> state;
  std::vector<std::string> names;
  for (const tracer::NamedTensor& t : tracer::module_state(module).tensors) {
    state.push_back(t.tensor);
    names.push_back(t.name);
  }
  for (size_t i = 0; i < args.size(); ++i) names.push_back("arg" + std::to_string(i));

  AotRequest request;
  request.flat_fn = detail::module_flat_fn(m, fn);
  request.trace = detail::module_trace(m);
  request.flat_args = state;
  request.flat_args.insert(request.flat_args.end(), args.begin(), args.end());
  request.config.num_params_buffers = state.size();
  request.config.decompositions = options.decompositions;
  request.compile_id = "export";
  request.trace_joint = options.trace_joint;
  if (options.trace_joint && !options.output_loss_index)
    throw AotError(
        "aot_export_module: trace_joint is set, so one output of fn must be a scalar loss; say which "
        "with AotExportOptions::output_loss_index");
  runtime::RngStateGuard keep_rng;  // See Note [RNG during compilation].
  std::optional<at::NoGradGuard> no_grad;
  if (!options.trace_joint) no_grad.emplace();
  request.fw_metadata = collect_metadata(request, options.trace_joint);
  const ViewAndMutationMeta& meta = request.fw_metadata;
  check_export_inputs(meta, request.flat_args, names, options.trace_joint);
  if (options.trace_joint) check_loss(meta, *options.output_loss_index);

  std::vector<size_t> written;
  for (size_t i = 0; i < meta.input_info.size(); ++i)
    if (meta.input_info[i].mutates_data) written.push_back(i);
  // Parameters to differentiate: those requiring grad, each tensor once.
  std::vector<size_t> wrt;
  if (options.trace_joint)
    for (size_t i = 0; i < request.flat_args.size(); ++i) {
      if (!request.flat_args[i].requires_grad()) continue;
      bool repeated = false;
      for (size_t j = 0; j < i && !repeated; ++j) repeated = request.flat_args[j].is_same(request.flat_args[i]);
      if (!repeated) wrt.push_back(i);
    }
  std::vector<size_t> grad_of;
  auto body = [&](const std::vector<at::Tensor>& traced) {
    std::vector<at::Tensor> outs = request.flat_fn(traced);
    std::vector<at::Tensor> ret;
    for (size_t i : written) ret.push_back(traced[i]);
    ret.insert(ret.end(), outs.begin(), outs.end());
    grad_of.clear();
    if (options.trace_joint && !wrt.empty()) {
      torch::autograd::variable_list inputs;
      for (size_t i : wrt) inputs.push_back(traced[i]);
      // The backward starts from the scalar loss with gradient 1: no tangents.
      const torch::autograd::variable_list grads =
          torch::autograd::grad({outs[*options.output_loss_index]}, inputs, {}, /*retain_graph=*/false,
                                /*create_graph=*/false, /*allow_unused=*/true);
      for (size_t k = 0; k < grads.size(); ++k)
        if (grads[k].defined()) {
          ret.push_back(grads[k]);
          grad_of.push_back(wrt[k]);
        }
    }
    return ret;
  };
  ir::StageScope stage(instruments, ir::StageEvent{.stage = "export"});
  ir::Graph g = detail::trace_functionalized(request, body, request.flat_args, "export").graph;
  const size_t num_outputs = written.size() + meta.output_info.size();
  detail::keep_first_outputs(g, num_outputs + grad_of.size());
  std::vector<ir::OutputSpec>& specs = g.signature().outputs;
  for (size_t w = 0; w < written.size(); ++w) specs[w] = ir::OutputSpec{ir::OutputKind::MutatedInput, written[w]};
  for (size_t k = 0; k < meta.output_info.size(); ++k)
    specs[written.size() + k] = ir::OutputSpec{
        options.trace_joint && k == *options.output_loss_index ? ir::OutputKind::Loss : ir::OutputKind::UserOutput,
        std::nullopt};
  for (size_t k = 0; k < grad_of.size(); ++k)
    specs[num_outputs + k] = ir::OutputSpec{ir::OutputKind::Gradient, grad_of[k]};
  stage.done(ir::StageEvent{.stage = "export", .graphs = {{"export", &g}}});
  compile.done({});
  return g;
}

ir::Graph aot_export_joint_simple(const tracer::TensorFn& fn, const std::vector<at::Tensor>& args, bool trace_joint,
                                  const tracer::DecompositionTable& decompositions) {
  AotRequest request;
  request.flat_fn = fn;
  request.trace = detail::function_trace();
  request.flat_args = args;
  request.config.decompositions = decompositions;
  request.compile_id = "export";
  request.trace_joint = trace_joint;
  runtime::RngStateGuard keep_rng;  // See Note [RNG during compilation].
  std::optional<at::NoGradGuard> no_grad;
  if (!trace_joint) no_grad.emplace();
  request.fw_metadata = collect_metadata(request, trace_joint);
  const ViewAndMutationMeta& meta = request.fw_metadata;
  for (size_t i = 0; i < meta.input_info.size(); ++i)
    if (meta.input_info[i].mutates_data || meta.input_info[i].mutates_metadata)
      throw AotError("aot_export_joint_simple: input " + std::to_string(i) +
                     " is written in place; this export keeps the function's calling convention, which has no "
                     "place for input mutations: return the new value instead, or use aot_export_module");
  for (size_t k = 0; k < meta.output_info.size(); ++k) {
    const OutputAliasInfo& o = meta.output_info[k];
    if (o.output_type != OutputType::non_alias)
      throw AotError("aot_export_joint_simple: output " + std::to_string(k) + " is " +
                     std::string(to_string(o.output_type)) +
                     (o.base_idx ? " (of " + std::to_string(*o.base_idx) + ")" : std::string()) +
                     "; this export keeps the function's calling convention, which has no place for outputs that "
                     "alias inputs or other outputs: return a copy (.clone())");
  }
  return trace_joint ? detail::create_joint_graph(request).graph : detail::create_inference_graph(request);
}

}  // namespace crucible::autograd
