#include <crucible/autograd/aot_dispatch.h>
#include <crucible/autograd/aot_module.h>
#include <crucible/autograd/error.h>

#include "compile_cache.h"
#include "module_trace.h"

#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>

namespace crucible::autograd {

std::vector<at::Tensor> module_state(const torch::nn::Module& module) {
  std::vector<at::Tensor> state;
  for (tracer::NamedTensor& t : tracer::module_state(module).tensors) state.push_back(std::move(t.tensor));
  return state;
}

namespace detail {

TraceFn function_trace() {
  return [](const tracer::TensorFn& body, const std::vector<at::Tensor>& args, const tracer::TraceOptions& options) {
    return tracer::make_fx(body, args, options);
  };
}

TraceFn module_trace(std::shared_ptr<torch::nn::Module> module) {
  return
      [module](const tracer::TensorFn& body, const std::vector<at::Tensor>& args, const tracer::TraceOptions& options) {
        const size_t num_state = module_state(*module).size();
        tracer::ModuleTraceOptions module_options;
        module_options.trace = options;
        module_options.gradients_as_outputs = true;  // Note [Gradients a function accumulates]
        // functional_call counts lifted inputs among the arguments after the state.
        for (size_t& i : module_options.trace.lifted_inputs) {
          if (i < num_state) throw AotError("module state input " + std::to_string(i) + " cannot be a lifted input");
          i -= num_state;
        }
        const std::vector<at::Tensor> rest(args.begin() + static_cast<std::ptrdiff_t>(num_state), args.end());
        return tracer::functional_call(
            *module,
            [&body](torch::nn::Module& m, const std::vector<at::Tensor>& traced) {
              std::vector<at::Tensor> full = module_state(m);
              full.insert(full.end(), traced.begin(), traced.end());
              return body(full);
            },
            rest, module_options);
      };
}

tracer::TensorFn module_flat_fn(std::shared_ptr<torch::nn::Module> module, tracer::ModuleFn fn) {
  return [module, fn = std::move(fn)](const std::vector<at::Tensor>& full) {
    const size_t num_state = module_state(*module).size();
    return fn(*module, std::vector<at::Tensor>(full.begin() + static_cast<std::ptrdiff_t>(num_state), full.end()));
  };
}

std::vector<bool> training_flags(const torch::nn::Module& module) {
  std::vector<bool> flags;
  module.apply([&flags](const torch::nn::Module& m) { flags.push_back(m.is_training()); });
  return flags;
}

std::vector<bool> named_training_flags(
    const std::vector<std::pair<std::string, std::weak_ptr<torch::nn::Module>>>& named) {
  std::vector<bool> flags;
  for (const auto& [name, weak] : named)
    if (std::shared_ptr<torch::nn::Module> m = weak.lock())
      m->apply([&flags](const torch::nn::Module& sub) { flags.push_back(sub.is_training()); });
  return flags;
}

}  // namespace detail

std::vector<at::Tensor> AotModule::operator()(const std::vector<at::Tensor>& inputs) const {
  std::vector<at::Tensor> flat = module_state(*module_);
  const size_t num_state = flat.size();
  flat.insert(flat.end(), inputs.begin(), inputs.end());
  return cache_->call(std::move(flat), detail::training_flags(*module_), num_state);
}

void AotModule::compile(const std::vector<at::Tensor>& inputs) const {
  std::vector<at::Tensor> flat = module_state(*module_);
  const size_t num_state = flat.size();
  flat.insert(flat.end(), inputs.begin(), inputs.end());
  cache_->compile(std::move(flat), detail::training_flags(*module_), num_state);
}

size_t AotModule::num_compilations() const { return cache_->num_compilations(); }

AotModule aot_module(std::shared_ptr<torch::nn::Module> module, tracer::ModuleFn fn, AotConfig config) {
  if (!module) throw AotError("aot_module: the module is null; pass a std::shared_ptr to a constructed module");
  AotModule m;
  m.module_ = module;
  m.cache_ = std::make_shared<detail::CompileCache>("aot_module", detail::module_trace(module),
                                                    detail::module_flat_fn(module, std::move(fn)), std::move(config));
  return m;
}

tracer::TensorFn aot_module_simplified(std::shared_ptr<torch::nn::Module> module, tracer::ModuleFn fn,
                                       const std::vector<at::Tensor>& example_inputs, AotConfig config) {
  if (!module)
    throw AotError("aot_module_simplified: the module is null; pass a std::shared_ptr to a constructed module");
  std::vector<at::Tensor> state = module_state(*module);
  std::vector<at::Tensor> flat = state;
  flat.insert(flat.end(), example_inputs.begin(), example_inputs.end());
  AotRequest request;
  request.flat_fn = detail::module_flat_fn(module, std::move(fn));
  request.trace = detail::module_trace(module);
  request.flat_args = flat;
  const auto named = config.named_modules;
  request.config = std::move(config);
  request.config.num_params_buffers = state.size();
  request.compile_id = "simplified";
  const bool grad_enabled = at::GradMode::is_enabled();
  // The module's train()/eval() flags, then those of the modules it reads
  // from outside (detail::named_training_flags).
  auto flags_now = [module, named] {
    std::vector<bool> flags = detail::training_flags(*module);
    const std::vector<bool> others = detail::named_training_flags(named);
    flags.insert(flags.end(), others.begin(), others.end());
    return flags;
  };
  AotCompiled compiled = create_aot_dispatcher_function(std::move(request));
  if (!compiled.lifted.append_to(flat))
    throw AotError("aot_module_simplified: " + compiled.lifted.freed() + " while the function was compiled");
  auto guards = std::make_shared<const runtime::InputGuards>(flat, grad_enabled, flags_now());
  return [module, state = std::move(state), guards, flags_now,
          compiled = std::move(compiled)](const std::vector<at::Tensor>& inputs) {
    std::vector<at::Tensor> args;
    args.reserve(state.size() + inputs.size() + compiled.lifted.size());
    args.insert(args.end(), state.begin(), state.end());
    args.insert(args.end(), inputs.begin(), inputs.end());
    if (!compiled.lifted.append_to(args))
      throw AotError("aot_module_simplified: " + compiled.lifted.freed() +
                     "; it keeps the one compilation made for its example inputs: use aot_module, which compiles "
                     "again");
    const bool grad = at::GradMode::is_enabled();
    const std::vector<bool> flags = flags_now();
    if (!guards->check(args, grad, flags))
      throw AotError("aot_module_simplified: " + guards->first_difference(args, grad, flags).reason +
                     "; it keeps the one compilation made for its example inputs: call with inputs like those, "
                     "or use aot_module, which compiles again");
    return compiled.fn(args);
  };
}

}  // namespace crucible::autograd
