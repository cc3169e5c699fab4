// The pipeline builder: composes Crucible's stages — tracer options and
// decompositions, a pass list, a partitioner, a backend, runtime wrappers —
// each replaceable, with instruments around every stage, and compiles
// functions and whole training steps with them (torch.compile's
// backend/options, AOTAutograd's AOTConfig and _spmd's compile in one place).
//
//   Builder b;
//   b.passes({"dce", "cse"}).backend("interpreter").instrument(std::make_shared<StageTimer>(timer));
//   auto f = b.compile(fn);                              // forward + backward, via aot_function
//   auto m = b.compile(module, forward);                 // the same over a module, via aot_module
//   auto step = b.compile_train_step(module, opt, loss); // forward + backward + optimizer, one graph
#pragma once

#include <crucible/autograd/aot_config.h>
#include <crucible/autograd/aot_function.h>
#include <crucible/autograd/aot_module.h>
#include <crucible/autograd/aot_request.h>
#include <crucible/ir/instrument.h>
#include <crucible/ir/pass_manager.h>
#include <crucible/partitioner/min_cut_partition.h>
#include <crucible/partitioner/partition.h>
#include <crucible/pipeline/train_step.h>
#include <crucible/runtime/backend_registry.h>
#include <crucible/runtime/compiler_wrapper.h>
#include <crucible/tracer/make_fx.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace crucible::pipeline {

/// A value type: setters return *this for chaining; copies are independent
/// (instruments and wrappers are shared pointers, shared by the copies).
/// See Note [Compilation stages] in ir/instrument.h for what runs when.
// Note [Builder compiler key]
// compile() goes through AOTAutograd, whose graph cache lets callables that
// trace to the same graph share one backend call when their compilers carry
// the same key. A builder made only of Crucible's own stages — passes by name
// from ir::PassRegistry::builtin(), a backend by name from
// BackendRegistry::builtin(), no wrappers — knows what its compilers do, so
// its key is derived from those names ("backend=interpreter;passes=dce,cse").
// Once user code joins the chain (add_pass, a registry of the caller's, a
// backend function, a wrapper) the builder cannot vouch for it and the key is
// empty: no sharing, unless the caller names the compilers with
// compiler_key(std::string). Instruments are not part of the key: they see,
// they do not change; on a cache hit the compiler stage's after_stage says
// `cached` and no pass or backend stage runs (the trace and partition
// stages still do).

// Note [Pass phases]
// As the seed's compile_fx, the builder runs three pass lists:
//  - pre-grad: on the forward graph of the function, traced (real or fake,
//    not functionalized) before AOTAutograd and then run in its place, so
//    AOTAutograd differentiates what the passes made of it (Note [Pre-grad
//    graphs]). compile() applies them to its function, compile_train_step
//    to its loss function. By default the backend's
//    (runtime::BackendInfo::pre_grad_passes: the inductor's
//    fuse_flash_attention, none for the interpreter), skipped
//    without a warning where the forward cannot be replayed; an empty list
//    makes no extra trace.
//  - joint: on the joint graph before it is partitioned (compile()'s
//    autograd path), and on the train-step graph (forward, backward and
//    update in one) before the post-grad passes. Empty by default.
//  - post-grad: on every graph the backend compiles (forward, backward,
//    inference, train step). "dce" and "cse" by default.
//  - remat: on the train-step graph, last (Builder::remat): min-cut
//    rematerialization, kept by default where the backend's cost model
//    finds it lowers the peak at ≤ 2% more time.
// Each pass runs with the instruments' events and, when asked, verification.

class Builder {
 public:
  /// The defaults: TraceMode::Auto (fake-mode tracing where a fake trace
  /// can follow the function, Note [Auto trace mode] in tracer/src/make_fx.cpp),
  /// the passes "dce" and "cse", the
  /// default partition, the best backend of runtime::BackendRegistry::
  /// builtin() with the decompositions it lowers from and its pre-grad
  /// passes (the inductor with the core ATen decompositions and bf16/f16
  /// attention fused where a program links crucible-inductor, as
  /// torch.compile defaults to it; the interpreter, the reference, one call
  /// away: backend("interpreter")), no wrappers,
  /// runtime::default_instruments() (the process-wide timer, metrics log and
  /// counters), and verification between passes.
  Builder();
  /// The default pass list's names: "dce", "cse".
  static const std::vector<std::string>& default_passes();

  // --- choosing the stages -------------------------------------------------------

