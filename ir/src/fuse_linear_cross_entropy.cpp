#include <crucible/ir/dce.h>
#include <crucible/ir/fuse_linear_cross_entropy.h>
#include <crucible/ir/propagate_meta.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <string_view>
#include <tuple>

namespace crucible::ir {
namespace {

// Note [Chunked linear cross-entropy]
// The loss of a language model's head reads logits [N, V] (N = B*T rows,
// V the vocabulary: 8192 x 50257 for GPT-2 at batch 8), which eager keeps
// in float32 with their log-softmax for the backward, and whose gradient
// it materializes too: several GiB. Here the rows go in chunks: per chunk
// the logits (in the input's dtype, as the matmul eager runs gives them),
// their float32 log-sum-exp, the loss's share, and at once the gradient of
// the mean loss with respect to those logits, softmax - one_hot over the
// count of targets not ignored, which the chunk's matmuls turn into its
// rows of grad_input and its share of grad_weight and grad_bias (summed in
// float32). A chunk of N * C / V rows, rounded up to a power of two as
// Liger Kernel's (and at least 256), holds logits about the size of the
// input. The backward
// then only scales these gradients by the loss's incoming gradient (the
// loss is a model's last op, so that costs nothing extra).

using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// Fewer rows make the chunks' matmuls too thin to run well (16 rows of
// GPT-2 at batch 1 cost a fifth more time on a CPU).
constexpr int64_t kMinChunkRows = 256;

int64_t chunk_rows(int64_t rows, int64_t vocab, int64_t channels) {
  const int64_t per = std::max<int64_t>(1, (vocab + channels - 1) / channels);
  int64_t chunk = kMinChunkRows;
  while (chunk < (rows + per - 1) / per) chunk *= 2;
  return std::min(chunk, std::max<int64_t>(rows, 1));
}

Grads forward_kernel(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                     const at::Tensor& target, int64_t ignore_index) {
  TORCH_CHECK(input.dim() == 2 && weight.dim() == 2 && input.size(1) == weight.size(1),
              "crucible::linear_cross_entropy: input [N, C] and weight [V, C] expected, got ", input.sizes(), " and ",
              weight.sizes());
  TORCH_CHECK(target.dim() == 1 && target.size(0) == input.size(0) && target.scalar_type() == at::kLong,
              "crucible::linear_cross_entropy: target [N] of int64 expected, got ", target.sizes(), " ",
              target.scalar_type());
  const int64_t n = input.size(0);
  const at::Tensor valid = target.ne(ignore_index);
  const at::Tensor count = valid.sum().to(at::kFloat);
  const at::Tensor safe_target = target.masked_fill(valid.logical_not(), 0).unsqueeze(1);
  const at::TensorOptions f32 = input.options().dtype(at::kFloat);
  at::Tensor loss = at::zeros({}, f32);
  at::Tensor grad_input = at::empty(input.sizes(), input.options());
  at::Tensor grad_weight = at::zeros(weight.sizes(), f32);
  at::Tensor grad_bias = bias && bias->defined() ? at::zeros(bias->sizes(), f32) : at::Tensor();
  const at::Tensor weight_t = weight.t();
  const int64_t rows = chunk_rows(n, weight.size(0), weight.size(1));
  for (int64_t start = 0; start < n; start += rows) {
    const int64_t len = std::min(rows, n - start);
    const at::Tensor x = input.narrow(0, start, len);
    const at::Tensor logits =
        (grad_bias.defined() ? at::addmm(*bias, x, weight_t) : at::mm(x, weight_t)).to(at::kFloat);
    const at::Tensor lse = logits.logsumexp(1, /*keepdim=*/true);
    const at::Tensor t = safe_target.narrow(0, start, len);
    const at::Tensor keep = valid.narrow(0, start, len).unsqueeze(1).to(at::kFloat);
    loss.add_(((lse - logits.gather(1, t)) * keep).sum());
    at::Tensor g = logits.sub_(lse).exp_();  // the softmax, in place of the logits
    g.scatter_add_(1, t, at::full_like(t, -1.0, f32));
    g.mul_(keep.div(count));
    const at::Tensor g_in = g.to(input.scalar_type());  // as eager's mm backward reads it
    grad_input.narrow(0, start, len).copy_(at::mm(g_in, weight));
    grad_weight.addmm_(g_in.t().to(at::kFloat), x.to(at::kFloat));
    if (grad_bias.defined()) grad_bias.add_(g_in.to(at::kFloat).sum(0));
  }
  return {loss.div_(count), grad_input, grad_weight.to(weight.scalar_type()),
          grad_bias.defined() ? grad_bias.to(bias->scalar_type()) : grad_bias};
}

Grads meta_kernel(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                  const at::Tensor& target, int64_t) {
  TORCH_CHECK(input.dim() == 2 && weight.dim() == 2 && target.dim() == 1,
              "crucible::linear_cross_entropy: input [N, C], weight [V, C] and target [N] expected");
  return {at::empty({}, input.options().dtype(at::kFloat)), at::empty(input.sizes(), input.options()),
          at::empty(weight.sizes(), weight.options()),
          bias && bias->defined() ? at::empty(bias->sizes(), bias->options()) : at::Tensor()};
}

Grads forward_op(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                 const at::Tensor& target, int64_t ignore_index) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("crucible::linear_cross_entropy_forward", "")
                             .typed<Grads(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                          const at::Tensor&, int64_t)>();
  return op.call(input, weight, bias, target, ignore_index);
}

// The autograd formula: the gradients the forward computed, scaled by the
// loss's incoming gradient (Note [Chunked linear cross-entropy]).
class LinearCrossEntropy : public torch::autograd::Function<LinearCrossEntropy> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, const at::Tensor& target, int64_t ignore_index) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [loss, grad_input, grad_weight, grad_bias] = forward_op(input, weight, bias, target, ignore_index);
    ctx->save_for_backward({grad_input, grad_weight, grad_bias});
    return loss;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor& g = grads[0];
    return {saved[0] * g, saved[1] * g, saved[2].defined() ? saved[2] * g : at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor loss_below_autograd(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                               const at::Tensor& target, int64_t ignore_index) {
  return std::get<0>(forward_op(input, weight, bias, target, ignore_index));
}

at::Tensor loss_with_autograd(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                              const at::Tensor& target, int64_t ignore_index) {
  return LinearCrossEntropy::apply(input, weight, bias, target, ignore_index);
}

// The value `v` came from through single-reader calls of `ops` (each read
// by the next alone), or `v` itself.
Value* through(Value* v, std::initializer_list<std::string_view> ops, bool& ok) {
  while (v->node()->is_call() && v->users().size() == 1) {
    const Node* n = v->node();
    const std::string_view op = n->target();
    if (std::find(ops.begin(), ops.end(), op) == ops.end()) break;
    if (!n->arg(0).is_value()) {
      ok = false;
      break;
    }
    v = n->arg(0).value();
  }
  return v;
}

// A _to_copy that changes the dtype alone (a cast autocast or .float() makes).
bool is_cast(const Value& v) {
  const Node* n = v.node();
  if (!n->is_call() || n->target() != "aten::_to_copy" || !n->arg(0).is_value() || !v.has_meta()) return false;
  const Value& in = *n->arg(0).value();
  return in.has_meta() && in.meta().sizes == v.meta().sizes && in.meta().device == v.meta().device;
}

bool constant_is(const Argument& a, int64_t value) {
  return a.is_constant() && a.constant().isInt() && a.constant().toInt() == value;
}

}  // namespace

