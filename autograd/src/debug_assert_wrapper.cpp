#include <crucible/autograd/debug_assert_wrapper.h>
#include <crucible/autograd/error.h>

namespace crucible::autograd {

void DebugAssertWrapper::pre_compile(AotRequest& request) {
  flat_requires_grad_.clear();
  for (const at::Tensor& t : request.flat_args) flat_requires_grad_.push_back(t.defined() && t.requires_grad());
}

ir::CompiledFn DebugAssertWrapper::post_compile(ir::CompiledFn compiled, const AotRequest& request) {
  return [requires_grad = flat_requires_grad_, id = request.compile_id,
          compiled = std::move(compiled)](std::vector<at::Tensor>& args) {
    for (size_t i = 0; i < args.size() && i < requires_grad.size(); ++i)
      if (!requires_grad[i] && args[i].defined() && args[i].requires_grad())
        throw AotError("compilation " + id + ": input " + std::to_string(i) +
                       " requires grad, but it did not when the function was compiled, so the compiled graph "
                       "computes no gradient for it; call through aot_function / aot_module, whose guards "
                       "recompile, or keep requires_grad as it was");
    return compiled(args);
  };
}

}  // namespace crucible::autograd
