#include <crucible/autograd/aot_dispatch.h>
#include <crucible/autograd/collect_metadata.h>
#include <crucible/autograd/debug_assert_wrapper.h>
#include <crucible/autograd/dedupe_wrapper.h>
#include <crucible/autograd/error.h>
#include <crucible/autograd/functionalized_rng_wrapper.h>
#include <crucible/autograd/runtime_wrapper.h>
#include <crucible/autograd/synthetic_base_wrapper.h>

#include <crucible/runtime/rng_state_guard.h>
#include "compile_record.h"
#include "compiled_function.h"
#include "graph_capture.h"
#include "lift_inputs.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace crucible::autograd {

namespace {

// The wrappers each path puts directly around what it compiled.
ir::CompiledFn wrap_runtime(ir::CompiledFn compiled, AotRequest& request, std::vector<size_t> detach = {}) {
  ir::CompiledFn fn = RuntimeWrapper(std::move(detach)).post_compile(std::move(compiled), request);
  if (request.config.debug_assert) {
    DebugAssertWrapper check;
    check.pre_compile(request);
    fn = check.post_compile(std::move(fn), request);
  }
  return fn;
}

std::vector<at::Tensor> detached(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> r;
  r.reserve(ts.size());
  for (const at::Tensor& t : ts) r.push_back(t.detach());
  return r;
}

}  // namespace

ir::CompiledFn aot_dispatch_base(AotRequest& request) {
  if (request.config.keep_inference_input_mutations)
    for (InputAliasInfo& in : request.fw_metadata.input_info)
      in.mutation_in_graph = in.mutates_data && !in.mutates_metadata;
  const ir::Graph g = detail::create_inference_graph(request);
  AotCache::Compiled compiled =
      detail::run_backend(request.config.instruments, "inference_compiler", request.config.inference_graph_name,
                          request.config.inference_compiler, request.config.cache, request.config.compiler_key,
                          "inference", g, detached(request.flat_args));
  return wrap_runtime(std::move(compiled.fn), request);
}

ir::CompiledFn aot_dispatch_autograd(AotRequest& request) {
  detail::JointGraph joint = detail::create_joint_graph(request);
  partitioner::PartitionResult parts = ir::run_stage(
      request.config.instruments, ir::StageEvent{.stage = "partition", .graphs = {{"joint", &joint.graph}}},
      [&] { return request.config.partition_fn(joint.graph, joint.num_fwd_outputs); },
      [](const partitioner::PartitionResult& r) {
        return std::vector<ir::StageGraph>{{"forward", &r.forward}, {"backward", &r.backward}};
      });
  auto graphs = c10::make_intrusive<detail::CompiledGraphs>();
  graphs->num_fwd_outputs = joint.num_fwd_outputs;
  graphs->tangent_outputs = std::move(joint.tangent_outputs);
  graphs->differentiable_outputs.assign(graphs->num_fwd_outputs, false);
  for (size_t i : graphs->tangent_outputs) graphs->differentiable_outputs[i] = true;
  graphs->tangent_meta = std::move(joint.tangent_meta);
  graphs->num_primals = request.flat_args.size();
  graphs->gradient_inputs = parts.gradient_inputs;
  graphs->bw_compiler = request.config.bw_compiler;
  graphs->cache = request.config.cache;
  graphs->compiler_key = request.config.compiler_key;
  graphs->compile_id = request.compile_id;
  graphs->instruments = request.config.instruments;
  graphs->forward = detail::run_backend(request.config.instruments, "fw_compiler", "forward",
                                        request.config.fw_compiler, request.config.cache, request.config.compiler_key,
                                        "forward", parts.forward, detached(request.flat_args))
                        .fn;
  graphs->backward_graph = std::move(parts.backward);
  // Inputs that get no gradient are detached before the call (the seed's
  // indices_of_inps_to_detach): autograd then records no edge to them.
  std::vector<size_t> detach;
  for (size_t i = 0; i < request.flat_args.size(); ++i)
    if (request.flat_args[i].requires_grad() &&
        std::find(graphs->gradient_inputs.begin(), graphs->gradient_inputs.end(), i) == graphs->gradient_inputs.end())
      detach.push_back(i);
  ir::CompiledFn apply = [graphs](std::vector<at::Tensor>& args) {
    return detail::CompiledFunction::apply(graphs, at::TensorList(args));
  };
  return wrap_runtime(std::move(apply), request, std::move(detach));
}

namespace {

bool any_requires_grad(const std::vector<at::Tensor>& args) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor& t : args)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

}  // namespace

AotCompiled create_aot_dispatcher_function(AotRequest request) {
  bool needs_autograd = any_requires_grad(request.flat_args);
  const std::string compile_id = request.compile_id, reason = request.recompile_reason;
  const ir::Instruments instruments = request.config.instruments;
  ir::StageScope compile(instruments, ir::StageEvent{.stage = "compile", .id = compile_id, .detail = reason});
  try {
    runtime::RngStateGuard keep_rng;  // See Note [RNG during compilation].
    if (request.config.pre_grad)
      request.flat_fn = request.config.pre_grad(request.flat_fn, request.trace, request.flat_args);
    {
      ir::StageScope analysis(instruments, ir::StageEvent{.stage = "collect_metadata"});
      std::vector<tracer::NamedTensor> found;
      request.fw_metadata = collect_metadata(request, needs_autograd, &found, &request.analysis_hash);
      if (!found.empty()) {
        // See Note [Lifting in AOTAutograd].
        detail::lift_inputs(request, found);
        needs_autograd = any_requires_grad(request.flat_args);
        request.fw_metadata = collect_metadata(request, needs_autograd, nullptr, &request.analysis_hash);
        detail::check_lifted_aliasing(request);
      }
      detail::check_state_aliasing(request);
      analysis.done({});
    }
    request.trace_joint = needs_autograd;
    runtime::LiftedInputs lifted(request.lifted, request.lifted_names);
    runtime::WrapperList<AotRequest> wrappers{std::make_shared<AOTDedupeWrapper>(),
                                              std::make_shared<AOTSyntheticBaseWrapper>()};
    if (request.config.functionalize_rng_ops) wrappers.push_back(std::make_shared<FunctionalizedRngRuntimeWrapper>());
    wrappers.insert(wrappers.end(), request.config.wrappers.begin(), request.config.wrappers.end());
    ir::CompiledFn fn = runtime::compile_with_wrappers<AotRequest>(
        wrappers, std::move(request), needs_autograd ? aot_dispatch_autograd : aot_dispatch_base);
    compile.done({});
    return AotCompiled{std::move(fn), std::move(lifted)};
  } catch (const std::exception& e) {
    compile.failed(e.what());
    throw;
  }
}

}  // namespace crucible::autograd
