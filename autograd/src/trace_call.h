// Private: running a trace for a compilation, with the function's own
// failures reported as AotError.
#pragma once

#include <crucible/autograd/aot_request.h>

#include <string_view>

namespace crucible::autograd::detail {

/// request.trace(body, args, options) with functionalization on, the
/// request's decompositions, freezing and the names of its named modules,
/// and the request's lifted tensors (found among `args`) as
/// TraceOptions::lifted_inputs. A c10::Error thrown by the traced function
/// (a shape mismatch, an in-place write autograd forbids) becomes AotError
/// naming `what` and the compilation; crucible errors pass unchanged.
/// Tensors lifted anew come back in the result when `allow_lifting` (the
/// metadata analysis); otherwise they raise AotError, since the function
/// then read other tensors than in the analysis.
tracer::TraceResult trace_functionalized(const AotRequest& request, const tracer::TensorFn& body,
                                         const std::vector<at::Tensor>& args, std::string_view what,
                                         bool allow_lifting = false);

/// The traced tensor behind a functional wrapper (the tensor the tracer
/// knows), or `t` itself when it is not one.
at::Tensor unwrap_functional(const at::Tensor& t);

}  // namespace crucible::autograd::detail