  /// How compile() and compile_train_step trace (through AOTAutograd,
  /// which always functionalizes): mode (real or fake, AotConfig::
  /// trace_mode), freeze and decompositions (an empty table: the backend's,
  /// BackendInfo::decompositions; name none with decompositions({})). AOTAutograd sets
  /// `functionalize`, max_constant_bytes, source_names and lifted_inputs
  /// itself (name other modules with name_module()).
  Builder& trace_options(tracer::TraceOptions options);
  /// Names another module the compiled functions may read from outside
  /// (a GAN's generator step reads the discriminator): its parameters and
  /// buffers, lifted to inputs (Note [Lifted tensors] in tracer/make_fx.h),
  /// are named "<name>.<fully qualified name>" in graphs and messages, and
  /// its train()/eval() flags are guarded: switching it compiles again (a
  /// module read from outside without a name is not guarded so). Held
  /// weakly. Throws PipelineError if `module` is null.
  Builder& name_module(std::string name, const std::shared_ptr<torch::nn::Module>& module);
  /// Replaces the decomposition table of the trace options, also where the
  /// backend has decompositions of its own (an empty table: none).
  Builder& decompositions(tracer::DecompositionTable table);
  /// Replaces the post-grad pass list (Note [Pass phases]) with Crucible's
  /// passes by name (ir::PassRegistry::builtin()); `passes({})` empties it.
  /// Throws ir::IrError naming an unknown pass and listing the known ones.
  Builder& passes(const std::vector<std::string>& names);
  /// Replaces the pre-grad pass list (Note [Pass phases]), as passes() does
  /// the post-grad one, also where the backend has pre-grad passes of its
  /// own (`pre_grad_passes({})`: none). Throws ir::IrError for an unknown
  /// pass.
  Builder& pre_grad_passes(const std::vector<std::string>& names);
  /// Replaces the joint pass list (Note [Pass phases]), as passes() does the
  /// post-grad one. Throws ir::IrError for an unknown pass.
  Builder& joint_passes(const std::vector<std::string>& names);
  /// The same from a registry of the caller's (its passes are user code: see
  /// compiler_key()).
  Builder& passes(const std::vector<std::string>& names, const ir::PassRegistry& registry);
  /// Appends a pass (a user pass, or one from any registry) to the list.
  Builder& add_pass(ir::Pass pass);
  /// Appends a pass to the joint list (Note [Pass phases]): it sees the
  /// joint graph of compile() and the whole graph of compile_train_step
  /// (spmd's data-parallel expansion runs here).
  Builder& add_joint_pass(ir::Pass pass);
  /// Verify the graph before the first pass and after each (ir::PassManager's
  /// verify); on by default.
  Builder& verify_passes(bool verify);
  /// The rematerialization inside a training step's graph (forward,
  /// backward and update in one): partitioner::remat_pass(*options), which
  /// compile_train_step runs after the post-grad passes (Note
  /// [Rematerialization in one graph] in partitioner/min_cut_partition.h).
  /// By default, where the backend has a cost model (runtime::BackendInfo::
  /// estimated_ms: the inductor's roofline), min-cut's heuristics weighed
  /// by it: the rewrite is kept where it lowers the step's estimated peak
  /// and is at most 2% slower by the model (MinCutOptions::max_slowdown),
  /// as torch.compile's inductor partitions with min-cut by default; none
  /// for a backend without one. `remat(std::nullopt)`: none. Once chosen
  /// here it stays through backend(). compile()'s graphs are not touched,
  /// so the compiler key does not name it.
  Builder& remat(std::optional<partitioner::MinCutOptions> options);
  /// Splits joint graphs for compile() (see partitioner/partition.h).
  /// Throws PipelineError if `partition_fn` is empty.
  Builder& partitioner(partitioner::PartitionFn partition_fn);
  /// A backend by name from runtime::BackendRegistry::builtin(), traced with
  /// its decompositions unless decompositions() chose others. Throws
  /// runtime::WrapperError naming an unknown backend and listing the known
  /// ones.
  Builder& backend(std::string_view name);
  /// The same from a registry of the caller's (user code: see compiler_key()).
  Builder& backend(std::string_view name, const runtime::BackendRegistry& registry);
  /// A user backend, under a name for reports. Throws PipelineError if
  /// `backend` is empty (checked here, not at the first compilation).
  Builder& backend(std::string name, ir::Backend backend);
  /// Appends a runtime wrapper around the backend (runtime/compiler_wrapper.h;
  /// the first added is the outermost). Throws PipelineError if `wrapper`
  /// is null.
  Builder& add_wrapper(std::shared_ptr<runtime::GraphWrapper> wrapper);
  /// Appends a runtime wrapper to the AOTAutograd chain of compile() and
  /// compile_train_step (AotConfig::wrappers: after AOTAutograd's own, the
  /// first added outermost of these; Note [Compiler wrapper order]). It sees
  /// the request after the metadata analysis and wraps the compiled callable.
  /// Throws PipelineError if `wrapper` is null.
  Builder& add_aot_wrapper(std::shared_ptr<autograd::AotWrapper> wrapper);
  /// Appends an instrument (ir/instrument.h; the standard ones are in
  /// runtime/instruments.h and pipeline/instruments.h). It sees every stage
  /// of the compilations, AOTAutograd's included (Note [Compilation
  /// stages]). Throws PipelineError if `instrument` is null.
  Builder& instrument(std::shared_ptr<ir::Instrument> instrument);
  /// Replaces every instrument, the default ones included: with a list of
  /// the caller's the compilations touch no process-wide timer, metrics log
  /// or counters. Throws PipelineError if one is null.
  Builder& instruments(ir::Instruments instruments);
  /// Names the compilers this builder makes, for the graph cache that
  /// compile() shares between callables (autograd::AotConfig::compiler_key,
  /// Note [AOT graph cache]): builders with one key promise to compile a
  /// graph alike. Empty: never share. See Note [Builder compiler key].
  Builder& compiler_key(std::string key);

