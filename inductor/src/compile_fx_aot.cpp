// compile_fx: AOTAutograd configured for inductor. See Note [compile_fx] in
// compile_fx_aot.h.
#include <crucible/inductor/compile_fx.h>
#include <crucible/inductor/compile_fx_aot.h>

#include <crucible/ir/graph.h>
#include <crucible/ir/pass_manager.h>
#include <crucible/partitioner/min_cut_partition.h>
#include <crucible/tracer/decomposition.h>

#include <utility>

namespace crucible::inductor {

namespace {

// What identifies the compilers of compile_fx_config (AotConfig::compiler_key,
// Note [AOT graph cache]): compile_fx_inner's result depends on the graph
// and on every field of the options (a profiling CompiledFn must not be
// handed to a caller that asked for none), so all of them are in the key.
// The structured binding names every field: a field added to InductorOptions
// stops the build here until it joins the key.
std::string compiler_key(const InductorOptions& options) {
  const auto& [compiler, flags, threads, adapt_threads, automatic_dynamic_shapes, cache_dir, cuda_arch,
               fallback_to_eager, print_generated_code, profile, cuda_graphs, kernel_config, force_layout_optimization,
               memory_planning] = options;
  std::string key = "backend=inductor.compile_fx;passes=";
  for (size_t i = 0; i < post_grad_passes().size(); ++i) key += (i ? "," : "") + post_grad_passes()[i];
  // Lengths before the strings the caller chose: no two option sets print alike.
  auto add = [&key](const char* name, const std::string& value) {
    key += ";" + std::string(name) + "=" + std::to_string(value.size()) + ":" + value;
  };
  add("compiler", compiler);
  for (const std::string& flag : flags) add("flag", flag);
  add("threads", std::to_string(threads));
  add("adapt_threads", adapt_threads ? "1" : "0");
  add("automatic_dynamic_shapes", automatic_dynamic_shapes ? "1" : "0");
  add("cache_dir", cache_dir);
  add("cuda_arch", cuda_arch);
  add("fallback_to_eager", fallback_to_eager ? "1" : "0");
  add("print_generated_code", print_generated_code ? "1" : "0");
  add("profile", profile ? "1" : "0");
  add("cuda_graphs", cuda_graphs ? "1" : "0");
  add("kernel_config", std::to_string(kernel_config));
  add("force_layout_optimization", force_layout_optimization ? "1" : "0");
  add("memory_planning", memory_planning ? (*memory_planning ? "1" : "0") : "default");
  return key;
}

// The post-grad passes, then compile_fx_inner, on a copy of each graph
// AOTAutograd hands over (reported under `graph_name`), with the stages of
// Note [Compilation stages]: one per pass, then "backend".
ir::Backend graph_compiler(std::string graph_name, InductorOptions options, ir::Instruments instruments) {
  ir::PassManager passes(ir::PassRegistry::builtin().passes(post_grad_passes()),
                         ir::PassManagerOptions{/*verify=*/true, instruments, graph_name});
  return [graph_name = std::move(graph_name), options = std::move(options), instruments = std::move(instruments),
          passes = std::move(passes)](const ir::Graph& graph, const std::vector<at::Tensor>& example_inputs) {
    ir::Graph g = graph.clone();
    passes.run(g);
    const std::vector<ir::StageGraph> graphs = {{graph_name, &g}};
    ir::StageEvent before;
    before.stage = "backend";
    before.graphs = graphs;
    return ir::run_stage(
        instruments, std::move(before), [&] { return compile_fx_inner(g, example_inputs, options); },
        [&](const ir::CompiledFn&) { return graphs; }, /*changed=*/false);
  };
}

}  // namespace

const std::vector<std::string>& post_grad_passes() {
  static const std::vector<std::string> names = {"dce", "cse"};
  return names;
}

autograd::AotConfig compile_fx_config(const InductorOptions& options, ir::Instruments instruments) {
  autograd::AotConfig config;
  config.fw_compiler = graph_compiler("forward", options, instruments);
  config.bw_compiler = graph_compiler("backward", options, instruments);
  config.inference_compiler = graph_compiler("inference", options, instruments);
  config.partition_fn = [](const ir::Graph& joint, size_t num_fwd_outputs) {
    return partitioner::min_cut_rematerialization_partition(joint, num_fwd_outputs);
  };
  config.decompositions = tracer::core_aten_decompositions();
  config.keep_inference_input_mutations = true;
  config.instruments = std::move(instruments);
  config.compiler_key = compiler_key(options);
  config.disk_cache_dir = options.cache_dir;  // Note [AOT trace cache]: beside the kernels and graphs
  return config;
}

autograd::AotFunction compile_fx(tracer::TensorFn fn, const std::vector<at::Tensor>& example_inputs,
                                 const InductorOptions& options) {
  autograd::AotFunction compiled = autograd::aot_function(std::move(fn), compile_fx_config(options));
  compiled.compile(example_inputs);
  return compiled;
}

autograd::AotModule compile_fx(std::shared_ptr<torch::nn::Module> module, tracer::ModuleFn fn,
                               const std::vector<at::Tensor>& example_inputs, const InductorOptions& options) {
  autograd::AotModule compiled = autograd::aot_module(std::move(module), std::move(fn), compile_fx_config(options));
  compiled.compile(example_inputs);
  return compiled;
}

}  // namespace crucible::inductor
