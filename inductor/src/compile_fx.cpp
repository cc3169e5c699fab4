// compile_fx_inner, the inductor backend (torch/_inductor/compile_fx.py's
// compile_fx_inner): a graph's passes, its schedule from the graph cache or
// code generation, its kernels built and loaded, and the run-time plan
// that runs them.
#include <crucible/inductor/compile_fx.h>
#include <crucible/inductor/error.h>
#include <crucible/inductor/package.h>

#include "codecache/cpp_builder.h"
#include "codecache/cuda_builder.h"
#include "codecache/graph_cache.h"
#include "codegen/codegen.h"
#include "dynamic_sizes.h"
#include "fx_passes/fx_passes.h"
#include "runtime/autotune.h"
#include "runtime/cuda_graphs.h"
#include "runtime/cuda_library.h"
#include "runtime/kernel_runner.h"
#include "runtime/memory_plan.h"
#include "runtime/plan.h"

#include <crucible/ir/aliasing.h>
#include <crucible/ir/flop_count.h>
#include <crucible/ir/graph.h>
#include <crucible/ir/interpreter.h>
#include <crucible/ir/printer.h>
#include <crucible/runtime/disk_cache.h>
#include <crucible/runtime/instruments.h>

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace crucible::inductor {

namespace {

// The graph compile_fx_inner lowers: a copy of the caller's, with the
// matmuls cuBLAS runs slowly padded (Note [Padding matmuls]) and the
// convolutions in cuDNN's fastest layout (Note [Channels-last convolutions]),
// its outputs in the caller's layouts (Note [Eager's strides at the outputs]),
// and a training step's max-pool indices kept in 32 bits (Note [Narrow
// max-pool indices]).
ir::Graph prepared(const ir::Graph& graph, const InductorOptions& options) {
  ir::Graph g = graph.clone();
  detail::pad_mm(g);
  detail::channels_last_convolutions(g, options.force_layout_optimization);
  detail::narrow_max_pool_indices(g);
  return g;
}

// Note [Dynamic sizes]: CPU kernels take the sizes that vary as arguments.
detail::SizeTable size_table(const ir::Graph& g, const InductorOptions& options) {
  return options.automatic_dynamic_shapes && detail::loop_device(g).is_cpu() ? detail::dynamic_sizes(g)
                                                                             : detail::SizeTable{};
}

// The schedule of `g` (a prepared graph) from the graph cache, else lowered
// and left there for the compile that follows (Note [Roofline estimate]).
// An unusable cache directory only costs the lowering.
detail::CompiledSchedule schedule_through_cache(const ir::Graph& g, const InductorOptions& options,
                                                const detail::SizeTable& sizes) {
  const std::optional<std::string> key = detail::graph_cache_key(g, options, sizes);
  std::optional<detail::CompiledSchedule> cached;
  try {
    if (key) cached = detail::load_schedule(*key, g, options);
  } catch (const InductorError&) {
  }
  if (cached) return std::move(*cached);
  detail::CompiledSchedule s = detail::compiled_schedule(detail::compile_schedule(g, options.threads, sizes));
  if (key) {
    try {
      detail::store_schedule(*key, s, g, options);
    } catch (const InductorError&) {
    }
  }
  return s;
}

}  // namespace

GeneratedCode generate_code(const ir::Graph& graph) {
  const ir::Graph g = prepared(graph, {});  // outlives the schedule, which points into it
  detail::Schedule s = detail::compile_schedule(g, 0);
  return {std::move(s.source), s.program.device.is_cuda()};
}

std::string loop_ir(const ir::Graph& graph) {
  const ir::Graph g = prepared(graph, {});
  return detail::to_text(detail::compile_schedule(g, 0).program);
}

runtime::PlannedMemory plan_memory(const ir::Graph& graph, const InductorOptions& options) {
  detail::Plan plan;
  plan.graph = std::make_shared<ir::Graph>(prepared(graph, options));
  if (!plan.graph->output_node())
    throw InductorError("inductor: the graph has no output node; call Graph::set_output first");
  const detail::CompiledSchedule s = detail::compiled_schedule(detail::compile_schedule(*plan.graph, options.threads));
  plan.device = s.device;
  detail::make_plan(plan, s, options, /*bind_kernels=*/false);
  return detail::planned_memory(plan);
}

// Note [Roofline estimate]
// A call's time as the roofline model gives it, step by step: a step takes
// the longer of its bytes over the device's bandwidth and its FLOPs over
// its matmul throughput. A generated kernel moves every buffer it reads or
// writes once (what fusion leaves in memory); an extern kernel reads its
// tensor arguments and writes its results, or moves nothing where it only
// makes a view; the FLOPs are ir::count_flops' (matmuls, convolutions,
// attention). The devices: an H100's HBM3 (3.35 TB/s) and TF32 tensor
// cores (495 TFLOP/s), or a few AVX2 cores (20 GB/s, 200 GFLOP/s). It
// ignores launches, caches and occupancy, so it compares two schedules of
// one step better than it predicts either's time (torch/_inductor's
// estimate_runtime, from its scheduler's nodes, is the same idea).
//
// The schedule is compile_fx_inner's, under the same graph cache key: an
// estimate finds a compiled graph's schedule there, and leaves its own for
// the compile that follows (remat_pass estimates the step it then hands
// the backend), so weighing a rewrite costs a cold compile one lowering,
// of the graph not taken, and a warm one none.
double estimated_ms(const ir::Graph& graph, const InductorOptions& options) {
  const ir::Graph g = prepared(graph, options);
  const detail::CompiledSchedule s = schedule_through_cache(g, options, size_table(g, options));
  const bool gpu = s.device.is_cuda();
  const double bandwidth = gpu ? 3.35e12 : 2e10, throughput = gpu ? 4.95e14 : 2e11;
  auto bytes_of = [](const ir::Value* v) {
    return v && v->is_tensor() && v->has_meta() ? static_cast<double>(v->meta().nbytes()) : 0.0;
  };
  double seconds = 0;
  for (const detail::Schedule::Step& step : s.steps) {
    double bytes = 0, flops = 0;
    if (const ir::Node* n = step.extern_node) {
      bool fresh = false;
      for (size_t r = 0; r < n->num_results(); ++r)
        if (!ir::aliased_argument(*n->result(r))) {
          fresh = true;
          bytes += bytes_of(n->result(r));
        }
      if (fresh)
        for (const ir::Value* in : n->inputs()) bytes += bytes_of(in);
      flops = static_cast<double>(ir::count_flops(*n));
    } else {
      for (const detail::KernelOperand& o : s.kernels[step.kernel].operands) {
        double numel = 1;
        for (int64_t d : o.sizes) numel *= static_cast<double>(d);
        bytes += numel * static_cast<double>(c10::elementSize(o.dtype));
      }
    }
    seconds += std::max(bytes / bandwidth, flops / throughput);
  }
  return seconds * 1e3;
}

std::vector<std::string> write_compiled(const ir::Graph& graph, const std::string& dir, const InductorOptions& options,
                                        const std::vector<std::string>& cuda_archs) {
  if (!graph.output_node()) throw InductorError("inductor: the graph has no output node; call Graph::set_output first");
  const ir::Graph g = prepared(graph, options);
  const detail::SizeTable sizes = size_table(g, options);
  const detail::CompiledSchedule s = schedule_through_cache(g, options, sizes);
  std::vector<std::string> files = {"inductor_graph.txt", "inductor_schedule.entry"};
  detail::write_atomically(dir + "/" + files[0], ir::to_text(g));
  detail::write_atomically(dir + "/" + files[1], detail::schedule_entry(detail::kPackageKey, s, g));
  nlohmann::json info = {{"codegen", detail::kCodegenVersion},
                         {"device", s.device.str()},
                         {"size_symbols", sizes.symbol_values},
                         {"kernels", !s.source.empty()},
                         {"cuda_graphs", options.cuda_graphs}};
  if (!s.source.empty() && s.device.is_cuda()) {
    // Note [Packaged cubins] in runtime/load_compiled.cpp.
    const int index = s.device.index() < 0 ? 0 : s.device.index();
    std::vector<std::string> archs = cuda_archs;
    if (archs.empty()) archs = {options.cuda_arch.empty() ? detail::device_arch(index) : options.cuda_arch};
    size_t units = 0;
    for (const std::string& arch : archs) {
      const std::vector<std::string> cubins = detail::compile_cubins(s.source, arch, options);
      units = cubins.size();
      for (size_t u = 0; u < cubins.size(); ++u) {
        files.push_back(detail::packaged_cubin(arch, u));
        detail::write_atomically(dir + "/" + files.back(), cubins[u]);
      }
    }
    nlohmann::json tuned = nlohmann::json::object();
    std::string identity;
    if (c10::impl::hasDeviceGuardImpl(c10::kCUDA) && c10::impl::getDeviceGuardImpl(c10::kCUDA)->deviceCount() > index) {
      identity = detail::device_identity(index);
      const std::string cache = detail::cache_dir(options);
      for (const detail::KernelPlan& k : s.kernels)
        if (k.configs.size() > 1)
          if (const std::optional<int> chosen =
                  detail::stored_configuration(cache, k.tuning_key, identity, static_cast<int>(k.configs.size())))
            tuned[k.tuning_key] = *chosen;
    }
    info["cuda"] = {{"archs", archs}, {"units", units}, {"tuned_on", identity}, {"tuned", tuned}};
  } else if (!s.source.empty()) {
    std::string built;
    detail::compile_and_load(s.source, options, &built);
    files.push_back("inductor_kernels.so");
    detail::write_atomically(dir + "/" + files.back(), runtime::read_file(built));
    info["cpu"] = detail::builds_for_host_cpu(options) ? detail::host_cpu() : "";
  }
  files.push_back("inductor.json");
  detail::write_atomically(dir + "/" + files.back(), info.dump(2) + "\n");
  return files;
}

std::string cuda_graph_blocker(const ir::Graph& graph) {
  return detail::cuda_graph_blocker(graph, detail::loop_device(graph));
}

std::vector<std::string> compile_cuda(const ir::Graph& graph, const std::string& arch, const InductorOptions& options) {
  const ir::Graph g = prepared(graph, options);
  detail::Schedule s = detail::compile_schedule(g, 0);
  if (s.source.empty() || !s.program.device.is_cuda()) return {};
  return detail::compile_cubins(s.source, arch, options);
}

ir::CompiledFn compile_fx_inner(const ir::Graph& graph, const std::vector<at::Tensor>& /*example_inputs*/,
                                const InductorOptions& options) {
  // With options.profile, the compile's own phases are printed too: where
  // a cold compile spends its seconds (Note [Per-step profile]).
  using Clock = std::chrono::steady_clock;
  const Clock::time_point started = Clock::now();
  std::vector<std::pair<const char*, double>> phases;
  auto phase_done = [&, last = started](const char* name) mutable {
    const Clock::time_point now = Clock::now();
    phases.emplace_back(name, std::chrono::duration<double, std::milli>(now - last).count());
    last = now;
  };
  auto plan = std::make_shared<detail::Plan>();
  plan->graph = std::make_shared<ir::Graph>(prepared(graph, options));
  if (!plan->graph->output_node())
    throw InductorError("inductor: the graph has no output node; call Graph::set_output first");
  const detail::SizeTable sizes = size_table(*plan->graph, options);
  plan->size_symbols = sizes.symbol_values;
  // See codecache/graph_cache.h; counted as torch/_inductor counts its FxGraphCache.
  runtime::Counters& counters = runtime::default_counters();
  const std::optional<std::string> key = detail::graph_cache_key(*plan->graph, options, sizes);
  std::optional<detail::CompiledSchedule> cached;
  try {
    if (key) cached = detail::load_schedule(*key, *plan->graph, options);
  } catch (const InductorError&) {  // an unusable cache directory
    if (!options.fallback_to_eager) throw;
    return ir::interpret(graph);
  }
  counters.add("inductor", !key ? "fxgraph_cache_bypass" : cached ? "fxgraph_cache_hit" : "fxgraph_cache_miss");
  phase_done("passes and graph cache lookup");
  detail::CompiledSchedule s;
  if (cached) {
    s = std::move(*cached);
  } else {
    try {
      s = detail::compiled_schedule(detail::compile_schedule(*plan->graph, options.threads, sizes));
    } catch (const std::exception& e) {
      // A node lowering did not expect (an argument of an unusual kind): the
      // graph is still valid, so it runs on the interpreter rather than fail.
      TORCH_WARN("inductor: lowering failed (", e.what(), "); this graph runs on the interpreter");
      return ir::interpret(graph);
    }
  }
  phase_done(cached ? "schedule (cached)" : "schedule (lowering, fusion, rendering)");
  const std::string& source = s.source;
  plan->device = s.device;
  if (options.print_generated_code && !source.empty()) std::cerr << source;
  try {
    if (!source.empty() && plan->device.is_cuda()) {
      if (!c10::impl::hasDeviceGuardImpl(c10::kCUDA))
        throw InductorError("inductor: the graph's tensors are on " + plan->device.str() +
                            ", but this LibTorch has no CUDA; generate_code and compile_cuda still work");
      c10::DeviceGuard guard(plan->device);
      const int index = plan->device.index() < 0 ? 0 : plan->device.index();
      const std::string arch = options.cuda_arch.empty() ? detail::device_arch(index) : options.cuda_arch;
      const std::vector<std::string> cubins = detail::compile_cubins(source, arch, options);
      phase_done("NVRTC (or its cache)");
      plan->cuda = std::make_shared<detail::CudaLibrary>(cubins, index);
      plan->cache_dir = detail::cache_dir(options);
      plan->tuning_device = plan->cuda->identity();
      phase_done("loading cubins");
    } else if (!source.empty()) {
      plan->library = detail::compile_and_load(source, options);
      phase_done("C++ compiler (or its cache) and dlopen");
    }
  } catch (const InductorError&) {
    if (!options.fallback_to_eager) throw;
    return ir::interpret(graph);
  }
  try {
    detail::make_plan(*plan, s, options);
  } catch (const InductorError&) {
    return ir::interpret(graph);  // a graph the plan cannot express: the interpreter runs it, or names the fault
  }
  // Stored once it has built and planned (or by estimated_ms, which lowers
  // the same graph first). A failed write costs the next process a
  // compile, not this one its graph.
  if (key && !cached) {
    try {
      detail::store_schedule(*key, s, *plan->graph, options);
    } catch (const InductorError& e) {
      TORCH_WARN("inductor: the graph cache entry was not written: ", e.what());
    }
  }
  phase_done("run-time plan");
  plan->threads = detail::thread_tuner(plan->device, options);
  plan->profile = options.profile;
  if (plan->profile) {
    plan->times.resize(plan->steps.size());
    plan->first_ms.resize(plan->steps.size());
    std::ostringstream os;
    os << std::fixed << std::setprecision(1) << "inductor compile "
       << std::chrono::duration<double, std::milli>(Clock::now() - started).count() << " ms:";
    for (size_t i = 0; i < phases.size(); ++i)
      os << (i ? "; " : " ") << phases[i].first << " " << phases[i].second << " ms";
    std::cerr << os.str() << "\n";
  }
  // Note [CUDA graphs] in runtime/cuda_graphs.cpp.
  return detail::with_cuda_graphs([plan](std::vector<at::Tensor>& inputs) { return detail::run_plan(*plan, inputs); },
                                  *plan->graph, plan->device, options.cuda_graphs, options.profile);
}

}  // namespace crucible::inductor