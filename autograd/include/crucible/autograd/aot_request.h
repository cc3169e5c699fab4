// AotRequest: what AOTAutograd compiles, and the wrapper type over it
// (the seed's (flat_fn, flat_args, aot_config, fw_metadata) quadruple that
// runtime_wrappers.py's CompilerWrapper.pre_compile edits).
#pragma once

#include <crucible/autograd/aot_config.h>
#include <crucible/autograd/view_and_mutation_meta.h>
#include <crucible/ir/hash.h>
#include <crucible/runtime/compiler_wrapper.h>
#include <crucible/tracer/make_fx.h>

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace crucible::autograd {

/// Traces `body` over arguments like `args`: tracer::make_fx for a function
/// of tensors; for a module, tracer::functional_call, where the leading
/// config.num_params_buffers arguments are the module's own state (see
/// aot_module.h).
using TraceFn = std::function<tracer::TraceResult(const tracer::TensorFn& body, const std::vector<at::Tensor>& args,
                                                  const tracer::TraceOptions& options)>;

/// One compilation's input. Wrappers' pre_compile may replace flat_fn (to
/// change the calling convention), flat_args and fw_metadata together.
struct AotRequest {
  /// The function over flat arguments. It is only ever called inside
  /// `trace` (for a module it reads the state the trace swapped in).
  tracer::TensorFn flat_fn;
  /// How flat_fn is traced: make_fx for aot_function and
  /// aot_export_joint_simple, functional_call over the module for the module
  /// entry points (see TraceFn). Always called with functionalization on;
  /// a c10::Error it throws (the function failing) reaches the caller as
  /// AotError naming the compilation.
  TraceFn trace;
  /// The caller's tensors for this compilation. Never written: every trace
  /// runs on copies.
  std::vector<at::Tensor> flat_args;
  /// The tensors flat_fn reads from outside its arguments, lifted to inputs
  /// by this compilation (Note [Lifted tensors] in tracer/make_fx.h): they
  /// are also among flat_args, where flat_fn ignores them, and each trace
  /// names them in TraceOptions::lifted_inputs. Empty until the metadata
  /// analysis finds some.
  std::vector<at::Tensor> lifted;
  /// Their names (a module's parameter name, or "" when unknown).
  std::vector<std::string> lifted_names;
  /// collect_metadata(flat_fn, flat_args), kept up to date by the wrappers.
  ViewAndMutationMeta fw_metadata;
  /// The digest of the graph that analysis traced (collect_metadata's
  /// graph_hash), kept with fw_metadata: what the trace cache keys on
  /// (Note [AOT trace cache]). Unset: nothing is cached.
  std::optional<ir::GraphHash> analysis_hash;
  /// The compilers and options of this compilation: a copy of the
  /// callable's AotConfig, with num_params_buffers set for a module.
  AotConfig config;
  /// The autograd path (some argument requires grad and grad mode is on).
  bool trace_joint = false;
  /// "function/compilation", for metrics and messages.
  std::string compile_id;
  /// Why this compilation happens ("first call", "input 0: sizes [7, 3]
  /// (compiled for [4, 3])"), for the metrics.
  std::string recompile_reason = "first call";
};

/// A runtime wrapper of AOTAutograd. See Note [Compiler wrapper order].
using AotWrapper = runtime::CompilerWrapper<AotRequest>;

}  // namespace crucible::autograd
