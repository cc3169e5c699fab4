#include <crucible/tracer/decomposition.h>

#include <crucible/ir/graph.h>

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>

#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

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
    d_input = ((rstd / n) * (a - b - c)).contiguous();  // as ATen's kernels make it, as the forward's y
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

// --- core ATen decompositions ---------------------------------------------------
//
// Note [Core ATen decompositions]
// Each entry rewrites a fused ATen op into the pointwise ops and reductions
// it computes, with the formula torch._decomp uses for it, so a code
// generator sees math it can fuse instead of an opaque kernel. The results
// are eager's up to the order of floating-point sums (a fused kernel and a
// decomposed reduction add in different orders), never bitwise. Half and
// bfloat16 inputs are computed in float and rounded once at the end, as the
// fused kernels do. A decomposition runs below functionalization, so it
// must call functional ops only: C++'s `scalar - tensor` and `scalar /
// tensor` are empty_like(...).fill_(...) followed by an in-place op, hence
// at::rsub here.

// The dtype a reduction over `t` computes in.
at::ScalarType compute_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16 ? at::kFloat : t.scalar_type();
}

// t as `dtype`: t itself when it has that dtype already. (Tensor::to would
// return an alias of t, recorded as an aten::to node whose result the
// functionalization cannot tell apart from a view when something later
// writes to it, e.g. a gradient accumulated in place.)
at::Tensor cast_to(const at::Tensor& t, c10::ScalarType dtype) { return t.scalar_type() == dtype ? t : t.to(dtype); }

at::Tensor upcast(const at::Tensor& t) { return cast_to(t, compute_dtype(t)); }

void push_results(std::vector<c10::IValue>& stack, std::initializer_list<at::Tensor> results) {
  stack.clear();
  for (const at::Tensor& r : results) stack.emplace_back(r);
}

// x - max(x) along dim, for softmax's exponentials; x itself when empty,
// where amax refuses a 0-size dim and there is nothing to shift.
at::Tensor minus_max(const at::Tensor& x, int64_t dim) {
  return x.numel() == 0 ? x : x - at::amax(x, {dim}, /*keepdim=*/true);
}

// _softmax(x, dim, half_to_float): exp(x - max) / sum(exp(x - max)).
void softmax(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  const at::Tensor x = stack[0].toTensor();
  const int64_t dim = stack[1].toInt();
  const at::ScalarType out = stack[2].toBool() ? at::kFloat : x.scalar_type();
  const at::Tensor xc = upcast(x);
  const at::Tensor e = at::exp(minus_max(xc, dim));
  push_results(stack, {(e / at::sum(e, {dim}, /*keepdim=*/true)).to(out)});
}

// _log_softmax(x, dim, half_to_float): (x - max) - log(sum(exp(x - max))).
void log_softmax(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  const at::Tensor x = stack[0].toTensor();
  const int64_t dim = stack[1].toInt();
  const at::ScalarType out = stack[2].toBool() ? at::kFloat : x.scalar_type();
  const at::Tensor xc = upcast(x);
  const at::Tensor shifted = minus_max(xc, dim);
  push_results(stack, {(shifted - at::log(at::sum(at::exp(shifted), {dim}, /*keepdim=*/true))).to(out)});
}

// _softmax_backward_data(grad, y, dim, input_dtype): y * (grad - sum(grad * y)).
void softmax_backward(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  const at::Tensor grad = upcast(stack[0].toTensor()), y = upcast(stack[1].toTensor());
  const int64_t dim = stack[2].toInt();
  const at::ScalarType input_dtype = stack[3].toScalarType();
  const at::Tensor gy = grad * y;
  push_results(stack, {(gy - y * at::sum(gy, {dim}, /*keepdim=*/true)).to(input_dtype)});
}

// _log_softmax_backward_data(grad, y, dim, input_dtype): grad - exp(y) * sum(grad).
void log_softmax_backward(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  const at::Tensor grad = upcast(stack[0].toTensor()), y = upcast(stack[1].toTensor());
  const int64_t dim = stack[2].toInt();
  const at::ScalarType input_dtype = stack[3].toScalarType();
  push_results(stack, {(grad - at::exp(y) * at::sum(grad, {dim}, /*keepdim=*/true)).to(input_dtype)});
}