  /// The trace options, decompositions included (the backend's where none
  /// were chosen; without the names of name_module(), which are added when
  /// a trace starts).
  tracer::TraceOptions trace_options() const;
  /// The post-grad pass list, in the order the passes run.
  const std::vector<ir::Pass>& passes() const { return passes_; }
  /// The pre-grad and joint pass lists (Note [Pass phases]).
  const std::vector<ir::Pass>& pre_grad_passes() const { return pre_grad_passes_; }
  /// Whether pre_grad_passes(names) chose the pre-grad list; else it is the
  /// backend's own, skipped without a warning where the forward cannot be
  /// replayed (Note [Pass phases]).
  bool pre_grad_passes_chosen() const { return pre_grad_chosen_; }
  const std::vector<ir::Pass>& joint_passes() const { return joint_passes_; }
  /// The train step's rematerialization (remat(options)); nullopt: none.
  const std::optional<partitioner::MinCutOptions>& remat() const { return remat_; }
  /// The backend's name: its registry name, or the one given with a user
  /// backend.
  const std::string& backend_name() const { return backend_name_; }
  /// Whether the backend captures CUDA graphs (BackendInfo::cuda_graphs; a
  /// user backend does not say, so false).
  bool backend_cuda_graphs() const { return backend_cuda_graphs_; }
  /// The instruments, in the order they are called (the defaults first).
  const ir::Instruments& instruments() const { return instruments_; }
  /// The key compile() passes to the graph cache: the one set by
  /// compiler_key(std::string), else derived per Note [Builder compiler key].
  std::string compiler_key() const;

  // --- running one stage (for callers that compose their own compilation) --------

