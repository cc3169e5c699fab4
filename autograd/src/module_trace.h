// Private: the TraceFns of the entry points: a function of tensors, and a
// module's flat function (its state first).
#pragma once

#include <crucible/autograd/aot_request.h>
#include <crucible/tracer/functional_call.h>

#include <memory>
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

}  // namespace crucible::autograd::detail