constexpr double kSqrt1_2 = 0.70710678118654752440;      // 1/sqrt(2)
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1/sqrt(2 pi)
constexpr double kKappa = 0.044715;

// gelu(x, approximate): x * Phi(x), Phi the normal CDF ("none"), or its tanh
// approximation ("tanh").
void gelu(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  const at::Tensor x = stack[0].toTensor();
  const bool tanh = stack[1].toStringRef() == "tanh";
  const at::Tensor xc = upcast(x);
  const at::Tensor y = tanh ? 0.5 * xc * (1 + at::tanh(kSqrt2OverPi * (xc + kKappa * xc * xc * xc)))
                            : 0.5 * xc * (1 + at::erf(xc * kSqrt1_2));
  push_results(stack, {y.to(x.scalar_type())});
}

// gelu_backward(grad, x, approximate): grad * d/dx gelu(x).
void gelu_backward(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  const at::Tensor grad = stack[0].toTensor(), x = stack[1].toTensor();
  const bool tanh = stack[2].toStringRef() == "tanh";
  const at::Tensor g = upcast(grad), xc = upcast(x);
  at::Tensor d;
  if (tanh) {
    const at::Tensor inner = kSqrt2OverPi * (xc + kKappa * xc * xc * xc);
    const at::Tensor t = at::tanh(inner);
    d = 0.5 * (1 + t) + 0.5 * xc * at::rsub(t * t, 1) * kSqrt2OverPi * (1 + 3 * kKappa * xc * xc);
  } else {
    d = 0.5 * (1 + at::erf(xc * kSqrt1_2)) + xc * kInvSqrt2Pi * at::exp(-0.5 * xc * xc);
  }
  push_results(stack, {(g * d).to(x.scalar_type())});
}

// native_layer_norm(x, normalized_shape, weight?, bias?, eps) -> (y, mean, rstd):
// mean and rstd over the normalized (inner) dims, kept as size-1 dims; y
// contiguous whatever x's strides, as ATen's kernels make it (a graph traced
// without the decomposition may view it so: a pre-grad graph replayed).
void native_layer_norm(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  const at::Tensor x = stack[0].toTensor();
  const auto normalized_ndim = static_cast<int64_t>(stack[1].toIntVector().size());
  const auto weight = stack[2].toOptional<at::Tensor>();
  const auto bias = stack[3].toOptional<at::Tensor>();
  const double eps = stack[4].toDouble();
  std::vector<int64_t> inner;
  for (int64_t d = x.dim() - normalized_ndim; d < x.dim(); ++d) inner.push_back(d);
  const at::Tensor xc = upcast(x);
  const auto [var, mean] = at::var_mean(xc, inner, /*correction=*/0, /*keepdim=*/true);
  const at::Tensor rstd = at::rsqrt(var + eps);
  at::Tensor y = (xc - mean) * rstd;
  if (weight && weight->defined()) y = y * *weight;
  if (bias && bias->defined()) y = y + *bias;
  push_results(stack, {y.to(x.scalar_type()).contiguous(), mean, rstd});
}

// nll_loss_forward(x, target, weight?, reduction, ignore_index) -> (loss,
// total_weight), x of [N, C] or [C]: minus the target class's entry, weighted,
// zero where target == ignore_index; summed, or divided by the total weight
// for the mean. The target's entry is picked by a sum over the class
// dimension of the entries whose class index equals the target (zeros
// elsewhere, so the sum is the entry, exactly), not by a gather: a fusing
// backend then reads x in the row loop that makes it (a log_softmax over a
// vocabulary) and never writes x to memory for the gather to read.
void nll_loss_forward(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  const at::Tensor x = stack[0].toTensor(), target = stack[1].toTensor();
  const auto weight = stack[2].toOptional<at::Tensor>();
  const int64_t reduction = stack[3].toInt(), ignore_index = stack[4].toInt();
  const int64_t channel_dim = x.dim() < 2 ? 0 : 1;
  const at::Tensor keep = target != ignore_index;
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[static_cast<size_t>(channel_dim)] = x.size(channel_dim);
  const at::Tensor classes = at::arange(x.size(channel_dim), target.options()).reshape(shape);
  const at::Tensor picked = classes == at::where(keep, target, 0).unsqueeze(channel_dim);
  const at::Tensor zero = at::zeros({}, x.options());
  at::Tensor loss = -at::where(picked, x, zero).sum(channel_dim);
  at::Tensor w;
  if (weight && weight->defined()) {
    w = at::where(picked, weight->reshape(shape), at::zeros({}, weight->options())).sum(channel_dim);
    loss = loss * w;
  }
  loss = at::where(keep, loss, 0);
  if (reduction == at::Reduction::None && x.dim() > 1) {
    push_results(stack, {loss, at::zeros({}, x.options())});
    return;
  }
  const at::Tensor total_weight = w.defined() ? at::where(keep, w, 0).sum() : keep.sum().to(x.scalar_type());
  if (reduction == at::Reduction::Sum) loss = loss.sum();
  if (reduction == at::Reduction::Mean) loss = loss.sum() / total_weight;
  push_results(stack, {loss, total_weight});
}

