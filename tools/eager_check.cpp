#include "eager_check.h"

#include <crucible/autograd/aot_module.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace crucible::tools {

namespace {

std::vector<at::Tensor> grads_of(const torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : m.parameters()) out.push_back(p.grad().defined() ? p.grad().detach() : at::Tensor());
  return out;
}

std::vector<at::Tensor> params_of(const torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : m.parameters()) out.push_back(p.detach());
  return out;
}

// runtime::same over two lists, naming the parameter where it fails.
runtime::SameResult same_by_name(const std::vector<at::Tensor>& eager, const std::vector<at::Tensor>& compiled,
                                 const std::vector<at::Tensor>& reference, const torch::nn::Module& names) {
  const auto named = names.named_parameters();
  for (size_t i = 0; i < eager.size(); ++i) {
    runtime::SameResult r = runtime::same(eager[i], compiled[i], {}, reference[i]);
    if (!r) return {false, named[i].key() + ": " + r.reason};
  }
  return {};
}

}  // namespace

models::Model copy_of(const std::string& name, const std::string& size, const models::Model& from, at::Device device,
                      at::ScalarType dtype) {
  models::Model copy = models::make_model(name, size);
  copy.module->to(device, dtype);
  models::copy_state(*from.module, *copy.module);
  copy.module->train();
  return copy;
}

std::vector<at::Tensor> compiled_gradients(const pipeline::Builder& builder, const std::string& model_name,
                                           const std::string& size, const models::Model& model,
                                           const data::Batch& batch) {
  const at::Tensor first = model.module->parameters().front();
  models::Model copy = copy_of(model_name, size, model, first.device(), first.scalar_type());
  autograd::AotModule loss = builder.compile(copy.module, [forward = copy.forward, loss_fn = copy.loss](
                                                              torch::nn::Module&, const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{loss_fn(forward(in.at(0)), in.at(1))};
  });
  at::AutoGradMode grad_on(true);
  loss({batch.inputs, batch.targets}).at(0).backward();
  return grads_of(*copy.module);
}

data::Batch in_float64(const data::Batch& batch) {
  return {at::isFloatingType(batch.inputs.scalar_type()) ? batch.inputs.to(at::kDouble) : batch.inputs, batch.targets};
}

OneStepAgreement compare_one_step(const at::Tensor& compiled_loss, const at::Tensor& eager_loss,
                                  const at::Tensor& reference_loss, const std::vector<at::Tensor>& compiled_grads,
                                  const torch::nn::Module& compiled, const torch::nn::Module& eager,
                                  const torch::nn::Module& reference) {
  OneStepAgreement a;
  a.loss = runtime::same(eager_loss, compiled_loss, {}, reference_loss);
  if (!a.loss) a.loss.reason = "loss: " + a.loss.reason;
  a.gradients = same_by_name(grads_of(eager), compiled_grads, grads_of(reference), eager);
  a.parameters = same_by_name(params_of(eager), params_of(compiled), params_of(reference), eager);
  return a;
}

double loss_curve_difference(const std::vector<double>& compiled, const std::vector<double>& eager) {
  const size_t n = std::min(compiled.size(), eager.size());
  const size_t windows = std::min<size_t>(10, n), width = windows ? n / windows : 0;
  double worst = 0;
  for (size_t w = 0; w < windows; ++w) {
    const size_t begin = w * width, end = w + 1 == windows ? n : begin + width;
    double c = 0, e = 0;
    for (size_t i = begin; i < end; ++i) {
      c += compiled[i];
      e += eager[i];
    }
    worst = std::max(worst, std::abs(c - e) / std::max(std::abs(e), 1e-12));
  }
  return worst;
}

}  // namespace crucible::tools
