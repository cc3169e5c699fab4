// aot_module and aot_module_simplified: compile a torch::nn::Module's
// computation with its parameters and buffers lifted to graph inputs
// (torch/_functorch/aot_autograd.py's aot_module and aot_module_simplified).
#pragma once

#include <crucible/autograd/aot_config.h>
#include <crucible/tracer/functional_call.h>

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace torch::nn {
class Module;
}

namespace crucible::autograd {

namespace detail {
class CompileCache;
}

/// The module's state in the order compiled graphs take it, the order of
/// tracer::functional_call: every defined parameter (named_parameters(); a
/// tensor registered under two names appears under each), then every
/// defined buffer (named_buffers()).
std::vector<at::Tensor> module_state(const torch::nn::Module& module);

/// The callable aot_module returns. Copies share one cache.
class AotModule {
 public:
  /// Runs fn(module, inputs) compiled, with the module's parameters and
  /// buffers read from the module at every call and passed as the leading
  /// flat arguments (config.num_params_buffers is set to their count).
  /// Hence, as in eager: an optimizer updating them in place is seen by the
  /// next call; loss.backward() accumulates into each parameter's .grad;
  /// buffers the module writes (BatchNorm's running statistics and
  /// num_batches_tracked in train mode) are updated in the module.
  /// Compiles on a cache miss (Note [AOT cache guards]; the guards include
  /// every submodule's is_training(), so train()/eval() recompiles).
  /// Throws AotError when the call meets no compilation's guards and
  /// config.recompile_limit compilations exist already (nothing runs then);
  /// at a call that compiles, what create_aot_dispatcher_function throws
  /// (AotError for what cannot be compiled, including a c10::Error of fn
  /// while traced, wrapped with the compilation named; the tracer's
  /// TraceError and a backend's exceptions unchanged); at run time, what the
  /// compiled graph throws, and with config.debug_assert AotError for an
  /// input that requires grad though it did not when compiled.
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& inputs) const;
  /// Compiles for `inputs` (and the current grad mode and training flags)
  /// as a call would, without running anything: a no-op when a compilation
  /// meets them. Throws what a compiling call throws.
  void compile(const std::vector<at::Tensor>& inputs) const;
  /// Compilations so far.
  size_t num_compilations() const;
  /// The module passed to aot_module (shared with the caller): the one whose
  /// state every call reads and whose buffers it updates.
  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }

 private:
  friend AotModule aot_module(std::shared_ptr<torch::nn::Module> module, tracer::ModuleFn fn, AotConfig config);
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<detail::CompileCache> cache_;
};

/// Compiles fn(module, inputs) -> outputs on first use (typically
/// `module.forward(inputs[0])`, or forward and loss), the module's state
/// lifted to placeholders (InputKind::Parameter / Buffer, named by their
/// fully qualified names). `fn` must reach the module's tensors only through
/// the module. Throws AotError (see aot_function) at the compiling call;
/// never changes the module when compiling fails.
AotModule aot_module(std::shared_ptr<torch::nn::Module> module, tracer::ModuleFn fn, AotConfig config = {});

/// aot_module_simplified: the low-overhead form for a fixed call site. It
/// compiles at once for `example_inputs` (and the current grad mode and
/// training flags), takes the module's state tensors once, here, instead of
/// reading named_parameters() at every call (the seed's "no pytree
/// flattening, no reading of params/buffers per call"), and keeps a single
/// compilation. The state tensors are held, so in-place updates to them
/// (optimizers, .grad accumulation) work; replacing a parameter tensor in the
/// module does not reach the compiled callable. Each call checks the single
/// compilation's guards and throws AotError naming the first difference
/// when they fail (use aot_module for inputs that vary).
tracer::TensorFn aot_module_simplified(std::shared_ptr<torch::nn::Module> module, tracer::ModuleFn fn,
                                       const std::vector<at::Tensor>& example_inputs, AotConfig config = {});

}  // namespace crucible::autograd