// nll_loss_backward(grad, x, target, weight?, reduction, ignore_index,
// total_weight): -grad (weighted, over the total weight for the mean) at each
// target class, zero elsewhere and where target == ignore_index. The one-hot
// rows are a comparison of the class index with the target, not a scatter
// into zeros, so that a fusing backend computes them where they are read
// and never writes the [N, C] zeros.
void nll_loss_backward(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  at::Tensor grad = stack[0].toTensor();
  const at::Tensor x = stack[1].toTensor(), target = stack[2].toTensor();
  const auto weight = stack[3].toOptional<at::Tensor>();
  const int64_t reduction = stack[4].toInt(), ignore_index = stack[5].toInt();
  const at::Tensor total_weight = stack[6].toTensor();
  const int64_t channel_dim = x.dim() < 2 ? 0 : 1;
  if (reduction == at::Reduction::Mean) grad = grad / total_weight;
  const at::Tensor t = target.unsqueeze(channel_dim);
  const at::Tensor keep = t != ignore_index;
  const at::Tensor safe_target = at::where(keep, t, 0);
  std::vector<int64_t> shape(static_cast<size_t>(x.dim()), 1);
  shape[static_cast<size_t>(channel_dim)] = x.size(channel_dim);
  const at::Tensor classes = at::arange(x.size(channel_dim), target.options()).reshape(shape);
  at::Tensor g = -(classes == safe_target).to(x.scalar_type());
  if (weight && weight->defined()) g = g * weight->reshape(shape);
  if (reduction == at::Reduction::None && x.dim() > 1) grad = grad.unsqueeze(channel_dim);
  push_results(stack, {at::where(keep, g * grad, 0)});
}

// silu(x) = x * sigmoid(x).
void silu(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  const at::Tensor x = stack[0].toTensor();
  const at::Tensor xc = upcast(x);
  push_results(stack, {(xc * at::sigmoid(xc)).to(x.scalar_type())});
}

// silu_backward(grad, x): grad * s * (1 + x * (1 - s)), s = sigmoid(x).
void silu_backward(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  const at::Tensor grad = stack[0].toTensor(), x = stack[1].toTensor();
  const at::Tensor xc = upcast(x), s = at::sigmoid(xc);
  push_results(stack, {(upcast(grad) * s * (1 + xc * at::rsub(s, 1))).to(x.scalar_type())});
}

// threshold_backward(grad, x, threshold): grad where x > threshold, else 0
// (relu's backward).
void threshold_backward(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  const at::Tensor grad = stack[0].toTensor(), x = stack[1].toTensor();
  const c10::Scalar threshold = stack[2].toScalar();
  push_results(stack, {at::where(x <= threshold, at::zeros({}, grad.options()), grad)});
}

// addcmul(self, a, b, value) = self + value * a * b; addcdiv with a / b (no
// multiplication when value is 1).
void addcmul(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  const at::Tensor self = stack[0].toTensor(), a = stack[1].toTensor(), b = stack[2].toTensor();
  const c10::Scalar value = stack[3].toScalar();
  const at::Tensor prod = a * b;
  push_results(stack, {value.equal(1) ? self + prod : self + value * prod});
}

void addcdiv(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  const at::Tensor self = stack[0].toTensor(), a = stack[1].toTensor(), b = stack[2].toTensor();
  const c10::Scalar value = stack[3].toScalar();
  const at::Tensor quot = a / b;
  push_results(stack, {value.equal(1) ? self + quot : self + value * quot});
}

