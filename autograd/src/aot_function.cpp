#include <crucible/autograd/aot_function.h>

#include "compile_cache.h"
#include "module_trace.h"

namespace crucible::autograd {

std::vector<at::Tensor> AotFunction::operator()(const std::vector<at::Tensor>& inputs) const {
  return cache_->call(inputs);
}

void AotFunction::compile(const std::vector<at::Tensor>& inputs) const { cache_->compile(inputs); }

size_t AotFunction::num_compilations() const { return cache_->num_compilations(); }

AotFunction aot_function(tracer::TensorFn fn, AotConfig config) {
  AotFunction f;
  f.cache_ = std::make_shared<detail::CompileCache>("aot_function", detail::function_trace(), std::move(fn),
                                                    std::move(config));
  return f;
}

}  // namespace crucible::autograd
