// Reads torch::optim's options and state; kept apart from optim.cpp because its headers
// pull in torch::nn and the serializer.
#include <crucible/pipeline/error.h>
#include <crucible/pipeline/optim.h>

#include <c10/util/Type.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <string>
#include <tuple>
#include <typeinfo>
#include <vector>

namespace crucible::pipeline {
namespace {

// A param group's options, as OptimizerOptions.
OptimizerOptions convert(const torch::optim::SGDOptions& t) {
  OptimizerOptions o;
  o.kind = OptimizerKind::SGD;
  o.lr = t.lr();
  o.momentum = t.momentum();
  o.dampening = t.dampening();
  o.nesterov = t.nesterov();
  o.weight_decay = t.weight_decay();
  return o;
}

template <typename AdamOptions>
OptimizerOptions convert_adam(const AdamOptions& t, OptimizerKind kind) {
  OptimizerOptions o;
  o.kind = kind;
  o.lr = t.lr();
  std::tie(o.beta1, o.beta2) = t.betas();
  o.eps = t.eps();
  o.weight_decay = t.weight_decay();
  o.amsgrad = t.amsgrad();
  return o;
}

OptimizerOptions convert(const torch::optim::AdamOptions& t) { return convert_adam(t, OptimizerKind::Adam); }
OptimizerOptions convert(const torch::optim::AdamWOptions& t) { return convert_adam(t, OptimizerKind::AdamW); }

template <typename TorchOptions>
std::vector<OptimizerOptions> convert_groups(const torch::optim::Optimizer& optimizer, const char* name) {
  if (optimizer.param_groups().empty()) throw PipelineError(std::string("the ") + name + " has no parameter groups");
  std::vector<OptimizerOptions> out;
  for (const auto& g : optimizer.param_groups()) out.push_back(convert(static_cast<const TorchOptions&>(g.options())));
  return out;
}

}  // namespace

std::vector<OptimizerOptions> optimizer_group_options(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer))
    return convert_groups<torch::optim::SGDOptions>(optimizer, "SGD");
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer))
    return convert_groups<torch::optim::AdamOptions>(optimizer, "Adam");
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer))
    return convert_groups<torch::optim::AdamWOptions>(optimizer, "AdamW");
  throw PipelineError(c10::demangle(typeid(optimizer).name()) +
                      " has no traceable update: only torch::optim::SGD, Adam and AdamW have one (see "
                      "crucible/pipeline/optim.h); train with one of them, or run this optimizer eagerly");
}

OptimizerOptions optimizer_options_from(const torch::optim::Optimizer& optimizer) {
  const std::vector<OptimizerOptions> groups = optimizer_group_options(optimizer);
  for (const OptimizerOptions& g : groups)
    if (!(g == groups.front()))
      throw PipelineError(
          "optimizer_options_from: the optimizer's parameter groups have different options; one set was asked "
          "for (optimizer_group_options gives each group's)");
  return groups.front();
}

namespace {

// A copy of torch's state tensor `t` for parameter `i`, or `fresh` when torch has none.
at::Tensor copy_of(const at::Tensor& t, const at::Tensor& fresh, const at::Tensor& param, size_t i, const char* what) {
  if (!t.defined()) return fresh;
  if (t.sizes() != param.sizes())
    throw PipelineError("optimizer_state_from: the optimizer's " + std::string(what) + " of parameter " +
                        std::to_string(i) + " has sizes " + c10::str(t.sizes()) + " but the parameter has " +
                        c10::str(param.sizes()) + "; was the optimizer's state loaded for another model?");
  return t.detach().clone(at::MemoryFormat::Preserve);
}

}  // namespace

OptimizerState optimizer_state_from(const torch::optim::Optimizer& optimizer, const OptimizerOptions& options,
                                    at::TensorList params) {
  OptimizerState state = init_optimizer_state(options, params);
  const auto& torch_state = optimizer.state();
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = torch_state.find(params[i].unsafeGetTensorImpl());
    if (it == torch_state.end()) continue;
    ParamState& s = state.params[i];
    if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(it->second.get())) {
      if (s.momentum_buffer.defined() && sgd->momentum_buffer().defined()) {
        s.momentum_buffer = copy_of(sgd->momentum_buffer(), s.momentum_buffer, params[i], i, "momentum_buffer");
        s.step.fill_(1);
      }
      continue;
    }
    auto copy_adam = [&](const auto& adam) {
      s.step.fill_(static_cast<double>(adam.step()));
      s.exp_avg = copy_of(adam.exp_avg(), s.exp_avg, params[i], i, "exp_avg");
      s.exp_avg_sq = copy_of(adam.exp_avg_sq(), s.exp_avg_sq, params[i], i, "exp_avg_sq");
      if (s.max_exp_avg_sq.defined())
        s.max_exp_avg_sq = copy_of(adam.max_exp_avg_sq(), s.max_exp_avg_sq, params[i], i, "max_exp_avg_sq");
    };
    if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(it->second.get()))
      copy_adam(*adam);
    else if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(it->second.get()))
      copy_adam(*adamw);
  }
  return state;
}

}  // namespace crucible::pipeline
