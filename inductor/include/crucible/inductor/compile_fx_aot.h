// compile_fx: inductor's whole path from a function of tensors or a
// torch::nn::Module to a compiled callable — the core decompositions,
// AOTAutograd, the min-cut partition, the post-grad passes and
// compile_fx_inner on every graph. Mirrors compile_fx of
// torch/_inductor/compile_fx.py (compile_fx_inner, its backend, is in
// compile_fx.h).
#pragma once

#include <crucible/autograd/aot_config.h>
#include <crucible/autograd/aot_function.h>
#include <crucible/autograd/aot_module.h>
#include <crucible/inductor/options.h>
#include <crucible/ir/instrument.h>
#include <crucible/runtime/instruments.h>
#include <crucible/tracer/functional_call.h>
#include <crucible/tracer/make_fx.h>

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace crucible::inductor {

// Note [compile_fx]
// compile_fx is AOTAutograd configured for inductor, as the seed's
// compile_fx calls aot_autograd with its own compilers:
//  - decompositions: tracer::core_aten_decompositions(), so softmax, layer
//    norm, GELU, the losses and their backwards reach the lowering as the
//    pointwise ops and reductions they compute (the seed's
//    select_decomp_table);
//  - partition_fn: partitioner::min_cut_rematerialization_partition with
//    its default heuristics: the forward saves what a minimum cut chooses
//    and the backward recomputes cheap pointwise ops, which it fuses for
//    free (Note [Min-cut partition]);
//  - fw_compiler, bw_compiler, inference_compiler: the post-grad passes
//    (post_grad_passes(), verified between passes) on a copy of the graph,
//    then compile_fx_inner with the given InductorOptions;
//  - keep_inference_input_mutations, as the seed sets it: on the inference
//    path, writes to inputs stay in the graph as trailing copies, which
//    compile_fx_inner writes straight into the inputs;
//  - compiler_key: the post-grad passes and every InductorOptions field,
//    so callables compiled with equal options share compiled graphs
//    through the process-wide AOT graph cache (Note [AOT graph cache]);
//  - disk_cache_dir: the options' cache directory, so a later process finds
//    the traced graphs there beside the kernels (Note [AOT trace cache]).
// The seed's pre-grad and joint passes (pattern rewrites of Dynamo's graph
// and of the joint graph) have no counterpart here yet: both lists are
// empty, as pipeline::Builder's are by default. Tracing runs on copies of
// the example inputs (TraceMode::Real).

/// The passes compile_fx runs on every graph before compile_fx_inner, in
/// order: "dce", "cse" (ir::PassRegistry::builtin(); the seed's
/// post_grad_passes). The same list as pipeline::Builder's default.
const std::vector<std::string>& post_grad_passes();

/// The AotConfig compile_fx compiles with (Note [compile_fx]); `instruments`
/// are told of every stage, the post-grad passes and the "backend" stage
/// around compile_fx_inner included (Note [Compilation stages] in
/// ir/instrument.h). Use it to compile with autograd::aot_function /
/// aot_module directly, e.g. lazily at the first call, or with wrappers or
/// a recompile limit added. Throws nothing.
autograd::AotConfig compile_fx_config(const InductorOptions& options = {},
                                      ir::Instruments instruments = runtime::default_instruments());

/// `fn` compiled by inductor, forward and backward: aot_function(fn,
/// compile_fx_config(options)), compiled here for `example_inputs` (one
/// tensor per input of `fn`, of the sizes, dtypes, devices and
/// requires_grad of the calls to come) in the current grad mode: the
/// autograd path when grad mode is on and an input requires grad (the
/// backward graph then compiles at the first backward call), else the
/// inference path. Calls with other input metadata compile again (Note
/// [AOT cache guards] in autograd/aot_function.h). `fn` must be a function
/// of its tensor inputs, as aot_function requires; compiling runs it on
/// copies of `example_inputs`, which are not changed.
/// Throws what AotFunction::operator() throws at a call that compiles:
/// autograd::AotError for what cannot be compiled (an error of `fn` while
/// traced, an undefined example input), the tracer's TraceError, the
/// passes' ir::IrError, and InductorError when the C++ compiler or NVRTC
/// fails (unless options.fallback_to_eager).
autograd::AotFunction compile_fx(tracer::TensorFn fn, const std::vector<at::Tensor>& example_inputs,
                                 const InductorOptions& options = {});

/// `fn(module, inputs)` compiled by inductor with the module's parameters
/// and buffers lifted to inputs: aot_module(module, fn,
/// compile_fx_config(options)), compiled here for `example_inputs` (the
/// inputs besides the module's state) in the current grad mode and the
/// module's train()/eval() flags, as AotModule::compile does. As in eager,
/// each call reads the module's current state, loss.backward() fills the
/// parameters' .grad, and buffers the module writes are updated in it.
/// Throws autograd::AotError for a null `module`, and what compile_fx(fn,
/// ...) throws; the module is never changed when compiling fails.
autograd::AotModule compile_fx(std::shared_ptr<torch::nn::Module> module, tracer::ModuleFn fn,
                               const std::vector<at::Tensor>& example_inputs, const InductorOptions& options = {});

}  // namespace crucible::inductor
