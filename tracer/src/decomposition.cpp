#include <crucible/tracer/decomposition.h>

#include <crucible/ir/graph.h>

#include <ATen/ATen.h>

namespace crucible::tracer {
namespace {

std::optional<c10::OperatorHandle> find_op(const std::string& name, const std::string& overload) {
  return c10::Dispatcher::singleton().findSchema({name, overload});
}

// An in-place op `ns::f_.ov` whose functional variant `ns::f.ov` takes the
// same arguments and returns the new values of the mutated Tensor[]
// arguments (one list per written argument, in order; `skip` lists argument
// positions whose new value is dropped). The decomposition calls the
// functional variant, then copy_ writes each new value back.
Decomposition functional_then_copy(c10::OperatorHandle functional, std::vector<size_t> skip = {}) {
  return [functional, skip](const c10::OperatorHandle& op, std::vector<c10::IValue>& stack) {
    std::vector<c10::IValue> args = stack;
    functional.callBoxed(stack);
    const auto& formals = op.schema().arguments();
    size_t result = 0;
    for (size_t a = 0; a < formals.size() && result < stack.size(); ++a) {
      const auto* alias = formals[a].alias_info();
      if (!alias || !alias->isWrite()) continue;
      const size_t r = result++;
      if (std::find(skip.begin(), skip.end(), a) != skip.end()) continue;
      const auto targets = args[a].toTensorList();
      const auto updated = stack[r].toTensorList();
      for (size_t i = 0; i < targets.size(); ++i) targets.get(i).copy_(updated.get(i));
    }
    stack.clear();  // the in-place variants return ()
  };
}

// torch._decomp.decompositions.native_layer_norm_backward: the input gradient
// from x_hat = (x - mean) * rstd as
//   rstd / N * (N * g - sum(g) - x_hat * sum(x_hat * g)),  g = grad_out * weight,
// summed over the normalized (inner) dims; weight and bias gradients summed over
// the outer dims.
void native_layer_norm_backward(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  const at::Tensor grad_out = stack[0].toTensor();
  const at::Tensor input = stack[1].toTensor();
  const auto normalized_ndim = static_cast<int64_t>(stack[2].toIntVector().size());
  const at::Tensor mean = stack[3].toTensor();
  const at::Tensor rstd = stack[4].toTensor();
  const auto weight = stack[5].toOptional<at::Tensor>();
  const auto bias = stack[6].toOptional<at::Tensor>();
  const auto mask = stack[7].toBoolList();
  const int64_t axis = input.dim() - normalized_ndim;
  std::vector<int64_t> inner, outer;
  int64_t n = 1;
  for (int64_t d = 0; d < input.dim(); ++d) {
    if (d < axis) {
      outer.push_back(d);
    } else {
      inner.push_back(d);
      n *= input.size(d);
    }
  }
  const at::Tensor x_hat = (input - mean) * rstd;
  const bool has_weight = weight && weight->defined();
  const at::Tensor g = has_weight ? grad_out * *weight : grad_out;
  at::Tensor d_input, d_weight, d_bias;
  if (mask.get(0)) {
    const at::Tensor a = g * n;
    const at::Tensor b = g.sum(inner, /*keepdim=*/true);
    const at::Tensor c = x_hat * (x_hat * g).sum(inner, /*keepdim=*/true);
    d_input = (rstd / n) * (a - b - c);
  }
  // Summing over no dims would sum over all of them in ATen.
  auto sum_outer = [&](const at::Tensor& t) { return outer.empty() ? t.clone() : t.sum(outer, /*keepdim=*/false); };
  if (mask.get(1) && has_weight) d_weight = sum_outer(grad_out * x_hat);
  if (mask.get(2) && bias && bias->defined()) d_bias = sum_outer(grad_out);
  stack.clear();
  stack.emplace_back(d_input);
  stack.emplace_back(d_weight);
  stack.emplace_back(d_bias);
}

}  // namespace

DecompositionTable spmd_decomposition_table() {
  DecompositionTable table;
  // In-place op (name, overload) → functional op (name, overload).
  const std::vector<std::pair<std::string, std::string>> foreach_ops = {
      {"_foreach_add_", "List"},      {"_foreach_add_", "Scalar"},   {"_foreach_addcdiv_", "Scalar"},
      {"_foreach_addcmul_", "Scalar"}, {"_foreach_div_", "List"},    {"_foreach_mul_", "Scalar"},
      {"_foreach_div_", "Scalar"},     {"_foreach_neg_", ""},        {"_foreach_reciprocal_", ""},
      {"_foreach_sqrt_", ""},          {"_foreach_sub_", "Scalar"},
  };
  for (const auto& [name, overload] : foreach_ops) {
    auto inplace = find_op("aten::" + name, overload);
    auto functional = find_op("aten::" + name.substr(0, name.size() - 1), overload);
    if (inplace && functional) table[ir::operator_name(*inplace)] = functional_then_copy(*functional);
  }
  // _fused_adam_ writes params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
  // like the seed, the gradients' new values are not written back.
  for (const std::string overload : {"", "tensor_lr"}) {
    auto inplace = find_op("aten::_fused_adam_", overload);
    auto functional = find_op("aten::_fused_adam", overload);
    if (inplace && functional) table[ir::operator_name(*inplace)] = functional_then_copy(*functional, {1});
  }
  if (find_op("aten::native_layer_norm_backward", ""))
    table["aten::native_layer_norm_backward"] = native_layer_norm_backward;
  return table;
}

}  // namespace crucible::tracer
