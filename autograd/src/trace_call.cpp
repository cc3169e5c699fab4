#include "trace_call.h"

#include <crucible/autograd/error.h>
#include <crucible/runtime/instruments.h>
#include <crucible/tracer/functional_call.h>

#include <ATen/FunctionalTensorWrapper.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

namespace crucible::autograd::detail {

tracer::TraceResult trace_functionalized(const AotRequest& request, const tracer::TensorFn& body,
                                         const std::vector<at::Tensor>& args, std::string_view what,
                                         bool allow_lifting) {
  tracer::TraceOptions options;
  options.functionalize = true;
  options.mode = request.config.trace_mode;
  options.decompositions = request.config.decompositions;
  options.freeze = request.config.freeze;
  for (const auto& [name, weak] : request.config.named_modules)
    if (std::shared_ptr<torch::nn::Module> m = weak.lock())
      for (tracer::NamedTensor& t : tracer::module_state(*m, name).tensors)
        options.source_names.push_back(std::move(t));
  for (size_t k = 0; k < request.lifted.size(); ++k) {
    options.source_names.push_back({request.lifted_names[k], request.lifted[k]});
    for (size_t i = 0; i < args.size(); ++i)
      if (args[i].defined() && args[i].is_same(request.lifted[k])) options.lifted_inputs.push_back(i);
  }
  try {
    tracer::TraceResult r = request.trace(body, args, options);
    // The mode each trace ran in (Note [Auto trace mode]): a real-mode trace
    // costs a copy of the state and of the activations.
    runtime::default_counters().add("aot_autograd", r.mode == tracer::TraceMode::Fake ? "trace_fake"
                                                    : r.fake_mode_abandoned.empty()   ? "trace_real"
                                                                                      : "trace_real_after_fake");
    if (!allow_lifting && !r.lifted.empty())
      throw AotError("compilation " + request.compile_id + ": the function read a tensor " +
                     std::string(c10::toString(r.lifted[0].tensor.scalar_type())) +
                     c10::str(r.lifted[0].tensor.sizes()) + " from outside its arguments while traced for " +
                     std::string(what) +
                     " that it did not read in the metadata analysis; the function must read the same tensors "
                     "on every run");
    return r;
  } catch (const c10::Error& e) {
    throw AotError("compilation " + request.compile_id + ": the function failed while traced for " + std::string(what) +
                   " (it ran on copies; the caller's tensors are unchanged): " + e.what_without_backtrace());
  }
}

at::Tensor unwrap_functional(const at::Tensor& t) {
  return at::functionalization::impl::isFunctionalTensor(t) ? at::functionalization::impl::from_functional_tensor(t)
                                                            : t;
}

}  // namespace crucible::autograd::detail
