#include "graph_capture.h"

#include <crucible/autograd/error.h>
#include <crucible/autograd/functionalized_rng_wrapper.h>
#include <crucible/ir/instrument.h>

#include "lift_inputs.h"
#include "trace_cache.h"
#include "trace_call.h"
#include "traced_function_transforms.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <memory>
#include <unordered_map>
#include <utility>

namespace crucible::autograd::detail {

namespace {

// The metadata a written input's new value has.
ir::TensorMeta new_value_meta(const at::Tensor& input, const InputAliasInfo& info) {
  ir::TensorMeta m = ir::TensorMeta::of(input);
  if (info.mutates_metadata) {
    m.sizes = info.final_sizes;
    m.strides = info.final_strides;
  }
  m.requires_grad = info.requires_grad && !info.mutations_under_no_grad;
  return m;
}

// Note [Hooks of reached tensors in the joint trace]
// A reached input (module state, a lifted tensor) enters the joint trace as
// the caller's tensor itself, autograd metadata included (Note [Swapping
// reached tensors] in the tracer), so torch::autograd::grad would run the
// hooks registered on it (Tensor::register_hook, retain_grad) and the joint
// graph would record them. At run time the compiled backward's gradient for
// that input reaches the same tensor's AccumulateGrad (or grad_fn), which
// runs them again: twice where eager runs them once. So the joint trace
// differentiates with those hooks set aside, and only the run-time autograd
// runs them, as eager does.
class HooksSetAside {
 public:
  explicit HooksSetAside(const std::vector<at::Tensor>& tensors) {
    for (const at::Tensor& t : tensors) {
      if (!t.requires_grad()) continue;
      if (t.is_leaf()) {
        const bool seen =
            std::any_of(leaves_.begin(), leaves_.end(), [&](const Leaf& l) { return l.tensor.is_same(t); });
        if (!seen) leaves_.push_back(Leaf{t, std::exchange(torch::autograd::impl::hooks(t), {})});
        continue;
      }
      std::shared_ptr<torch::autograd::Node> fn = t.grad_fn();
      if (std::any_of(nodes_.begin(), nodes_.end(), [&](const NodeHooks& n) { return n.node == fn; })) continue;
      nodes_.push_back(
          NodeHooks{fn, std::exchange(fn->tensor_pre_hooks(), {}), std::exchange(fn->retains_grad_hooks(), {})});
    }
  }
  HooksSetAside(const HooksSetAside&) = delete;
  HooksSetAside& operator=(const HooksSetAside&) = delete;
  ~HooksSetAside() {
    for (Leaf& l : leaves_) torch::autograd::impl::hooks(l.tensor) = std::move(l.hooks);
    for (NodeHooks& n : nodes_) {
      n.node->tensor_pre_hooks() = std::move(n.pre);
      n.node->retains_grad_hooks() = std::move(n.retains_grad);
    }
  }