// mse_loss(x, target, reduction): (x - target)^2, reduced.
void mse_loss(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  const at::Tensor x = stack[0].toTensor(), target = stack[1].toTensor();
  const int64_t reduction = stack[2].toInt();
  const at::Tensor d = x - target;
  at::Tensor loss = d * d;
  if (reduction == at::Reduction::Mean) loss = loss.mean();
  if (reduction == at::Reduction::Sum) loss = loss.sum();
  push_results(stack, {loss});
}

// mse_loss_backward(grad, x, target, reduction): 2 (x - target) grad, over
// the element count for the mean.
void mse_loss_backward(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  const at::Tensor grad = stack[0].toTensor(), x = stack[1].toTensor(), target = stack[2].toTensor();
  const int64_t reduction = stack[3].toInt();
  const double norm = reduction == at::Reduction::Mean ? 2.0 / static_cast<double>(x.numel()) : 2.0;
  push_results(stack, {norm * (x - target) * grad});
}

// embedding_dense_backward(grad, indices, num_weights, padding_idx,
// scale_grad_by_freq): each row of grad added into its index's row
// (index_put with accumulate), none into padding_idx; with
// scale_grad_by_freq each divided by how often its index occurs.
void embedding_dense_backward(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  const at::Tensor grad = stack[0].toTensor(), indices = stack[1].toTensor();
  const int64_t num_weights = stack[2].toInt(), padding_idx = stack[3].toInt();
  const bool scale_grad_by_freq = stack[4].toBool();
  const int64_t dim = grad.size(-1);
  const at::Tensor idx = indices.reshape({-1});
  at::Tensor rows = grad.reshape({-1, dim});
  if (scale_grad_by_freq) {
    const at::Tensor counts =
        at::index_put(at::zeros({num_weights}, grad.options()), {idx}, at::ones_like(idx, grad.options()), true);
    rows = rows / at::index_select(counts, 0, idx).unsqueeze(1);
  }
  if (padding_idx >= 0) rows = at::where((idx != padding_idx).unsqueeze(1), rows, at::zeros({}, rows.options()));
  push_results(stack, {at::index_put(at::zeros({num_weights, dim}, grad.options()), {idx}, rows, true)});
}

// A batch norm's reduced dims (all but the channels, dim 1) and the shape
// that broadcasts a per-channel value over x.
struct ChannelDims {
  std::vector<int64_t> axes, shape;
};
ChannelDims channel_dims(const at::Tensor& x) {
  ChannelDims c{{}, std::vector<int64_t>(static_cast<size_t>(x.dim()), 1)};
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d != 1) c.axes.push_back(d);
  c.shape[1] = x.size(1);
  return c;
}

// A batch norm's backward, with the per-channel sums over every dim but 1
// (N values each): in training
//   dx = (grad - (x - mean) * invstd^2 * sum(grad (x - mean)) / N - sum(grad) / N) * invstd * weight,
// in eval dx = grad * invstd * weight with the running statistics;
// dweight = sum(grad (x - mean)) * invstd, dbias = sum(grad). Results the
// mask leaves out are undefined.
std::vector<at::Tensor> batch_norm_backward(const at::Tensor& grad, const at::Tensor& x,
                                            const std::optional<at::Tensor>& weight,
                                            const std::optional<at::Tensor>& running_mean,
                                            const std::optional<at::Tensor>& running_var,
                                            const std::optional<at::Tensor>& save_mean,
                                            const std::optional<at::Tensor>& save_invstd, bool train, double eps,
                                            std::array<bool, 3> mask) {
  const auto [axes, shape] = channel_dims(x);
  const double n = static_cast<double>(x.numel()) / static_cast<double>(x.size(1));
  const at::Tensor xc = upcast(x), g = upcast(grad);
  const at::Tensor mean = train ? *save_mean : upcast(*running_mean);
  const at::Tensor invstd = train ? *save_invstd : at::rsqrt(upcast(*running_var) + eps);
  const at::Tensor centered = xc - mean.reshape(shape);
  at::Tensor grad_sum, dot;
  if (train && x.is_cuda()) {
    // Both sums in one pass over grad and x (Note [Batch norm on cuDNN]).
    auto sums = at::batch_norm_backward_reduce(grad, x, mean, invstd, std::nullopt, /*input_g=*/true,
                                               /*weight_g=*/false, /*bias_g=*/false);
    grad_sum = std::get<0>(sums);
    dot = std::get<1>(sums);
  } else {
    grad_sum = g.sum(axes);
    dot = (g * centered).sum(axes);
  }
  const bool has_weight = weight && weight->defined();
  const at::Tensor scale = has_weight ? invstd * upcast(*weight) : invstd;
  at::Tensor dx, dw, db;
  if (mask[0]) {
    dx = train ? (g - centered * (invstd * invstd * dot / n).reshape(shape) - (grad_sum / n).reshape(shape)) *
                     scale.reshape(shape)
               : g * scale.reshape(shape);
    dx = cast_to(dx, x.scalar_type());
  }
  if (mask[1] && has_weight) dw = cast_to(dot * invstd, weight->scalar_type());
  if (mask[2] && has_weight) db = cast_to(grad_sum, weight->scalar_type());
  return {dx, dw, db};
}

