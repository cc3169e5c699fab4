// See Note [Traceable optimizer state] in optim.h.
#include <crucible/pipeline/error.h>
#include <crucible/pipeline/optim.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace crucible::pipeline {
namespace {

const char* kind_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::SGD:
      return "SGD";
    case OptimizerKind::Adam:
      return "Adam";
    case OptimizerKind::AdamW:
      return "AdamW";
  }
  return "?";
}

bool uses_momentum(const OptimizerOptions& o) { return o.kind == OptimizerKind::SGD && o.momentum != 0; }
bool uses_moments(const OptimizerOptions& o) { return o.kind != OptimizerKind::SGD; }
bool uses_max(const OptimizerOptions& o) { return uses_moments(o) && o.amsgrad; }

void check_lengths(const char* fn, at::TensorList params, at::TensorList grads, const OptimizerState& state) {
  if (grads.size() != params.size() || state.params.size() != params.size())
    throw PipelineError(std::string(fn) + ": " + std::to_string(params.size()) + " parameters, " +
                        std::to_string(grads.size()) + " gradients and " + std::to_string(state.params.size()) +
                        " parameter states; pass one of each per parameter (init_optimizer_state makes the states)");
}

void check_lr(const char* fn, const at::Tensor& lr) {
  if (!lr.defined() || lr.dim() != 0 || lr.scalar_type() != at::kDouble)
    throw PipelineError(std::string(fn) + ": the learning rate must be a 0-dim float64 tensor (see lr_tensor)");
}

}  // namespace

std::vector<at::Tensor> OptimizerState::flat() const {
  std::vector<at::Tensor> out;
  for (const ParamState& s : params)
    for (const at::Tensor* t : {&s.step, &s.momentum_buffer, &s.exp_avg, &s.exp_avg_sq, &s.max_exp_avg_sq})
      if (t->defined()) out.push_back(*t);
  return out;
}

std::vector<std::string> OptimizerState::field_names(const OptimizerOptions& options) {
  std::vector<std::string> names = {"step"};
  if (uses_momentum(options)) names.push_back("momentum_buffer");
  if (uses_moments(options)) {
    names.push_back("exp_avg");
    names.push_back("exp_avg_sq");
  }
  if (uses_max(options)) names.push_back("max_exp_avg_sq");
  return names;
}

OptimizerState OptimizerState::from_flat(const OptimizerOptions& options, size_t num_params,
                                         const std::vector<at::Tensor>& flat) {
  const size_t per_param = field_names(options).size();
  if (flat.size() != per_param * num_params)
    throw PipelineError("OptimizerState::from_flat: " + std::string(kind_name(options.kind)) +
                        " with these options keeps " + std::to_string(per_param) + " state tensors per parameter, so " +
                        std::to_string(num_params) + " parameters need " + std::to_string(per_param * num_params) +
                        ", not " + std::to_string(flat.size()));
  OptimizerState state;
  auto it = flat.begin();
  for (size_t i = 0; i < num_params; ++i) {
    ParamState s;
    s.step = *it++;
    if (uses_momentum(options)) s.momentum_buffer = *it++;
    if (uses_moments(options)) {
      s.exp_avg = *it++;
      s.exp_avg_sq = *it++;
    }
    if (uses_max(options)) s.max_exp_avg_sq = *it++;
    state.params.push_back(std::move(s));
  }
  return state;
}

OptimizerState init_optimizer_state(const OptimizerOptions& options, at::TensorList params) {
  c10::NoGradGuard no_grad;
  OptimizerState state;
  for (const at::Tensor& p : params) {
    ParamState s;
    // On the CPU unless capturable: Note [Traceable optimizer state].
    s.step = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(options.capturable ? p.device() : c10::kCPU));
    auto zeros = [&] { return at::zeros_like(p, at::MemoryFormat::Preserve); };
    if (uses_momentum(options)) s.momentum_buffer = zeros();
    if (uses_moments(options)) {
      s.exp_avg = zeros();
      s.exp_avg_sq = zeros();
    }
    if (uses_max(options)) s.max_exp_avg_sq = zeros();
    state.params.push_back(std::move(s));
  }
  return state;
}

at::Tensor lr_tensor(double lr, c10::Device device) {
  return at::scalar_tensor(lr, at::TensorOptions().dtype(at::kDouble).device(device));
}

