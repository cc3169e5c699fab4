#include "meta_functions.h"

#include <ATen/OpMathType.h>
#include <ATen/TensorIterator.h>
#include <ATen/native/ConvUtils.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/result_type.h>
#include <ATen/ops/scalar_tensor.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace crucible::ir::detail {

// Note [Meta functions]
// LibTorch 2.11 has no Meta kernel in C++ for convolution, its backward,
// batch and layer norm, var_mean, where and embedding (Python registers them in
// torch/_meta_registrations.py), and running them on CPU stand-ins costs what
// running them costs: on ResNet-18 they were nine tenths of deriving the
// train step's metadata; on GPT-2 small (batch 8, T = 1024) the attention
// mask's where over [8, 12, 1024, 1024] and the layer norms' var_mean made a
// fake-mode metadata analysis slower than a real one on the GPU. var_mean's
// results are contiguous, as every reduction's (ATen resizes them); embedding's
// are those of index_select, contiguous; layer norm's as its CPU and CUDA
// kernels allocate them (contiguous); where's come from the very
// TensorIterator ATen's where_self_out builds, run over the meta tensors, so
// broadcasting, type promotion and the output's stride order are ATen's own.
// The convolutions' and batch norms' output
// metadata is simple where the layout is certain: contiguous inputs give
// contiguous results (sizes by ATen's own conv_output_size /
// conv_input_size), a 2-D convolution whose input or weight suggests
// channels-last gives channels-last results (cuDNN's and oneDNN's rule
// alike), batch norm's statistics are [C] in training and empty in eval;
// cuDNN's batch norm, which has no CPU kernel to stand in, keeps its input's
// layout. Outside that (other strided inputs, whose layout the backend
// picks, or reduced-precision dtypes, whose statistics may be float) the
// functions decline and the stand-ins serve. tests/ir/test_meta_functions.cpp
// checks each against the stand-ins where there are some.

