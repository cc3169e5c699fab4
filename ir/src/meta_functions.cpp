#include "meta_functions.h"

#include <ATen/native/ConvUtils.h>
#include <ATen/ops/empty.h>
#include <c10/util/irange.h>

#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace crucible::ir::detail {

// Note [Meta functions]
// LibTorch 2.11 has no Meta kernel in C++ for convolution, its backward and
// batch norm (Python registers them in torch/_meta_registrations.py), and
// running them on CPU stand-ins costs what running them costs: on ResNet-18
// they were nine tenths of deriving the train step's metadata. Their output
// metadata is simple where the layout is certain: with contiguous inputs the
// CPU and GPU kernels return contiguous results (sizes by ATen's own
// conv_output_size / conv_input_size), batch norm's statistics are [C] in
// training and empty in eval. Outside that (channels-last or other strided
// inputs, whose layout the backend picks, or reduced-precision dtypes, whose
// statistics may be float) the functions decline and the stand-ins serve.
// tests/ir/test_meta_functions.cpp checks each against the stand-ins.

namespace {

at::Tensor empty_meta(at::IntArrayRef sizes, const at::Tensor& like) {
  return at::empty(sizes, like.options().device(c10::kMeta).memory_format(c10::MemoryFormat::Contiguous));
}

bool float_or_double(const at::Tensor& t) { return t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble; }

// An int[] argument given per spatial dimension, or once for all (as
// _convolution expands it).
std::optional<std::vector<int64_t>> per_dim(const c10::IValue& v, size_t dims) {
  std::vector<int64_t> l = v.toIntVector();
  if (l.size() == 1) l.assign(dims, l[0]);
  if (l.size() != dims) return std::nullopt;
  return l;
}

c10::IValue maybe(bool computed, const at::Tensor& t) { return computed ? c10::IValue(t) : c10::IValue(at::Tensor()); }

// convolution(input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups)
bool convolution(torch::jit::Stack& stack, size_t base) {
  const at::Tensor& input = stack[base].toTensor();
  const at::Tensor& weight = stack[base + 1].toTensor();
  if (input.dim() < 3 || input.dim() > 5 || weight.dim() != input.dim() || !input.is_contiguous() ||
      !weight.is_contiguous())
    return false;
  const size_t dims = static_cast<size_t>(input.dim() - 2);
  const auto stride = per_dim(stack[base + 3], dims), padding = per_dim(stack[base + 4], dims),
             dilation = per_dim(stack[base + 5], dims), output_padding = per_dim(stack[base + 7], dims);
  if (!stride || !padding || !dilation || !output_padding) return false;
  const bool transposed = stack[base + 6].toBool();
  const int64_t groups = stack[base + 8].toInt();
  if (groups <= 0) return false;
  const std::vector<int64_t> sizes =
      transposed ? at::native::conv_input_size(input.sizes(), weight.sizes(), *padding, *output_padding, *stride,
                                               *dilation, groups)
                 : at::native::conv_output_size(input.sizes(), weight.sizes(), *padding, *stride, *dilation);
  for (size_t d = 1; d < sizes.size(); ++d)
    if (sizes[d] <= 0) return false;  // let the kernel say what is wrong (an empty batch is fine)
  const at::Tensor out = empty_meta(sizes, input);
  stack.resize(base);
  stack.emplace_back(out);
  return true;
}

// convolution_backward(grad_output, input, weight, bias_sizes?, stride, padding, dilation, transposed,
//                      output_padding, groups, output_mask) -> (grad_input, grad_weight, grad_bias)
bool convolution_backward(torch::jit::Stack& stack, size_t base) {
  const at::Tensor& grad_output = stack[base].toTensor();
  const at::Tensor& input = stack[base + 1].toTensor();
  const at::Tensor& weight = stack[base + 2].toTensor();
  if (input.dim() < 3 || input.dim() > 5 || weight.dim() != input.dim() || grad_output.dim() != input.dim() ||
      !grad_output.is_contiguous() || !input.is_contiguous() || !weight.is_contiguous())
    return false;
  const std::vector<bool> mask = stack[base + 10].toBoolList().vec();
  if (mask.size() != 3) return false;
  const at::Tensor grad_input = empty_meta(input.sizes(), input);
  const at::Tensor grad_weight = empty_meta(weight.sizes(), weight);
  const at::Tensor grad_bias = empty_meta({grad_output.size(1)}, grad_output);
  stack.resize(base);
  stack.push_back(maybe(mask[0], grad_input));
  stack.push_back(maybe(mask[1], grad_weight));
  stack.push_back(maybe(mask[2], grad_bias));
  return true;
}

// native_batch_norm(input, weight?, bias?, running_mean?, running_var?, training, momentum, eps)
//   -> (out, save_mean, save_invstd)
bool native_batch_norm(torch::jit::Stack& stack, size_t base) {
  const at::Tensor& input = stack[base].toTensor();
  if (input.dim() < 2 || !input.is_contiguous() || !float_or_double(input)) return false;
  for (size_t i = 1; i <= 4; ++i)
    if (stack[base + i].isTensor() && stack[base + i].toTensor().defined() &&
        stack[base + i].toTensor().scalar_type() != input.scalar_type())
      return false;
  const bool training = stack[base + 5].toBool();
  const int64_t stats = training ? input.size(1) : 0;
  const at::Tensor out = empty_meta(input.sizes(), input);
  const at::Tensor mean = empty_meta({stats}, input), invstd = empty_meta({stats}, input);
  stack.resize(base);
  stack.emplace_back(out);
  stack.emplace_back(mean);
  stack.emplace_back(invstd);
  return true;
}

// native_batch_norm_backward(grad_out, input, weight?, running_mean?, running_var?, save_mean?,
//                            save_invstd?, train, eps, output_mask) -> (grad_input, grad_weight, grad_bias)
bool native_batch_norm_backward(torch::jit::Stack& stack, size_t base) {
  const at::Tensor& grad_out = stack[base].toTensor();
  const at::Tensor& input = stack[base + 1].toTensor();
  if (input.dim() < 2 || !input.is_contiguous() || !grad_out.is_contiguous() || !float_or_double(input) ||
      grad_out.scalar_type() != input.scalar_type())
    return false;
  for (size_t i = 2; i <= 6; ++i)
    if (stack[base + i].isTensor() && stack[base + i].toTensor().defined() &&
        stack[base + i].toTensor().scalar_type() != input.scalar_type())
      return false;
  const std::vector<bool> mask = stack[base + 9].toBoolList().vec();
  if (mask.size() != 3) return false;
  const at::Tensor grad_input = empty_meta(input.sizes(), input);
  const at::Tensor grad_weight = empty_meta({input.size(1)}, input), grad_bias = empty_meta({input.size(1)}, input);
  stack.resize(base);
  stack.push_back(maybe(mask[0], grad_input));
  stack.push_back(maybe(mask[1], grad_weight));
  stack.push_back(maybe(mask[2], grad_bias));
  return true;
}

using MetaFunction = bool (*)(torch::jit::Stack&, size_t);

const std::unordered_map<std::string_view, MetaFunction>& table() {
  static const std::unordered_map<std::string_view, MetaFunction> t = {
      {"aten::convolution", convolution},
      {"aten::convolution_backward", convolution_backward},
      {"aten::native_batch_norm", native_batch_norm},
      {"aten::native_batch_norm_backward", native_batch_norm_backward},
  };
  return t;
}

}  // namespace

bool call_meta_function(const c10::OperatorHandle& op, torch::jit::Stack& stack) {
  const auto& name = op.operator_name();
  if (!name.overload_name.empty()) return false;
  auto it = table().find(name.name);
  if (it == table().end()) return false;
  const size_t base = stack.size() - op.schema().arguments().size();
  return it->second(stack, base);
}

}  // namespace crucible::ir::detail
