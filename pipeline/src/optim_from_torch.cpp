// Reads torch::optim's options; kept apart from optim.cpp because its headers
// pull in torch::nn and the serializer.
#include <crucible/pipeline/error.h>
#include <crucible/pipeline/optim.h>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

namespace crucible::pipeline {
namespace {

template <typename TorchOptions>
const TorchOptions& shared_options(const torch::optim::Optimizer& optimizer, const char* name) {
  const auto& groups = optimizer.param_groups();
  if (groups.empty()) throw PipelineError(std::string("optimizer_options_from: the ") + name + " has no parameter groups");
  const auto& first = static_cast<const TorchOptions&>(groups.front().options());
  for (const auto& g : groups)
    if (!(static_cast<const TorchOptions&>(g.options()) == first))
      throw PipelineError(std::string("optimizer_options_from: the ") + name +
                          "'s parameter groups have different options; a traceable step supports one set "
                          "(use one group, or one optimizer per group)");
  return first;
}

}  // namespace

OptimizerOptions optimizer_options_from(const torch::optim::Optimizer& optimizer) {
  OptimizerOptions o;
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) {
    const auto& t = shared_options<torch::optim::SGDOptions>(optimizer, "SGD");
    o.kind = OptimizerKind::SGD;
    o.lr = t.lr();
    o.momentum = t.momentum();
    o.dampening = t.dampening();
    o.nesterov = t.nesterov();
    o.weight_decay = t.weight_decay();
  } else if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) {
    const auto& t = shared_options<torch::optim::AdamOptions>(optimizer, "Adam");
    o.kind = OptimizerKind::Adam;
    o.lr = t.lr();
    std::tie(o.beta1, o.beta2) = t.betas();
    o.eps = t.eps();
    o.weight_decay = t.weight_decay();
    o.amsgrad = t.amsgrad();
  } else if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) {
    const auto& t = shared_options<torch::optim::AdamWOptions>(optimizer, "AdamW");
    o.kind = OptimizerKind::AdamW;
    o.lr = t.lr();
    std::tie(o.beta1, o.beta2) = t.betas();
    o.eps = t.eps();
    o.weight_decay = t.weight_decay();
    o.amsgrad = t.amsgrad();
  } else {
    throw PipelineError(
        "optimizer_options_from: only torch::optim::SGD, Adam and AdamW have traceable updates "
        "(see crucible/pipeline/optim.h); this optimizer is none of them");
  }
  return o;
}

}  // namespace crucible::pipeline