namespace {

at::Tensor empty_meta(at::IntArrayRef sizes, const at::Tensor& like,
                      c10::MemoryFormat format = c10::MemoryFormat::Contiguous) {
  return at::empty(sizes, like.options().device(c10::kMeta).memory_format(format));
}

// A 4-D tensor laid out channels-last (dimensions of size 1 take any stride).
bool channels_last_4d(const at::Tensor& t) { return t.dim() == 4 && t.is_contiguous(c10::MemoryFormat::ChannelsLast); }

// The layout of a convolution's results: channels-last when its input or
// its weight suggests it (the rule of cuDNN's cudnn_conv_suggest_memory_format
// and of oneDNN's mkldnn_conv_use_channels_last alike) and both are dense in
// one of the two layouts, row-major when both are contiguous; nullopt for
// other layouts, which the backends decide.
std::optional<c10::MemoryFormat> conv_format(const at::Tensor& input, const at::Tensor& weight) {
  const bool suggests_cl = input.dim() == 4 && weight.dim() == 4 &&
                           (input.suggest_memory_format() == c10::MemoryFormat::ChannelsLast ||
                            weight.suggest_memory_format() == c10::MemoryFormat::ChannelsLast);
  if (suggests_cl)
    return (input.is_contiguous() || channels_last_4d(input)) && (weight.is_contiguous() || channels_last_4d(weight))
               ? std::optional(c10::MemoryFormat::ChannelsLast)
               : std::nullopt;
  if (input.is_contiguous() && weight.is_contiguous()) return c10::MemoryFormat::Contiguous;
  return std::nullopt;
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
  if (input.dim() < 3 || input.dim() > 5 || weight.dim() != input.dim()) return false;
  const std::optional<c10::MemoryFormat> format = conv_format(input, weight);
  if (!format) return false;
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
  const at::Tensor out = empty_meta(sizes, input, *format);
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
  if (input.dim() < 3 || input.dim() > 5 || weight.dim() != input.dim() || grad_output.dim() != input.dim())
    return false;
  const std::optional<c10::MemoryFormat> format = conv_format(input, weight);
  if (!format || !(grad_output.is_contiguous() || channels_last_4d(grad_output))) return false;
  if (*format == c10::MemoryFormat::Contiguous && !grad_output.is_contiguous()) return false;
  const std::vector<bool> mask = stack[base + 10].toBoolList().vec();
  if (mask.size() != 3) return false;
  const at::Tensor grad_input = empty_meta(input.sizes(), input, *format);
  const at::Tensor grad_weight = empty_meta(weight.sizes(), weight, *format);
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

// cuDNN's batch norm (CUDA only: LibTorch's C++ has neither a Meta kernel
// nor a CPU one for it). Results as ATen's cudnn kernels make them: the
// normalized tensor in the input's suggested layout, the saved statistics
// [C] (in training; empty in eval) of the weight's dtype, a reserve space
// whose size cuDNN picks at run time (recorded as empty: only
// cudnn_batch_norm_backward reads it, and no generated kernel).
bool cudnn_batch_norm_results(torch::jit::Stack& stack, size_t base, bool with_running_stats) {
  const at::Tensor& input = stack[base].toTensor();
  const at::Tensor& weight = stack[base + 1].toTensor();
  if (input.dim() < 2 || !float_or_double(input) || !weight.defined() || weight.scalar_type() != input.scalar_type())
    return false;
  const bool training = with_running_stats || stack[base + 5].toBool();
  const int64_t c = input.size(1);
  const at::Tensor out = empty_meta(input.sizes(), input, input.suggest_memory_format());
  const at::Tensor save_mean = empty_meta({training ? c : 0}, weight),
                   save_var = empty_meta({training ? c : 0}, weight);
  const at::Tensor reserve = at::empty({0}, input.options().dtype(at::kByte).device(c10::kMeta));
  stack.resize(base);
  stack.emplace_back(out);
  stack.emplace_back(save_mean);
  stack.emplace_back(save_var);
  stack.emplace_back(reserve);
  return true;
}

// cudnn_batch_norm(input, weight, bias?, running_mean?, running_var?, training, factor, eps)
//   -> (out, save_mean, save_var, reserve)
bool cudnn_batch_norm(torch::jit::Stack& stack, size_t base) { return cudnn_batch_norm_results(stack, base, false); }

// crucible::cudnn_batch_norm_functional(input, weight, bias?, running_mean, running_var, factor, eps)
//   -> (out, save_mean, save_var, reserve, running_mean_out, running_var_out): cudnn_batch_norm
// in training on copies of the running statistics, which it returns (tracer/src/hidden_writes.cpp).
bool cudnn_batch_norm_functional(torch::jit::Stack& stack, size_t base) {
  const at::Tensor running_mean = stack[base + 3].toTensor(), running_var = stack[base + 4].toTensor();
  if (!running_mean.defined() || !running_var.defined()) return false;
  if (!cudnn_batch_norm_results(stack, base, true)) return false;
  stack.emplace_back(empty_meta(running_mean.sizes(), running_mean));
  stack.emplace_back(empty_meta(running_var.sizes(), running_var));
  return true;
}

// cudnn_batch_norm_backward(input, grad_output, weight, running_mean?, running_var?, save_mean?,
//                           save_var?, epsilon, reserveSpace) -> (grad_input, grad_weight, grad_bias)
bool cudnn_batch_norm_backward(torch::jit::Stack& stack, size_t base) {
  const at::Tensor& input = stack[base].toTensor();
  const at::Tensor& weight = stack[base + 2].toTensor();
  if (input.dim() < 2 || !float_or_double(input) || !weight.defined()) return false;
  const at::Tensor grad_input = empty_meta(input.sizes(), input, input.suggest_memory_format());
  const at::Tensor grad_weight = empty_meta(weight.sizes(), weight), grad_bias = empty_meta(weight.sizes(), weight);
  stack.resize(base);
  stack.emplace_back(grad_input);
  stack.emplace_back(grad_weight);
  stack.emplace_back(grad_bias);
  return true;
}

// The CUDA kernels of a batch norm's statistics and of its backward's sums,
// which the core decompositions call on a GPU (Note [Batch norm on cuDNN] in
// tracer/src/decomposition.cpp): LibTorch has no Meta kernel for them.
// batch_norm_stats(input, eps) -> (mean, invstd): [C] each, in float for a
// half or bfloat16 input.
bool batch_norm_stats(torch::jit::Stack& stack, size_t base) {
  const at::Tensor& input = stack[base].toTensor();
  if (input.dim() < 2 || !at::isFloatingType(input.scalar_type())) return false;
  const auto options = input.options().device(c10::kMeta).dtype(at::toOpMathType(input.scalar_type()));
  const int64_t channels = input.size(1);
  stack.resize(base);  // `input` is gone
  stack.emplace_back(at::empty({channels}, options));
  stack.emplace_back(at::empty({channels}, options));
  return true;
}

// batch_norm_backward_reduce(grad_out, input, mean, invstd, weight?, input_g, weight_g, bias_g)
//   -> (sum_dy, sum_dy_xmu, grad_weight, grad_bias): the sums like mean (when input_g), the
// gradients like weight (when asked), else undefined.
bool batch_norm_backward_reduce(torch::jit::Stack& stack, size_t base) {
  const at::Tensor& input = stack[base + 1].toTensor();
  const at::Tensor& mean = stack[base + 2].toTensor();
  const auto weight = stack[base + 4].toOptional<at::Tensor>();
  const bool input_g = stack[base + 5].toBool(), weight_g = stack[base + 6].toBool(), bias_g = stack[base + 7].toBool();
  if (input.dim() < 2 || !at::isFloatingType(input.scalar_type()) ||
      ((weight_g || bias_g) && !(weight && weight->defined())))
    return false;
  // Four tensors of their own: results that were one tensor would alias.
  const at::Tensor sum_dy = empty_meta(mean.sizes(), mean), sum_dy_xmu = empty_meta(mean.sizes(), mean);
  const bool has_weight = weight && weight->defined();
  const at::Tensor grad_weight = has_weight ? empty_meta({input.size(1)}, *weight) : at::Tensor();
  const at::Tensor grad_bias = has_weight ? empty_meta({input.size(1)}, *weight) : at::Tensor();
  stack.resize(base);  // `input`, `mean` and `weight` are gone
  stack.push_back(maybe(input_g, sum_dy));
  stack.push_back(maybe(input_g, sum_dy_xmu));
  stack.push_back(maybe(weight_g, grad_weight));
  stack.push_back(maybe(bias_g, grad_bias));
  return true;
}

// native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd):
// the normalized tensor contiguous (ATen normalizes a contiguous copy), the
// statistics one per row, shaped as the input with the normalized dimensions
// 1. float and double only: reduced-precision inputs may keep float
// statistics, as the kernel decides.
bool native_layer_norm(torch::jit::Stack& stack, size_t base) {
  const at::Tensor& input = stack[base].toTensor();
  const std::vector<int64_t> normalized = stack[base + 1].toIntVector();
  const int64_t axis = input.dim() - static_cast<int64_t>(normalized.size());
  if (!float_or_double(input) || axis < 0) return false;
  for (size_t i = 0; i < normalized.size(); ++i)
    if (input.size(axis + static_cast<int64_t>(i)) != normalized[i]) return false;  // the kernel's error
  for (size_t i = 2; i <= 3; ++i)
    if (stack[base + i].isTensor() && stack[base + i].toTensor().defined() &&
        stack[base + i].toTensor().scalar_type() != input.scalar_type())
      return false;
  std::vector<int64_t> stats = input.sizes().vec();
  for (int64_t d = axis; d < input.dim(); ++d) stats[static_cast<size_t>(d)] = 1;
  stack.resize(base);
  stack.emplace_back(empty_meta(input.sizes(), input));
  stack.emplace_back(empty_meta(stats, input));
  stack.emplace_back(empty_meta(stats, input));
  return true;
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?,
//                            output_mask) -> (grad_input, grad_weight, grad_bias): the input
// gradient contiguous, the parameters' gradients shaped as the parameters
// (declined without them, where ATen's results depend on its paths).
bool native_layer_norm_backward(torch::jit::Stack& stack, size_t base) {
  const at::Tensor& grad_out = stack[base].toTensor();
  const at::Tensor& input = stack[base + 1].toTensor();
  if (!float_or_double(input) || grad_out.scalar_type() != input.scalar_type() || grad_out.sizes() != input.sizes())
    return false;
  const std::vector<bool> mask = stack[base + 7].toBoolList().vec();
  if (mask.size() != 3) return false;
  const c10::IValue& weight = stack[base + 5];
  const c10::IValue& bias = stack[base + 6];
  auto parameter = [](const c10::IValue& v) { return v.isTensor() && v.toTensor().defined(); };
  if ((mask[1] && !parameter(weight)) || (mask[2] && !parameter(bias))) return false;
  const at::Tensor grad_input = empty_meta(input.sizes(), input);
  const at::Tensor grad_weight = mask[1] ? empty_meta(weight.toTensor().sizes(), weight.toTensor()) : at::Tensor();
  const at::Tensor grad_bias = mask[2] ? empty_meta(bias.toTensor().sizes(), bias.toTensor()) : at::Tensor();
  stack.resize(base);
  stack.push_back(maybe(mask[0], grad_input));
  stack.push_back(maybe(mask[1], grad_weight));
  stack.push_back(maybe(mask[2], grad_bias));
  return true;
}

// embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
// [num_weights, a row's size], contiguous, in the gradient's dtype.
bool embedding_dense_backward(torch::jit::Stack& stack, size_t base) {
  const at::Tensor& grad = stack[base].toTensor();
  const int64_t num_weights = stack[base + 2].toInt();
  if (grad.dim() < 1 || num_weights < 0) return false;
  stack.resize(base);
  stack.emplace_back(empty_meta({num_weights, grad.size(-1)}, grad));
  return true;
}

// var_mean.dim(self, dim?, unbiased, keepdim) and var_mean.correction(self,
// dim?, *, correction?, keepdim) -> (var, mean): the reduced sizes,
// contiguous, in self's dtype (floating types only: complex inputs give a
// real variance).
bool var_mean(torch::jit::Stack& stack, size_t base) {
  const at::Tensor& self = stack[base].toTensor();
  if (!at::isFloatingType(self.scalar_type())) return false;
  const bool keepdim = stack[base + 3].toBool();
  std::vector<bool> reduced(static_cast<size_t>(self.dim()), stack[base + 1].isNone());
  if (!stack[base + 1].isNone()) {
    const std::vector<int64_t> dims = stack[base + 1].toIntVector();
    if (dims.empty()) reduced.assign(reduced.size(), true);
    for (int64_t d : dims) {
      const int64_t n = std::max<int64_t>(self.dim(), 1);  // a 0-dim tensor takes dim 0 and -1
      if (d < -n || d >= n) return false;                  // the kernel's error
      if (self.dim() > 0) reduced[static_cast<size_t>(d < 0 ? d + self.dim() : d)] = true;
    }
  }
  std::vector<int64_t> sizes;
  for (int64_t d = 0; d < self.dim(); ++d)
    if (!reduced[static_cast<size_t>(d)])
      sizes.push_back(self.size(d));
    else if (keepdim)
      sizes.push_back(1);
  stack.resize(base);
  stack.emplace_back(empty_meta(sizes, self));
  stack.emplace_back(empty_meta(sizes, self));
  return true;
}

// embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse):
// weight.index_select(0, indices.reshape(-1)) viewed as indices' sizes
// followed by a row's, contiguous.
bool embedding(torch::jit::Stack& stack, size_t base) {
  const at::Tensor& weight = stack[base].toTensor();
  const at::Tensor& indices = stack[base + 1].toTensor();
  if (weight.dim() < 1 || (indices.scalar_type() != at::kLong && indices.scalar_type() != at::kInt)) return false;
  std::vector<int64_t> sizes = indices.sizes().vec();
  for (int64_t d = 1; d < weight.dim(); ++d) sizes.push_back(weight.size(d));
  stack.resize(base);
  stack.emplace_back(empty_meta(sizes, weight));
  return true;
}

// where(condition, self, other) as ATen's where and where_self_out compute
// it, over meta tensors: the promoted type, self and other converted to it,
// and the TensorIterator whose output takes the broadcast sizes and the
// stride order of the inputs. A Scalar self or other is a wrapped number,
// as wrapped_scalar_tensor makes it. Declines unless every tensor is meta
// (a CPU scalar beside meta tensors takes another path in ATen).
bool where_of(torch::jit::Stack& stack, size_t base, bool scalar_self, bool scalar_other) {
  auto operand = [&](size_t i, bool scalar) -> std::optional<at::Tensor> {
    if (!scalar) {
      const at::Tensor& t = stack[base + i].toTensor();
      return t.is_meta() ? std::optional(t) : std::nullopt;
    }
    at::Tensor t = at::scalar_tensor(stack[base + i].toScalar(),
                                     at::TensorOptions().dtype(stack[base + i].toScalar().type()).device(c10::kMeta));
    t.unsafeGetTensorImpl()->set_wrapped_number(true);
    return t;
  };
  const at::Tensor& condition = stack[base].toTensor();
  const std::optional<at::Tensor> self = operand(1, scalar_self), other = operand(2, scalar_other);
  if (!condition.is_meta() || !self || !other) return false;
  if (condition.scalar_type() != at::kBool && condition.scalar_type() != at::kByte) return false;
  const at::ScalarType type = at::result_type(*self, *other);
  at::Tensor out = at::empty({0}, at::TensorOptions().dtype(type).device(c10::kMeta));
  at::TensorIteratorConfig()
      .check_all_same_dtype(false)
      .add_output(out)
      .add_const_input(condition.scalar_type() == at::kByte ? condition.to(at::kBool) : condition)
      .add_const_input(self->scalar_type() == type ? *self : self->to(type))
      .add_const_input(other->scalar_type() == type ? *other : other->to(type))
      .build();
  stack.resize(base);
  stack.emplace_back(std::move(out));
  return true;
}

bool where_self(torch::jit::Stack& stack, size_t base) { return where_of(stack, base, false, false); }
bool where_scalar_other(torch::jit::Stack& stack, size_t base) { return where_of(stack, base, false, true); }
bool where_scalar_self(torch::jit::Stack& stack, size_t base) { return where_of(stack, base, true, false); }

// Note [Attention kernels' metadata]
// scaled_dot_product_attention on CUDA tensors runs one of three fused
// kernels (flash, memory-efficient, cuDNN), CUDA-only ops without Meta
// kernels in C++ or CPU kernels to stand in. Their results' metadata, as
// the H200's kernels return them for query [B, H, L, E], key [B, H, S, E]
// and value [B, H, S, Ev] in float16 and bfloat16, with the heads-major
// (contiguous) and the sequence-major ([B, L, H, E] transposed) layouts,
// dropout or not (bench/probe_attention.py; bench/results/fake_mode.md):
//  * flash and cuDNN: the output, and the backward's gradients, have their
//    input's layout (empty_like); flash's logsumexp is [B, H, L] float32,
//    its RNG state a [2] and a [] uint64 tensor on the device, its debug
//    mask empty; cuDNN's logsumexp is [B, H, L, 1] float32, its seed and
//    offset int64 scalars on the device;
//  * memory-efficient: the output and the gradients are sequence-major
//    whatever the inputs' layout; logsumexp is [B, H, L] float32 when asked
//    for, else [B, H, 0]; the seed and offset are int64 scalars on the CPU;
//    a bias's gradient is contiguous.
// Inputs may also be views of a larger buffer with unit stride in the last
// dimension (q, k and v as thirds of one projection, as GPT-2 makes them):
// empty_like then lays the results out densely in the inputs' order of
// strides, as it does on the GPU (the CUDA tracer test compares). Only what
// was checked so is computed: no element of an input reached twice, inputs
// not sharing memory where the memory-efficient backward may pack their
// gradients into one buffer, lengths that are multiples of the kernels'
// tiles (L of 32 for the memory-efficient logsumexp, S of 16 for a bias
// gradient), no debug mask. Elsewhere the functions decline, and a
// TraceMode::Auto trace runs in real mode.
bool strided_heads(const at::Tensor& t) {
  if (t.dim() != 4 || t.stride(3) != 1) return false;
  std::array<int64_t, 4> order{0, 1, 2, 3};
  std::sort(order.begin(), order.end(), [&t](int64_t a, int64_t b) { return t.stride(a) < t.stride(b); });
  int64_t reach = 1;  // elements the dimensions before span
  for (const int64_t d : order) {
    if (t.size(d) == 1) continue;
    if (t.stride(d) < reach) return false;
    reach = t.stride(d) * t.size(d);
  }
  return true;
}

// [B, H, n, e] laid out as [B, n, H, e] transposed.
at::Tensor sequence_major(const at::Tensor& like, int64_t n, int64_t e) {
  return empty_meta({like.size(0), n, like.size(1), e}, like).transpose(1, 2);
}

at::Tensor empty_on_meta(at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::empty(sizes, at::TensorOptions().dtype(dtype).device(c10::kMeta));
}

bool attention_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return strided_heads(q) && strided_heads(k) && strided_heads(v);
}

// The results flash and cuDNN attention share: (output in the query's
// layout, logsumexp, cum_seq_q, cum_seq_k (undefined: no nested tensors),
// max_q, max_k, seed, offset, debug mask).
void push_fused_attention(torch::jit::Stack& stack, const at::Tensor& q, const at::Tensor& k, at::Tensor logsumexp,
                          at::Tensor seed, at::Tensor offset, at::Tensor debug_mask) {
  stack.emplace_back(at::empty_like(q));
  stack.emplace_back(std::move(logsumexp));
  stack.emplace_back(at::Tensor());
  stack.emplace_back(at::Tensor());
  stack.emplace_back(q.size(2));
  stack.emplace_back(k.size(2));
  stack.emplace_back(std::move(seed));
  stack.emplace_back(std::move(offset));
  stack.emplace_back(std::move(debug_mask));
}

// _scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal,
// return_debug_mask, *, scale).
bool flash_attention(torch::jit::Stack& stack, size_t base) {
  const at::Tensor q = stack[base].toTensor(), k = stack[base + 1].toTensor(), v = stack[base + 2].toTensor();
  if (!attention_inputs(q, k, v) || stack[base + 5].toBool() || v.size(3) != q.size(3)) return false;
  stack.resize(base);
  push_fused_attention(stack, q, k, empty_on_meta({q.size(0), q.size(1), q.size(2)}, at::kFloat),
                       empty_on_meta({2}, at::kUInt64), empty_on_meta({}, at::kUInt64),
                       empty_on_meta({0}, q.scalar_type()));
  return true;
}

// _scaled_dot_product_flash_attention_backward and
// _scaled_dot_product_cudnn_attention_backward(grad_out, q, k, v, ...): the
// gradients in their inputs' layouts.
bool attention_backward_in_input_layouts(torch::jit::Stack& stack, size_t base) {
  const at::Tensor q = stack[base + 1].toTensor(), k = stack[base + 2].toTensor(), v = stack[base + 3].toTensor();
  if (!attention_inputs(q, k, v)) return false;
  stack.resize(base);
  for (const at::Tensor* t : {&q, &k, &v}) stack.emplace_back(at::empty_like(*t));
  return true;
}

// _scaled_dot_product_efficient_attention(q, k, v, attn_bias,
// compute_log_sumexp, dropout_p, is_causal, *, scale).
bool efficient_attention(torch::jit::Stack& stack, size_t base) {
  const at::Tensor q = stack[base].toTensor(), k = stack[base + 1].toTensor(), v = stack[base + 2].toTensor();
  if (!attention_inputs(q, k, v) || (stack[base + 4].toBool() && q.size(2) % 32 != 0)) return false;
  const int64_t lse = stack[base + 4].toBool() ? q.size(2) : 0;
  stack.resize(base);
  stack.emplace_back(sequence_major(q, q.size(2), v.size(3)));
  stack.emplace_back(empty_on_meta({q.size(0), q.size(1), lse}, at::kFloat));
  stack.emplace_back(at::empty({}, at::kLong));  // on the CPU, as the kernel returns them
  stack.emplace_back(at::empty({}, at::kLong));
  return true;
}

// _scaled_dot_product_efficient_attention_backward(grad_out, q, k, v,
// attn_bias, out, logsumexp, seed, offset, dropout_p, grad_input_mask, ...).
bool efficient_attention_backward(torch::jit::Stack& stack, size_t base) {
  const at::Tensor q = stack[base + 1].toTensor(), k = stack[base + 2].toTensor(), v = stack[base + 3].toTensor();
  const at::Tensor bias = stack[base + 4].toTensor();
  // Inputs sharing memory (thirds of one projection) may get gradients
  // packed into one buffer, a layout the probe did not cover.
  if (!attention_inputs(q, k, v) || q.storage().is_alias_of(k.storage()) || q.storage().is_alias_of(v.storage()) ||
      k.storage().is_alias_of(v.storage()))
    return false;
  const std::vector<bool> mask = stack[base + 10].toBoolList().vec();
  at::Tensor grad_bias;
  if (bias.defined() && mask.at(3)) {
    if (bias.size(-1) % 16 != 0) return false;
    grad_bias = empty_meta(bias.sizes(), bias);
  }
  stack.resize(base);
  for (const at::Tensor* t : {&q, &k, &v}) stack.emplace_back(sequence_major(*t, t->size(2), t->size(3)));
  stack.emplace_back(grad_bias);
  return true;
}

// _scaled_dot_product_cudnn_attention(q, k, v, attn_bias,
// compute_log_sumexp, dropout_p, is_causal, return_debug_mask, *, scale).
bool cudnn_attention(torch::jit::Stack& stack, size_t base) {
  const at::Tensor q = stack[base].toTensor(), k = stack[base + 1].toTensor(), v = stack[base + 2].toTensor();
  if (!attention_inputs(q, k, v) || v.size(3) != q.size(3) || !stack[base + 4].toBool() || stack[base + 7].toBool())
    return false;
  stack.resize(base);
  push_fused_attention(stack, q, k, empty_on_meta({q.size(0), q.size(1), q.size(2), 1}, at::kFloat),
                       empty_on_meta({}, at::kLong), empty_on_meta({}, at::kLong), at::Tensor());
  return true;
}

using MetaFunction = bool (*)(torch::jit::Stack&, size_t);

const std::unordered_map<std::string_view, MetaFunction>& table() {
  static const std::unordered_map<std::string_view, MetaFunction> t = {
      {"aten::convolution", convolution},
      {"aten::convolution_backward", convolution_backward},
      {"aten::native_batch_norm", native_batch_norm},
      {"aten::native_batch_norm_backward", native_batch_norm_backward},
      {"aten::batch_norm_stats", batch_norm_stats},
      {"aten::batch_norm_backward_reduce", batch_norm_backward_reduce},
      {"aten::cudnn_batch_norm", cudnn_batch_norm},
      {"aten::cudnn_batch_norm_backward", cudnn_batch_norm_backward},
      {"crucible::cudnn_batch_norm_functional", cudnn_batch_norm_functional},
      {"aten::var_mean.dim", var_mean},
      {"aten::var_mean.correction", var_mean},
      {"aten::embedding", embedding},
      {"aten::embedding_dense_backward", embedding_dense_backward},
      {"aten::native_layer_norm", native_layer_norm},
      {"aten::native_layer_norm_backward", native_layer_norm_backward},
      {"aten::where.self", where_self},
      {"aten::where.ScalarOther", where_scalar_other},
      {"aten::where.ScalarSelf", where_scalar_self},
      {"aten::_scaled_dot_product_flash_attention", flash_attention},
      {"aten::_scaled_dot_product_flash_attention_backward", attention_backward_in_input_layouts},
      {"aten::_scaled_dot_product_efficient_attention", efficient_attention},
      {"aten::_scaled_dot_product_efficient_attention_backward", efficient_attention_backward},
      {"aten::_scaled_dot_product_cudnn_attention", cudnn_attention},
      {"aten::_scaled_dot_product_cudnn_attention_backward", attention_backward_in_input_layouts},
  };
  return t;
}

}  // namespace

bool call_meta_function(const c10::OperatorHandle& op, torch::jit::Stack& stack) {
  const auto& name = op.operator_name();
  auto it = table().find(name.overload_name.empty() ? name.name : name.name + "." + name.overload_name);
  if (it == table().end()) return false;
  const size_t base = stack.size() - op.schema().arguments().size();
  return it->second(stack, base);
}

}  // namespace crucible::ir::detail