  /// The "trace" stage: calls `trace` with the builder's trace options (and
  /// the names of name_module() as source_names), with the instruments'
  /// events around it; the graph it returns is reported
  /// under `graph_name`. Use it to trace with any tracer entry point
  /// (make_fx, functional_call) and adjust the result (its signature) inside.
  tracer::TraceResult trace(std::string_view graph_name,
                            const std::function<tracer::TraceResult(const tracer::TraceOptions&)>& trace) const;
  /// The pass stages: runs the post-grad pass list over `graph` in place.
  /// Errors as ir::PassManager::run.
  void run_passes(ir::Graph& graph, std::string_view graph_name) const;
  /// The same with another list (pre_grad_passes(), joint_passes(), ...).
  void run_passes(const std::vector<ir::Pass>& passes, ir::Graph& graph, std::string_view graph_name) const;
  /// The "backend" stage: the wrappers and the backend, on `graph` with one
  /// example input per placeholder. Errors are the backend's.
  ir::CompiledFn run_backend(const ir::Graph& graph, const std::vector<at::Tensor>& example_inputs,
                             std::string_view graph_name) const;
  /// Passes then backend, as an ir::Backend whose graphs are reported under
  /// `graph_name`: what AotConfig's compilers are set to. Throws nothing
  /// itself; it holds a copy of the builder, so later setters do not reach
  /// it. Calling it clones the graph (the caller's is untouched) and throws
  /// what run_passes and run_backend throw, and the instruments' exceptions.
  ir::Backend graph_compiler(std::string graph_name) const;
  /// The builder's choices as AotConfig: fw/bw/inference compilers =
  /// graph_compiler("forward" / "backward" / "inference"), the joint passes
  /// then the partitioner as partition_fn, the decompositions, freeze, the
  /// modules of name_module(), the instruments, compiler_key(), and the
  /// backend's cache directory as disk_cache_dir (BackendInfo::cache_dir).
  autograd::AotConfig aot_config() const;
  /// The pre-grad stage (Note [Pre-grad graphs] in builder.cpp): traces
  /// `fn` on `args` with `trace` and the builder's trace options, neither
  /// functionalized nor decomposed, runs pre_grad_passes() over that forward
  /// graph, and returns a function that runs the graph with the interpreter
  /// (on the same kind of arguments; the tensors the trace lifted are read
  /// again at each call). What AotConfig::pre_grad is set to; the training
  /// step calls it on the loss alone. Returns `fn` itself, with a warning
  /// and no passes run, where the trace reads tensor values (Note [Pre-grad
  /// traces that read values]) or the forward's gradient is not its ops'
  /// derivative: a custom autograd Function or a hook on an intermediate
  /// tensor is behind its outputs (Note [Pre-grad graphs that autograd
  /// cannot replay]). Throws what the trace and the passes throw; the
  /// returned function throws PipelineError when a lifted tensor has been
  /// freed since.
  tracer::TensorFn pre_grad_function(const tracer::TensorFn& fn, const autograd::TraceFn& trace,
                                     const std::vector<at::Tensor>& args) const;

  // --- compiling ---------------------------------------------------------------

  /// `fn` compiled ahead of time, forward and backward: aot_function(fn,
  /// aot_config()). It compiles at the first call for each input metadata
  /// (Note [AOT cache guards]); the instruments see those compilations.
  /// Throws nothing here: errors come at the call that compiles, as
  /// AotFunction::operator() lists them (autograd::AotError, wrapping a
  /// c10::Error of `fn` while traced; TraceError, the passes' ir::IrError,
  /// the backend's and the instruments' exceptions unchanged). The backward
  /// graph compiles, and can fail, at the first backward call.
  autograd::AotFunction compile(tracer::TensorFn fn) const;
  /// `fn(module, inputs)` compiled ahead of time with the module's parameters
  /// and buffers lifted to inputs: aot_module(module, fn, aot_config()). As
  /// in eager, loss.backward() fills the module's .grad and an optimizer's
  /// updates are seen by the next call; see autograd/aot_module.h.
  /// Throws autograd::AotError here for a null `module`; compile errors come
  /// at the call that compiles, as for compile(fn) (AotModule::operator()).
  autograd::AotModule compile(std::shared_ptr<torch::nn::Module> module, tracer::ModuleFn fn) const;
  /// A whole training step as one graph; see compile_train_step in train_step.h.
  TrainStep compile_train_step(std::shared_ptr<torch::nn::Module> module, torch::optim::Optimizer& optimizer,
                               LossFn loss_fn) const;

 private:
  void set_backend(const runtime::BackendInfo& info);

  tracer::TraceOptions trace_options_;
  bool decompositions_chosen_ = false;  // decompositions() or trace_options() named a table
  std::string backend_decompositions_;  // runtime::BackendInfo::decompositions
  std::vector<std::pair<std::string, std::weak_ptr<torch::nn::Module>>> named_modules_;
  std::vector<ir::Pass> pre_grad_passes_;
  bool pre_grad_chosen_ = false;  // pre_grad_passes() named a list (else the backend's)
  std::vector<ir::Pass> joint_passes_;
  std::vector<ir::Pass> passes_;
  bool verify_passes_ = true;
  std::optional<partitioner::MinCutOptions> remat_;
  bool remat_chosen_ = false;  // remat() chose (else the backend's cost model decides)
  partitioner::PartitionFn partition_fn_;
  std::string backend_name_;
  bool backend_cuda_graphs_ = false;
  std::optional<std::string> backend_cache_dir_;  // runtime::BackendInfo::cache_dir
  ir::Backend backend_;
  runtime::WrapperList<runtime::GraphRequest> wrappers_;
  runtime::WrapperList<autograd::AotRequest> aot_wrappers_;
  ir::Instruments instruments_;
  std::optional<std::string> compiler_key_;  // set by compiler_key(std::string)
  bool user_compilers_ = false;              // a user pass, registry, backend or wrapper is in the chain
};

}  // namespace crucible::pipeline