size_t fuse_linear_cross_entropy(Graph& graph) {
  size_t rewrites = 0;
  std::vector<Node*> losses;
  for (Node* n : graph.nodes())
    if (n->is_call() && n->target() == "aten::nll_loss_forward") losses.push_back(n);
  for (Node* nll : losses) {
    // nll_loss_forward(self, target, weight, reduction, ignore_index): mean, no class weights.
    if (nll->result(1)->has_users() || !nll->arg(0).is_value() || !nll->arg(1).is_value() ||
        !(nll->arg(2).is_constant() && nll->arg(2).constant().isNone()) || !constant_is(nll->arg(3), 1) ||
        !nll->arg(4).is_constant())
      continue;
    Value* log_probs = nll->arg(0).value();
    if (!log_probs->has_meta() || log_probs->meta().dtype != at::kFloat) continue;
    // Under CUDA autocast, cross_entropy's log_softmax runs in the logits'
    // dtype (it names that dtype, which autocast's float32 policy leaves as
    // it is) and nll_loss casts the log-probabilities up to float32.
    if (is_cast(*log_probs) && log_probs->users().size() == 1) log_probs = log_probs->node()->arg(0).value();
    const Node* lsm = log_probs->node();
    if (!lsm->is_call() || lsm->target() != "aten::_log_softmax" || log_probs->users().size() != 1 ||
        !lsm->arg(0).is_value() || !log_probs->has_meta() || log_probs->meta().sizes.size() != 2 ||
        !(constant_is(lsm->arg(1), 1) || constant_is(lsm->arg(1), -1)))
      continue;
    bool ok = true;
    // Under autocast the logits come from the bf16/f16 matmul through a _to_copy to float32.
    Value* logits = through(lsm->arg(0).value(), {"aten::_to_copy"}, ok);
    logits = through(logits, {"aten::view", "aten::_unsafe_view", "aten::reshape", "aten::_reshape_alias"}, ok);
    const Node* mm = logits->node();
    if (!ok || !mm->is_call() || logits->users().size() != 1) continue;
    Value *x = nullptr, *bias = nullptr, *transposed = nullptr;
    if (mm->target() == "aten::mm") {
      x = mm->arg(0).value();
      transposed = mm->arg(1).value();
    } else if (mm->target() == "aten::addmm" && constant_is(mm->arg(3), 1) && constant_is(mm->arg(4), 1)) {
      bias = mm->arg(0).value();
      x = mm->arg(1).value();
      transposed = mm->arg(2).value();
    } else {
      continue;
    }
    // The weight [V, C] is the operand's transpose: t(W), or, where autocast
    // casts the matmul's operands (CPU autocast casts addmm's), a cast of
    // t(W), whose transpose the fused op takes.
    const Node* t = transposed->node();
    const bool cast = t->is_call() && t->target() == "aten::_to_copy" && t->arg(0).is_value() &&
                      t->arg(0).value()->node()->is_call() && t->arg(0).value()->node()->target() == "aten::t";
    if (!cast && !(t->is_call() && t->target() == "aten::t" && t->arg(0).is_value())) continue;
    if (!x->has_meta() || !transposed->has_meta() || x->meta().sizes.size() != 2 ||
        transposed->meta().sizes.size() != 2 || logits->meta().sizes.size() != 2 ||
        logits->meta().sizes[0] * logits->meta().sizes[1] != log_probs->meta().sizes[0] * log_probs->meta().sizes[1] ||
        logits->meta().sizes[1] != log_probs->meta().sizes[1])
      continue;
    Node* untransposed = nullptr;
    Node* fused = nullptr;
    {
      Graph::InsertGuard here(graph, nll);
      Value* weight = t->arg(0).value();
      if (cast) {
        untransposed = graph.add_call("aten::t", {transposed});
        infer_meta(*untransposed);
        weight = untransposed->result();
      }
      fused = graph.add_call(
          "crucible::linear_cross_entropy",
          {x, weight, bias ? Argument(bias) : Argument(c10::IValue()), nll->arg(1).value(), nll->arg(4).constant()});
    }
    infer_meta(*fused);
    if (!fused->result()->has_meta() || !(fused->result()->meta() == nll->result(0)->meta())) {
      graph.erase(fused);
      if (untransposed) graph.erase(untransposed);
      continue;
    }
    fused->set_source(nll->source());
    for (const std::string& tag : nll->tags()) fused->add_tag(tag);
    nll->result(0)->replace_all_uses_with(fused->result());
    ++rewrites;
  }
  if (rewrites) eliminate_dead_code(graph);
  return rewrites;
}

}  // namespace crucible::ir

TORCH_LIBRARY_FRAGMENT(crucible, m) {
  m.def(
      "linear_cross_entropy(Tensor input, Tensor weight, Tensor? bias, Tensor target, int ignore_index=-100) -> "
      "Tensor");
  m.def(
      "linear_cross_entropy_forward(Tensor input, Tensor weight, Tensor? bias, Tensor target, int ignore_index) -> "
      "(Tensor, Tensor, Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(crucible, CompositeExplicitAutograd, m) {
  m.impl("linear_cross_entropy_forward", &crucible::ir::forward_kernel);
  m.impl("linear_cross_entropy", &crucible::ir::loss_below_autograd);
}
TORCH_LIBRARY_IMPL(crucible, Meta, m) { m.impl("linear_cross_entropy_forward", &crucible::ir::meta_kernel); }
TORCH_LIBRARY_IMPL(crucible, Autograd, m) { m.impl("linear_cross_entropy", &crucible::ir::loss_with_autograd); }