// native_batch_norm_backward(grad, x, weight?, running_mean?, running_var?,
// save_mean?, save_invstd?, train, eps, output_mask).
void native_batch_norm_backward(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  const auto mask = stack[9].toBoolList();
  const std::vector<at::Tensor> r = batch_norm_backward(
      stack[0].toTensor(), stack[1].toTensor(), stack[2].toOptional<at::Tensor>(), stack[3].toOptional<at::Tensor>(),
      stack[4].toOptional<at::Tensor>(), stack[5].toOptional<at::Tensor>(), stack[6].toOptional<at::Tensor>(),
      stack[7].toBool(), stack[8].toDouble(), {mask.get(0), mask.get(1), mask.get(2)});
  push_results(stack, {r[0], r[1], r[2]});
}

// Note [Batch norm on cuDNN]
// On CUDA, float and half batch norms run cuDNN's kernels (cudnn_batch_norm,
// its functional variant and its backward); bfloat16 ones ATen's native
// kernels. Kept whole, cuDNN's batch norm is an extern kernel whose output
// the backward cannot make again: a training step keeps both a convolution's
// output (which the backward's statistics read) and the ReLU after the batch
// norm (which the next convolution's weight gradient reads), ResNet-18's
// largest tensors twice. Both are decomposed as below instead, as
// torch._decomp decomposes every batch norm for TorchInductor: the
// normalization, its ReLU and the running statistics are pointwise ops that
// fuse, and what the backward needs is the convolution's output and two [C]
// statistics. On a GPU the reductions are ATen's CUDA kernels rather than
// generated ones: batch_norm_stats (the mean and invstd in one Welford pass
// over the input, in its layout) and batch_norm_backward_reduce (both of the
// backward's sums in one pass), the kernels SyncBatchNorm runs; generated,
// the statistics were column reductions read twice (no Welford pass) and
// ResNet-18's fp32 step took 8.26 against 7.75 ms with cuDNN. With them it
// takes 7.36 ms (torch.compile's: 7.95) at 1476 against 1677 MiB
// (bench/results/memory.md). On the CPU (NCHW, row-like reductions that
// fuse) the generated reductions fuse ReLU into the normalization and took
// the forward's batch norms and ReLUs from 5.5 to 1.6 ms a step
// (bench/results/inductor.md).

// Batch norm's forward over every dim but 1 (N values a channel), as
// torch._decomp's native_batch_norm_helper: in training with the batch's
// statistics,
//   var, mean = var_mean(x, correction = 0),  invstd = rsqrt(var + eps),
//   new running_mean = (1 - momentum) running_mean + momentum mean,
//   new running_var  = (1 - momentum) running_var + momentum var N / (N - 1),
// in eval with the running ones; out = (x - mean) invstd weight + bias.
// Eval returns no saved statistics (empty, as ATen's kernels), and running
// statistics that are not given are not updated (undefined here).
struct BatchNorm {
  at::Tensor out, save_mean, save_invstd, running_mean, running_var;
};

