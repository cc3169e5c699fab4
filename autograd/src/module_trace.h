// Private: the TraceFns of the entry points: a function of tensors, and a
// module's flat function (its state first).
#pragma once

#include <crucible/autograd/aot_request.h>
#include <crucible/tracer/functional_call.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace crucible::autograd::detail {

/// The TraceFn of a function of tensors: tracer::make_fx(body, args, options).
TraceFn function_trace();

/// The TraceFn of a module: tracer::functional_call over the arguments after
/// the module's state, the body receiving the module's (swapped-in) state
/// tensors followed by the traced arguments.
TraceFn module_trace(std::shared_ptr<torch::nn::Module> module);

/// The flat function of fn over a module: the module's state arguments are
/// read by the module itself; fn gets the rest.
tracer::TensorFn module_flat_fn(std::shared_ptr<torch::nn::Module> module, tracer::ModuleFn fn);

/// is_training() of the module and every descendant, in apply() order: the
/// `extra` guard of a compilation over a module.
std::vector<bool> training_flags(const torch::nn::Module& module);
/// training_flags() of each module of `named` (AotConfig::named_modules)
/// still alive, one after another: a function that reads another module
/// computes by its train()/eval() mode too (batch norm, dropout), so these
/// join the `extra` guard of every compilation (Note [AOT cache guards]).
std::vector<bool> named_training_flags(
    const std::vector<std::pair<std::string, std::weak_ptr<torch::nn::Module>>>& named);

}  // namespace crucible::autograd::detail
