// The AOTAutograd compilation of one specialization: metadata analysis, the
// wrapper chain, and the inference or autograd path
// (torch/_functorch/aot_autograd.py's create_aot_dispatcher_function,
// _aot_autograd/jit_compile_runtime_wrappers.py's aot_dispatch_base and
// aot_dispatch_autograd). aot_function, aot_module and
// aot_module_simplified compile through create_aot_dispatcher_function.
#pragma once

#include <crucible/autograd/aot_request.h>
#include <crucible/runtime/lifted_inputs.h>

namespace crucible::autograd {

// Note [AOT dispatch]
// A compilation picks a path, as the seed's create_aot_dispatcher_function
// does:
//  - inference, when grad mode is off or no argument requires grad: the
//    function is traced (functionalized, under no_grad) into one graph,
//    compiled by inference_compiler and run under no_grad;
//  - autograd otherwise: the joint graph
//      joint(primals, tangents) = (forward outputs,
//                                  grad(forward outputs, primals, tangents))
//    is traced through torch::autograd::grad, partitioned by partition_fn,
//    the forward compiled by fw_compiler at once and the backward by
//    bw_compiler at the first backward. The compiled forward runs inside a
//    custom autograd Function whose backward node runs the compiled
//    backward, so loss.backward() and torch::autograd::grad reach it as they
//    reach any eager op; retain_graph and freed saved values behave as in
//    eager, and saved values are saved as the Function's own (detached from
//    the caller's graph) tensors.
// The forward outputs are those of Note [Forward graph outputs]; tangents go
// to the non_alias outputs that require grad, to the intermediate bases that
// do, and to the new values of written inputs that require grad (the runtime
// wrapper's copy_ then carries their gradient into the backward). Tangents
// are made contiguous before the backward runs (it was traced with
// contiguous ones); an undefined incoming gradient (an output the loss does
// not use) is passed as zeros.
// Before either path the wrappers run their pre_compile in this order
// (post_compile in reverse; Note [Compiler wrapper order]):
//   AOTDedupeWrapper, AOTSyntheticBaseWrapper,
//   FunctionalizedRngRuntimeWrapper (with functionalize_rng_ops),
//   then AotConfig::wrappers (the caller's: CUDA graphs, output layouts);
// and each path puts RuntimeWrapper (then DebugAssertWrapper, with
// debug_assert) directly around what it compiled, as the seed does.

// Note [Autocast in compiled graphs]
// The tracer records ops below the autocast keys, so a graph traced under
// at::autocast holds the casts and reduced-precision ops autocast chose
// (the seed records them the same way). Running that graph under autocast
// again would cast a second time; the runtime wrapper and the compiled
// backward therefore run the graphs with the autocast keys excluded (the
// seed's disable_amp), and the guards hold the autocast state of the
// compilation (on or off and the dtype, per device type), so a call under
// another state compiles again: a compiled call computes what the eager call
// under the same state computes.

// Note [RNG during compilation]
// Compiling runs the function several times (the metadata analysis, the
// joint or inference trace, again after a wrapper changes the calling
// convention), and each run draws from the default generators. The
// compilation saves the state of the CPU generator, and of every CUDA
// device's generator where CUDA is present, and restores them when it
// ends (also when it throws), so the compiled call then draws exactly what
// the eager call would have drawn from the same state. Random ops stay in
// the forward graph and draw at run time (unless AotConfig::
// functionalize_rng_ops, Note [Functionalized RNG]); what the backward needs
// from them (dropout's mask) is a saved value, so forward and backward
// agree as they do in eager. Given the same generator state before the
// call, a compiled CPU dropout therefore equals eager's bit for bit: the
// interpreter runs the same kernels, drawing in the same order (on CUDA
// too: native_dropout draws from the CUDA generator's Philox offset as in
// eager).

/// One compiled specialization.
struct AotCompiled {
  /// Takes the caller's arguments followed by the lifted tensors
  /// (lifted.append_to), returns the function's outputs and applies its
  /// input mutations, the lifted tensors' included.
  ir::CompiledFn fn;
  /// The tensors the function reads from outside its arguments, read afresh
  /// at every call (Note [Lifted tensors] in tracer/make_fx.h).
  runtime::LiftedInputs lifted;
};

// Note [Lifting in AOTAutograd]
// The metadata analysis is the first trace of a compilation; the tensors the
// tracer lifts there (Note [Lifted tensors]) are appended to flat_args,
// flat_fn learns to ignore them as arguments, every later trace names them
// in TraceOptions::lifted_inputs (the function still reads them itself), and
// the analysis runs again so that input_info covers them (their writes,
// their requires_grad, which may make the compilation take the autograd
// path). From there they are inputs like any other: the joint graph
// differentiates them, the runtime wrapper writes their mutations back, the
// autograd Function returns their gradients, which the engine accumulates
// into their .grad as eager's backward does. A lifted tensor that is also an
// argument, or shares storage with an argument or another lifted tensor
// while one of them is written, is refused: the dedupe and synthetic-base
// wrappers would have to replace it by another tensor, and the function
// reads it itself.

/// Compiles `request` (flat_fn, trace, flat_args, config, compile_id; the
/// rest is filled in) as Note [AOT dispatch] says, keeping the default
/// generators' states (Note [RNG during compilation]), lifting what the
/// function reads from outside (Note [Lifting in AOTAutograd]).
/// Returns a callable over arguments like request.flat_args followed by the
/// lifted tensors (same sizes, strides, dtypes, devices, requires_grad and
/// aliasing; nothing checks that: callers guard, see Note [AOT cache
/// guards]). Emits its stages to config.instruments (a "compile" holding
/// collect_metadata, trace_joint, partition, fw_compiler, or
/// collect_metadata, trace_inference, inference_compiler; the backward's
/// bw_compiler in a "compile" of its own at the first backward: Note
/// [Compilation stages] in ir/instrument.h). With config.compiler_key set,
/// each backend is called through config.cache, and a graph compiled before
/// under the same key is reused without calling it (Note [AOT graph cache];
/// the compiler stage's event says `cached` and the cache's outcome). Throws AotError for what cannot be
/// compiled (the message names the input or output and what to do), and
/// the tracer's TraceError; the caller's tensors are never changed by a
/// compilation.
AotCompiled create_aot_dispatcher_function(AotRequest request);

/// The inference path (the seed's aot_dispatch_base): traces the inference
/// graph, compiles it with config.inference_compiler and wraps it in
/// RuntimeWrapper. request.fw_metadata must be the inference analysis
/// (collect_metadata with is_train false); with
/// config.keep_inference_input_mutations it marks the kept writes in it.
/// Errors as create_aot_dispatcher_function.
ir::CompiledFn aot_dispatch_base(AotRequest& request);

/// The autograd path (the seed's aot_dispatch_autograd): traces the joint
/// graph, partitions it with config.partition_fn, compiles the forward with
/// config.fw_compiler (the backward with config.bw_compiler at the first
/// backward) and returns the autograd Function's apply wrapped in
/// RuntimeWrapper. request.fw_metadata must be the training analysis.
/// Errors as create_aot_dispatcher_function, and the partitioner's.
ir::CompiledFn aot_dispatch_autograd(AotRequest& request);

}  // namespace crucible::autograd
