// aot_function: compile a function over tensors ahead of time, forward and
// backward (torch/_functorch/aot_autograd.py's aot_function).
#pragma once

#include <crucible/autograd/aot_config.h>
#include <crucible/tracer/make_fx.h>

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace crucible::autograd {

namespace detail {
class CompileCache;
}

// Note [AOT cache guards]
// A compilation is valid for the inputs it was traced with. Each callable
// keeps its own compilations (the function object itself stands for the
// graph here; the cache shared between callables, keyed by the traced
// graph, is Note [AOT graph cache] in aot_cache.h), each with guards on each
// input's sizes, strides, dtype, device and requires_grad, on which inputs
// are the same tensor or share a storage (and, for those, their storage
// offsets and sizes: the dedupe and synthetic-base wrappers specialize on
// them), on grad mode, for aot_module on the module's train()/eval()
// flags, and on those of AotConfig::named_modules (a module the function
// reads from outside: a GAN's discriminator in the generator's step). A call
// meeting no kept compilation's guards compiles a new one, with the first
// failing guard of the closest kept compilation as the recompile reason in
// the metrics (or throws AotError once recompile_limit compilations exist):
// a compiled graph never runs on inputs it was not specialized to. Storage
// offsets of unaliased inputs are not guarded (the graphs do not depend on
// them), so slices of one buffer at different offsets share a compilation.
// What C++ does not let a guard see is not guarded: a number or flag the
// function captures is a constant of the graph (pass a value that changes
// as a 0-dim tensor), and aot_module reads the tensors registered in the
// module (named_parameters(), named_buffers()), so a member assigned
// another tensor (`linear->weight = t`, which eager's forward reads but
// the registration does not hold) is not seen: replace values with
// set_data() or an in-place copy_, as torch::nn::Module::to() does.

/// The callable aot_function returns. Copies share one cache.
class AotFunction {
 public:
  /// Runs the compiled function (compiling first on a cache miss, see
  /// Note [AOT dispatch] in aot_dispatch.h and Note [AOT cache guards]).
  /// Returns fn's outputs; on the autograd path they carry the compiled
  /// backward. Input mutations fn makes are applied to `inputs`, and outputs
  /// that alias inputs alias `inputs` (Note [Regenerating aliased outputs]).
  /// Throws AotError when `inputs` meet no compilation's guards and
  /// config.recompile_limit compilations exist already (nothing runs then);
  /// at a call that compiles, what create_aot_dispatcher_function throws
  /// (AotError for what cannot be compiled, including a c10::Error of fn
  /// while traced, wrapped with the compilation named; the tracer's
  /// TraceError and a backend's exceptions unchanged); at run time, what the
  /// compiled graph throws, and with config.debug_assert AotError for an
  /// input that requires grad though it did not when compiled.
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& inputs) const;
  /// Compiles for `inputs` (and the current grad mode) as a call would,
  /// without running anything: a no-op when a compilation meets them. On the
  /// autograd path the backward still compiles at the first backward call.
  /// Throws what a compiling call throws.
  void compile(const std::vector<at::Tensor>& inputs) const;
  /// Compilations so far (one per distinct guard set seen).
  size_t num_compilations() const;

 private:
  friend AotFunction aot_function(tracer::TensorFn fn, AotConfig config);
  std::shared_ptr<detail::CompileCache> cache_;
};

/// Compiles `fn` on first use with `config` (create_aot_dispatcher_function
/// in aot_dispatch.h says what is recorded and thrown), reusing graphs that
/// other callables compiled when config.compiler_key is set
/// (Note [AOT graph cache]). `fn` must be a function of its tensor inputs
/// (anything else it reads is baked into the graph) and compute the same ops
/// on every call for the same input metadata. It may write its inputs (data
/// and metadata, also through views and aliases of each other), return its
/// inputs or views of them, and return views of its intermediates: each
/// behaves as in eager (see the Notes of view_and_mutation_meta.h,
/// runtime_wrapper.h, dedupe_wrapper.h, synthetic_base_wrapper.h). Errors in `fn` itself (a shape mismatch, an
/// in-place write eager forbids) are reported as AotError at the call that
/// compiles, before anything of the caller's is written.
AotFunction aot_function(tracer::TensorFn fn, AotConfig config = {});

}  // namespace crucible::autograd
