#include "trace_call.h"

#include <crucible/autograd/error.h>

#include <ATen/FunctionalTensorWrapper.h>
#include <c10/util/Exception.h>

namespace crucible::autograd::detail {

tracer::TraceResult trace_functionalized(const AotRequest& request, const tracer::TensorFn& body,
                                         const std::vector<at::Tensor>& args, std::string_view what) {
  tracer::TraceOptions options;
  options.functionalize = true;
  options.decompositions = request.config.decompositions;
  try {
    return request.trace(body, args, options);
  } catch (const c10::Error& e) {
    throw AotError("compilation " + request.compile_id + ": the function failed while traced for " +
                   std::string(what) + " (it ran on copies; the caller's tensors are unchanged): " +
                   e.what_without_backtrace());
  }
}

at::Tensor unwrap_functional(const at::Tensor& t) {
  return at::functionalization::impl::isFunctionalTensor(t) ? at::functionalization::impl::from_functional_tensor(t)
                                                             : t;
}

}  // namespace crucible::autograd::detail
