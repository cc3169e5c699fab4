// Functional variants of ops whose kernels write arguments their schemas do
// not mark as written. See Note [Ops with hidden writes] in trace_session.h.
#include "trace_session.h"

#include <crucible/tracer/error.h>

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <tuple>

namespace crucible::tracer::detail {

namespace {

// cudnn_batch_norm in training writes the running statistics it is given.
// ATen has no functional variant of it, and the native kernels that
// _native_batch_norm_legit_functional runs on CUDA are not the ones eager
// runs there (cuDNN's): this op runs cuDNN's kernel on copies of the
// statistics and returns them, so the graph stays functional and computes
// what eager computes, bit for bit.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> cudnn_batch_norm_functional(
    const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    const at::Tensor& running_mean, const at::Tensor& running_var, double exponential_average_factor, double epsilon) {
  at::Tensor mean = running_mean.clone(), var = running_var.clone();
  auto [out, save_mean, save_var, reserve] =
      at::cudnn_batch_norm(input, weight, bias, mean, var, /*training=*/true, exponential_average_factor, epsilon);
  return {out, save_mean, save_var, reserve, mean, var};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(crucible, m) {
  m.def(
      "cudnn_batch_norm_functional(Tensor input, Tensor weight, Tensor? bias, Tensor running_mean, "
      "Tensor running_var, float exponential_average_factor, float epsilon) -> "
      "(Tensor, Tensor, Tensor, Tensor, Tensor running_mean_out, Tensor running_var_out)");
}
TORCH_LIBRARY_IMPL(crucible, CompositeExplicitAutograd, m) {
  m.impl("cudnn_batch_norm_functional", &cudnn_batch_norm_functional);
}

bool has_hidden_writes(const std::string& op_name) {
  return op_name == "aten::native_batch_norm" || op_name == "aten::cudnn_batch_norm";
}

bool TraceSession::trace_functional_variant(const c10::OperatorHandle& op, torch::jit::Stack& stack, size_t base) {
  // See Note [Ops with hidden writes]. Both ops take
  // (input, weight, bias, running_mean, running_var, training, momentum, eps).
  const c10::IValue& training = stack[base + 5];
  const c10::IValue& mean_arg = stack[base + 3];
  const c10::IValue& var_arg = stack[base + 4];
  if (!training.toBool() || !mean_arg.isTensor() || !var_arg.isTensor()) return false;
  const at::Tensor running_mean = mean_arg.toTensor(), running_var = var_arg.toTensor();
  if (!running_mean.defined() || !running_var.defined()) return false;
  const std::string name = ir::operator_name(op);
  {
    // Statistics read from outside the function are lifted first.
    c10::impl::ExcludeDispatchKeyGuard no_trace(c10::DispatchKey::Fake);
    value_of(running_mean, name);
    value_of(running_var, name);
  }
  if (!is_reached(running_mean) || !is_reached(running_var)) return false;

  const at::Tensor input = stack[base].toTensor();
  const auto weight = stack[base + 1].toOptional<at::Tensor>();
  const auto bias = stack[base + 2].toOptional<at::Tensor>();
  const double momentum = stack[base + 6].toDouble(), eps = stack[base + 7].toDouble();
  stack.resize(base);
  // Traced as a decomposition is: below autograd, the Fake key on.
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  c10::impl::ExcludeDispatchKeyGuard no_functionalize(c10::DispatchKey::Functionalize);
  if (name == "aten::native_batch_norm") {
    auto [out, save_mean, save_invstd, new_mean, new_var] = at::_native_batch_norm_legit_functional(
        input, weight, bias, running_mean, running_var, /*training=*/true, momentum, eps);
    running_mean.copy_(new_mean);
    running_var.copy_(new_var);
    for (const at::Tensor& r : {out, save_mean, save_invstd}) stack.emplace_back(r);
    return true;
  }
  static const c10::OperatorHandle functional = ir::resolve_operator("crucible::cudnn_batch_norm_functional");
  std::vector<c10::IValue> call = {input, weight.value_or(at::Tensor()), bias, running_mean, running_var, momentum,
                                   eps};
  functional.callBoxed(call);
  running_mean.copy_(call[4].toTensor());
  running_var.copy_(call[5].toTensor());
  for (size_t r = 0; r < 4; ++r) stack.push_back(call[r]);
  return true;
}

}  // namespace crucible::tracer::detail