BatchNorm batch_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                     const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
                     const std::optional<at::Tensor>& running_var, bool training, double momentum, double eps) {
  const auto [axes, shape] = channel_dims(x);
  const at::Tensor xc = upcast(x);
  const auto given = [](const std::optional<at::Tensor>& t) { return t && t->defined(); };
  BatchNorm r;
  at::Tensor mean, invstd;
  if (training) {
    at::Tensor var;
    if (x.is_cuda()) {
      // One Welford pass (Note [Batch norm on cuDNN]); the biased variance
      // again from invstd = rsqrt(var + eps), for the running statistics.
      std::tie(mean, invstd) = at::batch_norm_stats(x, eps);
      var = at::reciprocal(invstd * invstd) - eps;
    } else {
      std::tie(var, mean) = at::var_mean(xc, axes, /*correction=*/0, /*keepdim=*/false);
      invstd = at::rsqrt(var + eps);
    }
    r.save_mean = mean;
    r.save_invstd = invstd;
    const double n = static_cast<double>(x.numel()) / static_cast<double>(x.size(1));
    if (given(running_mean))
      r.running_mean = cast_to(upcast(*running_mean) * (1 - momentum) + mean * momentum, running_mean->scalar_type());
    if (given(running_var))
      r.running_var =
          cast_to(upcast(*running_var) * (1 - momentum) + var * (momentum * n / (n - 1)), running_var->scalar_type());
  } else {
    mean = upcast(*running_mean);
    invstd = at::rsqrt(upcast(*running_var) + eps);
    r.save_mean = at::empty({0}, mean.options());
    r.save_invstd = at::empty({0}, mean.options());
  }
  at::Tensor y = (xc - mean.reshape(shape)) * invstd.reshape(shape);
  if (given(weight)) y = y * upcast(*weight).reshape(shape);
  if (given(bias)) y = y + upcast(*bias).reshape(shape);
  r.out = cast_to(y, x.scalar_type());
  return r;
}

// native_batch_norm(x, weight?, bias?, running_mean?, running_var?, training,
// momentum, eps) -> (out, save_mean, save_invstd), updating the running
// statistics in place in training. (With functionalize and statistics the
// trace reaches, the tracer records the functional variant below instead.)
void native_batch_norm(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  const auto running_mean = stack[3].toOptional<at::Tensor>(), running_var = stack[4].toOptional<at::Tensor>();
  const BatchNorm r =
      batch_norm(stack[0].toTensor(), stack[1].toOptional<at::Tensor>(), stack[2].toOptional<at::Tensor>(),
                 running_mean, running_var, stack[5].toBool(), stack[6].toDouble(), stack[7].toDouble());
  // Written in place, as the kernel does (Note [Ops with hidden writes]).
  if (r.running_mean.defined()) running_mean->copy_(r.running_mean);
  if (r.running_var.defined()) running_var->copy_(r.running_var);
  push_results(stack, {r.out, r.save_mean, r.save_invstd});
}

// _native_batch_norm_legit_functional(x, weight?, bias?, running_mean,
// running_var, training, momentum, eps) -> (out, save_mean, save_invstd,
// running_mean_out, running_var_out).
void native_batch_norm_functional(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  const at::Tensor running_mean = stack[3].toTensor(), running_var = stack[4].toTensor();
  BatchNorm r = batch_norm(stack[0].toTensor(), stack[1].toOptional<at::Tensor>(), stack[2].toOptional<at::Tensor>(),
                           running_mean, running_var, stack[5].toBool(), stack[6].toDouble(), stack[7].toDouble());
  // Eval: unchanged, as new tensors (a functional op's results alias nothing).
  if (!r.running_mean.defined()) r.running_mean = running_mean.clone();
  if (!r.running_var.defined()) r.running_var = running_var.clone();
  push_results(stack, {r.out, r.save_mean, r.save_invstd, r.running_mean, r.running_var});
}

// cuDNN's batch norm (Note [Batch norm on cuDNN]): cudnn_batch_norm(x,
// weight, bias?, running_mean?, running_var?, training, momentum, eps) ->
// (out, save_mean, save_invstd, reserve), updating the running statistics in
// place in training, and crucible::cudnn_batch_norm_functional (x, weight,
// bias?, running_mean, running_var, momentum, eps) -> (..., running_mean_out,
// running_var_out), its functional variant in training (Note [Ops with
// hidden writes]). cuDNN's reserve space becomes an empty byte tensor, which
// the backward below does not read.
at::Tensor no_reserve(const at::Tensor& x) { return at::empty({0}, x.options().dtype(at::kByte)); }