 private:
  using PreHooks = std::vector<std::unique_ptr<torch::autograd::FunctionPreHook>>;
  struct Leaf {
    at::Tensor tensor;
    PreHooks hooks;
  };
  struct NodeHooks {
    std::shared_ptr<torch::autograd::Node> node;
    PreHooks pre;
    std::unordered_map<size_t, std::unique_ptr<torch::autograd::FunctionPreHook>> retains_grad;
  };
  std::vector<Leaf> leaves_;
  std::vector<NodeHooks> nodes_;
};

}  // namespace

JointGraph create_joint_graph(const AotRequest& request) {
  const ViewAndMutationMeta& meta = request.fw_metadata;
  if (!meta.grad_accumulating_inputs().empty())
    throw AotError("compilation " + request.compile_id +
                   ": the function runs a backward of its own (it "
                   "accumulates into the .grad of input " +
                   std::to_string(meta.grad_accumulating_inputs()[0]) +
                   ") while compiled for autograd, whose backward would then miss those gradients; call it under "
                   "NoGradGuard (a whole training step), or leave the backward to the caller");
  const std::vector<at::Tensor>& flat_args = request.flat_args;
  const size_t num_primals = flat_args.size();
  const size_t num_state = request.config.num_params_buffers;
  const std::vector<bool> reached = reached_inputs(request);
  const std::vector<size_t> computed = meta.graph_computed_outputs();
  const std::vector<size_t> written = meta.mutated_data_inputs();
  JointGraph joint;

  // The forward outputs (Note [Forward graph outputs]) and their tangents.
  std::vector<ir::TensorMeta> fwd_meta;
  for (size_t k : computed) {
    ir::TensorMeta m = meta.output_info[k].meta;
    m.requires_grad &= meta.output_info[k].output_type == OutputType::non_alias;
    fwd_meta.push_back(m);
  }
  for (const ir::TensorMeta& b : meta.intermediate_bases) fwd_meta.push_back(b);
  for (size_t i : written) fwd_meta.push_back(new_value_meta(flat_args[i], meta.input_info[i]));
  std::vector<at::Tensor> joint_inputs = flat_args;
  for (size_t j = 0; j < fwd_meta.size(); ++j) {
    if (!fwd_meta[j].requires_grad) continue;
    joint.tangent_outputs.push_back(j);
    ir::TensorMeta t = fwd_meta[j];
    t.strides = ir::contiguous_strides(t.sizes);
    t.storage_offset = 0;
    t.requires_grad = false;
    joint.tangent_meta.push_back(t);
    joint_inputs.push_back(at::ones(t.sizes, at::TensorOptions().dtype(t.dtype).device(t.device)));
  }
  // Primals to differentiate: those requiring grad, each tensor once (a
  // parameter registered twice is one leaf).
  std::vector<size_t> wrt;
  for (size_t i = 0; i < num_primals; ++i) {
    if (!flat_args[i].requires_grad()) continue;
    bool repeated = false;
    for (size_t j = 0; j < i && i < num_state && !repeated; ++j) repeated = flat_args[j].is_same(flat_args[i]);
    if (!repeated) wrt.push_back(i);
  }

  joint.num_fwd_outputs = fwd_meta.size();
  joint.graph = traced_graph(request, "joint", "trace_joint", "joint", joint_inputs.size(), [&] {
    std::vector<size_t> grad_of;
    auto body = [&](const std::vector<at::Tensor>& all) {
      const std::vector<at::Tensor> primals(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(num_primals));
      const std::vector<at::Tensor> args = fresh_inputs(primals, meta, reached, /*for_autograd=*/true);
      std::vector<at::Tensor> outs = request.flat_fn(args);
      std::vector<at::Tensor> ret;
      for (size_t k : computed) ret.push_back(outs[k]);
      for (size_t b = 0; b < meta.intermediate_bases.size(); ++b)
        for (size_t k = 0; k < outs.size(); ++k)
          if (meta.output_info[k].output_type == OutputType::alias_of_intermediate &&
              *meta.output_info[k].base_idx == b) {
            ret.push_back(at::Tensor(outs[k]._base()));
            break;
          }
      for (size_t i : written) ret.push_back(args[i]);
      torch::autograd::variable_list diff_outs, tangents, inputs;
      for (size_t t = 0; t < joint.tangent_outputs.size(); ++t) {
        const at::Tensor& o = ret[joint.tangent_outputs[t]];
        if (!o.requires_grad())
          throw AotError("compilation " + request.compile_id + ": forward output " +
                         std::to_string(joint.tangent_outputs[t]) +
                         " required grad in the metadata analysis but not in the joint trace; the function must "
                         "compute the same thing on every run");
        diff_outs.push_back(o);
        tangents.push_back(all[num_primals + t]);
      }
      std::vector<at::Tensor> hooked;
      for (size_t i : wrt) {
        inputs.push_back(primals[i]);
        if (i < reached.size() && reached[i]) hooked.push_back(primals[i]);
      }
      grad_of.clear();
      if (!diff_outs.empty() && !inputs.empty()) {
        const HooksSetAside set_aside(hooked);  // See Note [Hooks of reached tensors in the joint trace].
        const torch::autograd::variable_list grads = torch::autograd::grad(
            diff_outs, inputs, tangents, /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
        for (size_t k = 0; k < grads.size(); ++k)
          if (grads[k].defined()) {
            ret.push_back(grads[k]);
            grad_of.push_back(wrt[k]);
          }
      }
      return ret;
    };
    ir::StageScope trace(request.config.instruments, ir::StageEvent{.stage = "trace_joint"});
    ir::Graph g = trace_functionalized(request, body, joint_inputs, "the joint graph").graph;
    // Mark the joint graph per Note [Joint graph contract].
    keep_first_outputs(g, fwd_meta.size() + grad_of.size());
    for (size_t i = num_primals; i < joint_inputs.size(); ++i) g.signature().inputs[i].kind = ir::InputKind::Tangent;
    for (size_t w = 0; w < written.size(); ++w)
      g.signature().outputs[computed.size() + meta.intermediate_bases.size() + w] =
          ir::OutputSpec{ir::OutputKind::MutatedInput, written[w]};
    for (size_t k = 0; k < grad_of.size(); ++k)
      g.signature().outputs[fwd_meta.size() + k] = ir::OutputSpec{ir::OutputKind::Gradient, grad_of[k]};
    mark_inputs(g, request, num_primals);
    if (meta.is_rng_op_functionalized) check_no_unfunctionalized_rng(g);
    trace.done(ir::StageEvent{.stage = "trace_joint", .graphs = {{"joint", &g}}});
    return g;
  });
  return joint;
}

ir::Graph create_inference_graph(const AotRequest& request) {
  const ViewAndMutationMeta& meta = request.fw_metadata;
  const std::vector<size_t> computed = meta.graph_computed_outputs();
  const std::vector<size_t> written = meta.mutated_data_inputs();
  const std::vector<bool> reached = reached_inputs(request);
  return traced_graph(
      request, "inference", "trace_inference", request.config.inference_graph_name, request.flat_args.size(), [&] {
        auto body = [&](const std::vector<at::Tensor>& traced) {
          const std::vector<at::Tensor> args = fresh_inputs(traced, meta, reached, /*for_autograd=*/false);
          std::vector<at::Tensor> outs = request.flat_fn(args);
          std::vector<at::Tensor> ret;
          for (size_t k : computed) ret.push_back(outs[k]);
          for (size_t i : written) ret.push_back(args[i]);
          return ret;
        };
        at::NoGradGuard no_grad;
        ir::StageScope trace(request.config.instruments, ir::StageEvent{.stage = "trace_inference"});
        ir::Graph g = trace_functionalized(request, body, request.flat_args, "the inference graph").graph;
        const size_t num_outputs = computed.size() + written.size();
        // Writes kept in the graph and accumulated gradients: the tracer returned
        // the new values and the gradients after ours.
        std::vector<std::pair<size_t, ir::Value*>> kept;
        std::vector<ir::Value*> grads(meta.input_info.size(), nullptr);
        const std::vector<ir::Value*> outs = g.outputs();
        for (size_t o = num_outputs; o < outs.size(); ++o) {
          const ir::OutputSpec& spec = g.signature().outputs[o];
          if (spec.kind == ir::OutputKind::MutatedInput && meta.input_info[*spec.input_index].mutation_in_graph)
            kept.emplace_back(*spec.input_index, outs[o]);
          if (spec.kind == ir::OutputKind::Gradient) grads.at(*spec.input_index) = outs[o];
        }
        keep_first_outputs(g, num_outputs);
        add_input_copies(g, kept);
        for (size_t w = 0; w < written.size(); ++w)
          g.signature().outputs[computed.size() + w] = ir::OutputSpec{ir::OutputKind::MutatedInput, written[w]};
        // See Note [Gradients a function accumulates].
        std::vector<ir::Value*> with_grads = g.outputs();
        std::vector<ir::OutputSpec> specs = g.signature().outputs;
        for (size_t i : meta.grad_accumulating_inputs()) {
          if (!grads[i])
            throw AotError("compilation " + request.compile_id + ": input " + std::to_string(i) +
                           " got a gradient in the metadata analysis but not in the inference graph; the function must "
                           "compute the same thing on every run");
          with_grads.push_back(grads[i]);
          specs.push_back(ir::OutputSpec{ir::OutputKind::Gradient, i});
        }
        g.set_output(with_grads);
        g.signature().outputs = specs;
        mark_inputs(g, request, request.flat_args.size());
        if (meta.is_rng_op_functionalized) check_no_unfunctionalized_rng(g);
        trace.done(ir::StageEvent{.stage = "trace_inference", .graphs = {{request.config.inference_graph_name, &g}}});
        return g;
      });
}

}  // namespace crucible::autograd::detail
