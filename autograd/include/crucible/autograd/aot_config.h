// AotConfig: the compilers and options of an AOTAutograd compilation
// (torch/_functorch/aot_autograd.py's AOTConfig).
#pragma once

#include <crucible/autograd/aot_cache.h>
#include <crucible/ir/backend.h>
#include <crucible/ir/instrument.h>
#include <crucible/ir/interpreter.h>
#include <crucible/partitioner/default_partition.h>
#include <crucible/runtime/compiler_wrapper.h>
#include <crucible/runtime/instruments.h>
#include <crucible/tracer/decomposition.h>
#include <crucible/tracer/make_fx.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace crucible::autograd {

struct AotRequest;

/// The compilers and options of an AOTAutograd compilation; it mirrors
/// AOTConfig in torch/_functorch/aot_autograd.py (fw_compiler, bw_compiler,
/// inference_compiler, partition_fn, decompositions, num_params_buffers,
/// keep_inference_input_mutations), with options the seed keeps elsewhere
/// (functionalize_rng_ops, debug_assert, a recompile limit) and the graph
/// cache of Note [AOT graph cache]. Each compilation gets a copy. The
/// defaults interpret every graph (ir::interpret) after the default
/// partition.
struct AotConfig {
  /// Compiles the forward part of the partitioned joint graph.
  ir::Backend fw_compiler = ir::interpret;
  /// Compiles the backward part, lazily at the first backward call.
  ir::Backend bw_compiler = ir::interpret;
  /// Compiles the whole graph when no gradient is needed (no input requires
  /// grad, or grad mode is off).
  ir::Backend inference_compiler = ir::interpret;
  /// Splits the joint graph; see partitioner/partition.h.
  partitioner::PartitionFn partition_fn = partitioner::default_partition;
  /// What the metadata analysis and the graph traces run on: fake tensors
  /// (Fake: metadata and the device they stand for, no data, so compiling
  /// takes little memory and time; ops without a Meta kernel run on CPU
  /// stand-ins, Note [Fake tensors] in tracer/src/trace_session.cpp),
  /// copies of the arguments (Real), or fake tensors where a fake trace can
  /// follow the function and copies where not (Auto, the default: Note [Auto
  /// trace mode] in tracer/src/make_fx.cpp). The graphs are the same either
  /// way, unless the function reads its tensors' values outside ATen ops.
  tracer::TraceMode trace_mode = tracer::TraceMode::Auto;
  /// Ops rewritten while tracing.
  tracer::DecompositionTable decompositions;
  /// Other modules the function may read from outside, by name: a lifted
  /// parameter or buffer of one is named "<name>.<fully qualified name>"
  /// (Note [Lifted tensors] in tracer/make_fx.h), and their train()/eval()
  /// flags are guarded (Note [AOT cache guards]): switching one compiles
  /// again. Held weakly: naming keeps no module alive.
  std::vector<std::pair<std::string, std::weak_ptr<torch::nn::Module>>> named_modules;
  /// Freezing: tensors the function reads from outside its arguments become
  /// constants of the graphs instead of lifted inputs (tracer::TraceOptions::
  /// freeze): no gradient reaches them, and later changes to them are not
  /// seen. Only for inference with fixed weights.
  bool freeze = false;
  /// The first num_params_buffers inputs are module state, parameters then
  /// buffers (aot_module sets it): the graphs mark those placeholders
  /// InputKind::Parameter (requiring grad) or Buffer, and the dedupe and
  /// synthetic-base wrappers leave them in place.
  size_t num_params_buffers = 0;
  /// On the inference path, keep data writes to inputs inside the compiled
  /// graph as trailing aten::copy_ nodes instead of returning the new values
  /// for the runtime wrapper to copy (the seed's
  /// keep_inference_input_mutations). Metadata writes still go through the
  /// wrapper.
  bool keep_inference_input_mutations = false;
  /// At most this many compilations per function (one per distinct input
  /// metadata, see Note [AOT cache guards]); a call needing one more throws
  /// AotError. Unset: no limit.
  std::optional<size_t> recompile_limit;
  /// Replace random ops by Philox draws from a seed and offset that are
  /// inputs of the graph (see Note [Functionalized RNG]), so a recomputed
  /// random op draws what the forward drew. Off: random ops draw from the
  /// device's default generator, exactly as eager does
  /// (Note [RNG during compilation]).
  bool functionalize_rng_ops = false;
  /// Check at every call that inputs compiled as not requiring grad still do
  /// not (DebugAssertWrapper).
  bool debug_assert = false;
  /// Runtime wrappers added to the chain after AOTAutograd's own
  /// (Note [AOT dispatch]): their pre_compile runs after the built-in ones in
  /// order, their post_compile before them in reverse, so the first added is
  /// the outermost of these (Note [Compiler wrapper order]). A wrapper sees
  /// the request after the metadata analysis, and wraps the compiled callable
  /// (CUDA graphs, output layouts, instrumentation).
  runtime::WrapperList<AotRequest> wrappers;
  /// Told of every stage of the compilations (ir/instrument.h, Note
  /// [Compilation stages]): the process-wide timer, metrics log and counters
  /// by default (runtime::default_instruments()); a list of the caller's
  /// replaces them, and then no global is touched.
  ir::Instruments instruments = runtime::default_instruments();
  /// The name the inference graph is reported under ("train_step" for a
  /// compiled training step).
  std::string inference_graph_name = "inference";
  /// Replaces the function before a compilation analyses it, given the
  /// compilation's arguments and its TraceFn (the hook of the seed's
  /// pre-grad passes, which compile_fx runs on Dynamo's graph before
  /// aot_autograd; pipeline::Builder sets it: Note [Pre-grad graphs]). Called
  /// outside any trace, once per compilation. Unset: the function as given.
  /// (`trace` is the compilation's TraceFn, aot_request.h.)
  std::function<tracer::TensorFn(
      const tracer::TensorFn& flat_fn,
      const std::function<tracer::TraceResult(const tracer::TensorFn&, const std::vector<at::Tensor>&,
                                              const tracer::TraceOptions&)>& trace,
      const std::vector<at::Tensor>& flat_args)>
      pre_grad;
  /// What identifies fw_compiler, bw_compiler and inference_compiler with
  /// their options, e.g. a backend's name and its pass list
  /// ("interpreter;dce,cse"). Callables whose configs share a non-empty key
  /// share compiled graphs through `cache` (Note [AOT graph cache] in
  /// aot_cache.h says what the key promises). Empty: unknown compilers,
  /// nothing shared.
  std::string compiler_key;
  /// Where graphs compiled under compiler_key are kept: the process-wide
  /// cache by default, an AotCache of the caller's to share only among the
  /// callables given it, or nullptr for none.
  std::shared_ptr<AotCache> cache = default_aot_cache();
  /// Where the graphs a compilation traces are kept for later processes
  /// (Note [AOT trace cache], the seed's AOTAutogradCache): a directory,
  /// made mode 0700 when missing; "" names the default, the inductor's
  /// ($XDG_CACHE_HOME/crucible/inductor), where torch keeps its
  /// AOTAutogradCache too. Unset (the default), or with an empty
  /// compiler_key: nothing is kept. A directory that cannot be used is
  /// warned of once and the compilation traces as without it. In real mode
  /// the function also runs once on fake tensors, its fingerprint (Note
  /// [Fake fingerprints] in autograd/src/trace_cache.h).
  std::optional<std::string> disk_cache_dir;
};

}  // namespace crucible::autograd
