// Reads torch::optim's options; kept apart from optim.cpp because its headers pull in
// torch::nn and the serializer.
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

}  // namespace crucible::pipeline
