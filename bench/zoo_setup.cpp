#include "zoo_setup.h"

#include <crucible/pipeline/builder.h>
#include <crucible/tracer/functional_call.h>

#include <torch/nn/module.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

namespace crucible::bench {

int64_t bench_batch(const std::string& model) { return model == "mlp" || model == "convnet" ? 32 : 8; }

ZooSetup::ZooSetup(const std::string& name)
    : ZooSetup((torch::manual_seed(0), models::make_model(name)), bench_batch(name)) {}

ZooSetup::ZooSetup(models::Model m, int64_t batch_size) : model(std::move(m)) {
  model.module->train();
  const data::Batch b = model.example_batch(batch_size, /*seed=*/0);
  batch = {b.inputs, b.targets};
  optimizer =
      std::make_unique<torch::optim::SGD>(model.module->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
}

ZooSetup::~ZooSetup() = default;

pipeline::LossFn ZooSetup::loss() const { return models::loss_of(model); }

tracer::TraceResult ZooSetup::trace_forward(bool functionalize) const {
  tracer::ModuleTraceOptions options;
  options.trace.functionalize = functionalize;
  return tracer::functional_call(
      *model.module,
      [this](torch::nn::Module&, const std::vector<at::Tensor>& in) {
        return std::vector<at::Tensor>{model.forward(in[0])};
      },
      {batch[0]}, options);
}

tracer::TraceResult ZooSetup::trace_joint() const {
  tracer::ModuleTraceOptions options;
  options.trace.functionalize = true;
  options.gradients_as_outputs = true;
  return tracer::functional_call(
      *model.module,
      [this](torch::nn::Module&, const std::vector<at::Tensor>& in) {
        at::Tensor loss = model.loss(model.forward(in[0]), in[1]);
        loss.backward();
        return std::vector<at::Tensor>{loss.detach()};
      },
      batch, options);
}

pipeline::TrainStep ZooSetup::unoptimized_step() const {
  pipeline::Builder b;
  b.backend("interpreter").passes({});
  pipeline::TrainStep step = b.compile_train_step(model.module, *optimizer, loss());
  step.compile(batch);
  return step;
}

}  // namespace crucible::bench