void cudnn_batch_norm(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  const auto running_mean = stack[3].toOptional<at::Tensor>(), running_var = stack[4].toOptional<at::Tensor>();
  const at::Tensor x = stack[0].toTensor();
  const BatchNorm r = batch_norm(x, stack[1].toOptional<at::Tensor>(), stack[2].toOptional<at::Tensor>(), running_mean,
                                 running_var, stack[5].toBool(), stack[6].toDouble(), stack[7].toDouble());
  if (r.running_mean.defined()) running_mean->copy_(r.running_mean);
  if (r.running_var.defined()) running_var->copy_(r.running_var);
  push_results(stack, {r.out, r.save_mean, r.save_invstd, no_reserve(x)});
}

void cudnn_batch_norm_functional(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  const at::Tensor x = stack[0].toTensor();
  const BatchNorm r =
      batch_norm(x, stack[1].toOptional<at::Tensor>(), stack[2].toOptional<at::Tensor>(), stack[3].toTensor(),
                 stack[4].toTensor(), /*training=*/true, stack[5].toDouble(), stack[6].toDouble());
  push_results(stack, {r.out, r.save_mean, r.save_invstd, no_reserve(x), r.running_mean, r.running_var});
}

// cudnn_batch_norm_backward(x, grad, weight, running_mean?, running_var?,
// save_mean?, save_invstd?, eps, reserve): autograd calls it for a batch
// norm in training only.
void cudnn_batch_norm_backward(const c10::OperatorHandle&, std::vector<c10::IValue>& stack) {
  const std::vector<at::Tensor> r = batch_norm_backward(
      stack[1].toTensor(), stack[0].toTensor(), stack[2].toTensor(), stack[3].toOptional<at::Tensor>(),
      stack[4].toOptional<at::Tensor>(), stack[5].toOptional<at::Tensor>(), stack[6].toOptional<at::Tensor>(),
      /*train=*/true, stack[7].toDouble(), {true, true, true});
  push_results(stack, {r[0], r[1], r[2]});
}

}  // namespace

DecompositionTable spmd_decomposition_table() {
  DecompositionTable table;
  // In-place op (name, overload) → functional op (name, overload).
  const std::vector<std::pair<std::string, std::string>> foreach_ops = {
      {"_foreach_add_", "List"},       {"_foreach_add_", "Scalar"}, {"_foreach_addcdiv_", "Scalar"},
      {"_foreach_addcmul_", "Scalar"}, {"_foreach_div_", "List"},   {"_foreach_mul_", "Scalar"},
      {"_foreach_div_", "Scalar"},     {"_foreach_neg_", ""},       {"_foreach_reciprocal_", ""},
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

DecompositionTable core_aten_decompositions() {
  // See Note [Core ATen decompositions].
  const std::vector<std::pair<std::string, Decomposition>> entries = {
      {"aten::_softmax", softmax},
      {"aten::_log_softmax", log_softmax},
      {"aten::_softmax_backward_data", softmax_backward},
      {"aten::_log_softmax_backward_data", log_softmax_backward},
      {"aten::gelu", gelu},
      {"aten::gelu_backward", gelu_backward},
      {"aten::native_layer_norm", native_layer_norm},
      {"aten::native_layer_norm_backward", native_layer_norm_backward},
      {"aten::nll_loss_forward", nll_loss_forward},
      {"aten::nll_loss_backward", nll_loss_backward},
      {"aten::silu", silu},
      {"aten::silu_backward", silu_backward},
      {"aten::threshold_backward", threshold_backward},
      {"aten::addcmul", addcmul},
      {"aten::addcdiv", addcdiv},
      {"aten::mse_loss", mse_loss},
      {"aten::mse_loss_backward", mse_loss_backward},
      {"aten::embedding_dense_backward", embedding_dense_backward},
      {"aten::native_batch_norm_backward", native_batch_norm_backward},
      {"aten::native_batch_norm", native_batch_norm},
      {"aten::_native_batch_norm_legit_functional", native_batch_norm_functional},
      {"aten::cudnn_batch_norm", cudnn_batch_norm},
      {"crucible::cudnn_batch_norm_functional", cudnn_batch_norm_functional},
      {"aten::cudnn_batch_norm_backward", cudnn_batch_norm_backward},
  };
  DecompositionTable table;
  for (const auto& [name, decomposition] : entries)
    if (find_op(name, "")) table[name] = decomposition;
  return table;
}

}  // namespace crucible::tracer
