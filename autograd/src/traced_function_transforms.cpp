#include "traced_function_transforms.h"

#include <ATen/ATen.h>

namespace crucible::autograd::detail {

std::vector<at::Tensor> fresh_inputs(const std::vector<at::Tensor>& args, const ViewAndMutationMeta& meta,
                                     const std::vector<bool>& reached, bool for_autograd) {
  std::vector<at::Tensor> fresh = args;
  for (size_t i = 0; i < args.size(); ++i) {
    if (i < reached.size() && reached[i]) continue;
    const InputAliasInfo& in = meta.input_info[i];
    const bool written = in.mutates_data || in.mutates_metadata;
    if (for_autograd && in.requires_grad && written)
      fresh[i] = args[i].clone();
    else if (in.mutates_metadata && !in.mutates_data)
      fresh[i] = args[i].alias();
  }
  return fresh;
}

void keep_first_outputs(ir::Graph& graph, size_t count) {
  std::vector<ir::Value*> outs = graph.outputs();
  if (outs.size() <= count) return;
  std::vector<ir::OutputSpec> specs(graph.signature().outputs.begin(),
                                    graph.signature().outputs.begin() + static_cast<std::ptrdiff_t>(count));
  outs.resize(count);
  graph.set_output(outs);
  graph.signature().outputs = std::move(specs);
}

void mark_inputs(ir::Graph& graph, const AotRequest& request, size_t num_primals) {
  std::vector<ir::InputSpec>& specs = graph.signature().inputs;
  const std::vector<ir::Value*> placeholders = graph.placeholders();
  for (size_t i = 0; i < request.config.num_params_buffers && i < specs.size(); ++i) {
    if (specs[i].kind != ir::InputKind::UserInput) continue;
    specs[i].kind = request.flat_args[i].requires_grad() ? ir::InputKind::Parameter : ir::InputKind::Buffer;
    specs[i].target = placeholders[i]->name();
  }
  if (request.fw_metadata.is_rng_op_functionalized && num_primals >= 2) {
    specs[num_primals - 2] = ir::InputSpec{ir::InputKind::State, "rng_seed", std::nullopt};
    specs[num_primals - 1] = ir::InputSpec{ir::InputKind::State, "rng_offset", std::nullopt};
  }
}

void add_input_copies(ir::Graph& graph, const std::vector<std::pair<size_t, ir::Value*>>& writes) {
  static const c10::OperatorHandle copy = ir::resolve_operator("aten::copy_");
  const std::vector<ir::Value*> placeholders = graph.placeholders();
  for (const auto& [input, value] : writes) {
    ir::Node* n = graph.add_call(copy, {placeholders[input], value});
    n->result()->set_meta(placeholders[input]->meta());
  }
}

}  // namespace crucible::autograd::detail