void sgd_step(const OptimizerOptions& o, at::TensorList params, at::TensorList grads, OptimizerState& state,
              const at::Tensor& lr) {
  if (o.kind != OptimizerKind::SGD)
    throw PipelineError(std::string("sgd_step: the options are ") + kind_name(o.kind) + "'s; call optimizer_step");
  check_lengths("sgd_step", params, grads, state);
  check_lr("sgd_step", lr);
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    if (!grads[i].defined()) continue;
    ParamState& s = state.params[i];
    at::Tensor d_p = grads[i];
    if (o.weight_decay != 0) d_p = d_p.add(p, o.weight_decay);
    if (o.momentum != 0) {
      at::Tensor& buf = s.momentum_buffer;
      // torch::optim starts the buffer as a clone of d_p on the first step;
      // here that branch is data: where(step == 0, ...), needed only with
      // dampening (see Note [Traceable optimizer state]).
      if (o.dampening == 0) {
        buf.mul_(o.momentum).add_(d_p);
      } else {
        at::Tensor later = buf.mul(o.momentum).add_(d_p, 1 - o.dampening);
        buf.copy_(at::where(s.step.eq(0), d_p, later));
      }
      d_p = o.nesterov ? d_p.add(buf, o.momentum) : buf;
    }
    // p.add_(d_p, -lr) with alpha as a tensor: addcmul computes p + d_p * alpha
    // in the same single fused operation add's kernel uses for a Scalar alpha.
    p.addcmul_(d_p, lr.neg().to(p.scalar_type()));
    s.step.add_(1);
  }
}

void adam_step(const OptimizerOptions& o, at::TensorList params, at::TensorList grads, OptimizerState& state,
               const at::Tensor& lr) {
  if (o.kind == OptimizerKind::SGD) throw PipelineError("adam_step: the options are SGD's; call optimizer_step");
  check_lengths("adam_step", params, grads, state);
  check_lr("adam_step", lr);
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    if (!grads[i].defined()) continue;
    ParamState& s = state.params[i];
    at::Tensor grad = grads[i];
    if (o.kind == OptimizerKind::AdamW && o.weight_decay != 0) p.mul_(at::rsub(lr.mul(o.weight_decay), 1));

    s.step.add_(1);
    at::Tensor bias_correction1 = at::rsub(at::pow(o.beta1, s.step), 1);
    at::Tensor bias_correction2 = at::rsub(at::pow(o.beta2, s.step), 1);
    if (o.kind == OptimizerKind::Adam && o.weight_decay != 0) grad = grad.add(p, o.weight_decay);

    s.exp_avg.mul_(o.beta1).add_(grad, 1 - o.beta1);
    s.exp_avg_sq.mul_(o.beta2).addcmul_(grad, grad, 1 - o.beta2);
    at::Tensor second = s.exp_avg_sq;
    if (o.amsgrad) {
      at::max_out(s.max_exp_avg_sq, s.exp_avg_sq, s.max_exp_avg_sq);
      second = s.max_exp_avg_sq;
    }
    at::Tensor denom = (second.sqrt() / bias_correction2.sqrt()).add_(o.eps);
    // torch::optim: p.addcdiv_(exp_avg, denom, -step_size) with a host
    // step_size, which addcdiv takes only as a Scalar. Its kernels round
    // differently per device, so each is reproduced with tensor operands:
    // the CPU computes p + (-step_size * exp_avg) / denom, CUDA computes
    // fma(-step_size, exp_avg / denom, p), which is what addcmul_ computes for
    // value 1 and a CPU scalar as its second tensor (ATen's pointwise_op_impl).
    // In place on p, addcdiv_ computes in its operands' common dtype: the
    // float32 state of a parameter converted to float64 since (module->to())
    // is widened before it is multiplied, as there.
    const at::ScalarType common =
        at::promote_types(p.scalar_type(), at::promote_types(s.exp_avg.scalar_type(), denom.scalar_type()));
    const at::Tensor exp_avg = s.exp_avg.scalar_type() == common ? s.exp_avg : s.exp_avg.to(common);
    at::Tensor step_size = lr / bias_correction1;
    if (o.device_type.value_or(p.device().type()) == c10::kCUDA)
      p.addcmul_(exp_avg / denom, step_size.neg());
    else
      p.addcdiv_(exp_avg.mul(step_size.neg()), denom);
  }
}

void optimizer_step(const OptimizerOptions& options, at::TensorList params, at::TensorList grads, OptimizerState& state,
                    const at::Tensor& lr) {
  if (options.kind == OptimizerKind::SGD)
    sgd_step(options, params, grads, state, lr);
  else
    adam_step(options, params, grads, state, lr);
}

}  // namespace crucible::pipeline
