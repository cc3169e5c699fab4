// See Note [Train step graph] in train_step.h.
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/error.h>
#include <crucible/pipeline/train_step.h>
#include <crucible/pipeline/zoo.h>

#include <crucible/autograd/aot_module.h>
#include <crucible/autograd/detail/input_guards.h>
#include <crucible/autograd/detail/rng_state_guard.h>
#include <crucible/runtime/lifted_inputs.h>
#include <crucible/tracer/functional_call.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace crucible::pipeline {
namespace {

}  // namespace

LossFn loss_of(const Model& model) {
  return [forward = model.forward, loss = model.loss](torch::nn::Module&, const std::vector<at::Tensor>& batch) {
    return loss(forward(batch.at(0)), batch.at(1));
  };
}

namespace detail {

struct TrainStepState {
  std::shared_ptr<torch::nn::Module> module;
  torch::optim::Optimizer* optimizer = nullptr;
  LossFn loss_fn;
  Builder builder;
  OptimizerOptions options;
  std::vector<at::Tensor> params;  // the optimizer's parameters, in its order
  std::vector<std::string> param_names;
  OptimizerState optimizer_state;
  std::vector<at::Tensor> flat_state;
  at::Tensor lr;  // float64 0-dim on the CPU (lr_tensor)
  double lr_value = 0;

  struct Entry {
    ir::Graph graph;
    ir::CompiledFn fn;
    // Tensors the loss reads from outside the module (Note [Lifted tensors]):
    // the last placeholders; their gradients, where the step computes some,
    // are the outputs after the loss.
    runtime::LiftedInputs lifted;
    std::vector<size_t> grad_of;  // per output after the loss: which lifted tensor
  };
  std::mutex mu;
  // One compilation per guard set: every input's metadata and aliasing (the
  // lifted tensors' too, which must still exist), and the training flag of
  // every submodule (Note [AOT cache guards]).
  std::vector<std::pair<autograd::detail::InputGuards, std::shared_ptr<Entry>>> cache;
  std::shared_ptr<Entry> latest;

  // Every input of the graph, in placeholder order: the module's parameters
  // and buffers as functional_call lifts them, detached (aliases the graph
  // writes through), the optimizer state, the rate, the batch.
  std::vector<at::Tensor> graph_inputs(const std::vector<at::Tensor>& batch) const {
    std::vector<at::Tensor> in = autograd::module_state(*module);
    for (at::Tensor& t : in) t = t.detach();
    in.insert(in.end(), flat_state.begin(), flat_state.end());
    in.push_back(lr);
    in.insert(in.end(), batch.begin(), batch.end());
    return in;
  }

  void update_lr() {
    const auto& groups = optimizer->param_groups();
    const double lr0 = groups.front().options().get_lr();
    for (const auto& g : groups)
      if (g.options().get_lr() != lr0)
        throw PipelineError("TrainStep: the optimizer's parameter groups have different learning rates (" +
                            std::to_string(lr0) + " and " + std::to_string(g.options().get_lr()) +
                            "); a compiled step updates every parameter with one rate: give the groups one rate, "
                            "or use one optimizer per group");
    if (lr0 != lr_value) {
      lr.fill_(lr0);
      lr_value = lr0;
    }
  }

  std::shared_ptr<Entry> compile(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& batch) {
    autograd::detail::RngStateGuard restore_generators;
    at::AutoGradMode grad_on(true);
    const size_t num_flat = flat_state.size();
    const size_t num_params = params.size();
    const OptimizerOptions o = options;
    const std::vector<at::Tensor>& ps = params;
    const LossFn& loss = loss_fn;
    // The step as functional_call traces it: `in` = flat state, lr, batch.
    tracer::ModuleFn fn = [&](torch::nn::Module& m, const std::vector<at::Tensor>& in) {
      const std::vector<at::Tensor> flat(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(num_flat));
      OptimizerState st = OptimizerState::from_flat(o, num_params, flat);
      const std::vector<at::Tensor> b(in.begin() + static_cast<std::ptrdiff_t>(num_flat) + 1, in.end());
      at::Tensor l = loss(m, b);
      if (!l.defined() || l.dim() != 0)
        throw PipelineError("compile_train_step: the loss function must return a 0-dim tensor; it returned " +
                            (l.defined() ? "sizes " + c10::str(l.sizes()) : std::string("an undefined tensor")));
      l.backward();
      std::vector<at::Tensor> grads;
      for (const at::Tensor& p : ps) grads.push_back(p.grad());
      optimizer_step(o, ps, grads, st, in[num_flat]);
      return std::vector<at::Tensor>{l.detach()};
    };
    std::vector<at::Tensor> examples = flat_state;
    examples.push_back(lr);
    examples.insert(examples.end(), batch.begin(), batch.end());

    auto entry = std::make_shared<Entry>();
    tracer::TraceResult traced = builder.trace("train_step", [&](const tracer::TraceOptions& trace_options) {
      tracer::ModuleTraceOptions options;
      options.trace = trace_options;
      options.trace.functionalize = false;  // See Note [Train step graph].
      tracer::TraceResult r = tracer::functional_call(*module, fn, examples, options);
      name_inputs(r.graph, inputs.size() - examples.size());
      r.graph.signature().outputs.at(0) = ir::OutputSpec{ir::OutputKind::Loss, std::nullopt};
      return r;
    });
    entry->graph = std::move(traced.graph);
    std::vector<at::Tensor> lifted;
    std::vector<std::string> names;
    for (const tracer::LiftedTensor& l : traced.lifted) {
      lifted.push_back(l.tensor);
      names.push_back(entry->graph.signature().inputs.at(l.input_index).target);
    }
    entry->lifted = runtime::LiftedInputs(lifted, names);
    const size_t first_lifted = inputs.size();
    const std::vector<ir::OutputSpec>& specs = entry->graph.signature().outputs;
    for (size_t o = 1; o < specs.size(); ++o)
      entry->grad_of.push_back(specs[o].input_index.value() - first_lifted);  // Gradient outputs only
    builder.run_passes(entry->graph, "train_step");
    std::vector<at::Tensor> examples_all = inputs;
    for (const at::Tensor& l : lifted) examples_all.push_back(l.detach());
    entry->fn = builder.run_backend(entry->graph, examples_all, "train_step");
    return entry;
  }

  // Marks the optimizer state and the learning rate as State inputs with
  // readable names (functional_call names its extra inputs arg0, arg1, ...).
  void name_inputs(ir::Graph& g, size_t num_module_tensors) const {
    const std::vector<ir::Value*> ph = g.placeholders();
    const std::vector<std::string> per_param = OptimizerState::field_names(options);
    size_t i = num_module_tensors;
    auto mark = [&](const std::string& target) {
      g.signature().inputs.at(i) = ir::InputSpec{ir::InputKind::State, target, std::nullopt};
      g.rename(ph.at(i), g.unique_name(target));
      ++i;
    };
    for (const std::string& param : param_names)
      for (const std::string& s : per_param) mark(param + "." + s);
    mark("lr");
    for (size_t b = 0; i < ph.size() && g.signature().inputs[i].kind == ir::InputKind::UserInput; ++b, ++i)
      g.rename(ph[i], g.unique_name("batch" + std::to_string(b)));
  }

  // The compilation for `inputs`, and `inputs` extended with its lifted tensors.
  std::shared_ptr<Entry> entry_for(std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& batch) {
    const std::vector<bool> flags = autograd::detail::training_flags(*module);
    const size_t n = inputs.size();
    std::lock_guard lock(mu);
    // The graph runs under no_grad whatever the caller's mode: guard it as off.
    for (const auto& [guards, entry] : cache) {
      if (!entry->lifted.append_to(inputs)) continue;
      if (guards.check(inputs, /*grad_enabled=*/false, flags)) return latest = entry;
      inputs.resize(n);
    }
    std::shared_ptr<Entry> entry = compile(inputs, batch);
    if (!entry->lifted.append_to(inputs))
      throw PipelineError("TrainStep: " + entry->lifted.freed() + " while the step was compiled");
    cache.emplace_back(autograd::detail::InputGuards(inputs, /*grad_enabled=*/false, flags), entry);
    return latest = entry;
  }
};

}  // namespace detail

at::Tensor TrainStep::operator()(const std::vector<at::Tensor>& batch) const {
  detail::TrainStepState& s = *state_;
  std::vector<at::Tensor> inputs = s.graph_inputs(batch);
  const size_t num_inputs = inputs.size();
  std::shared_ptr<detail::TrainStepState::Entry> entry = s.entry_for(inputs, batch);
  s.update_lr();
  at::NoGradGuard no_grad;
  // The lifted tensors as the module's own: detached aliases the graph
  // writes through (a buffer of another module), their .grad kept here.
  std::vector<at::Tensor> lifted(inputs.begin() + static_cast<std::ptrdiff_t>(num_inputs), inputs.end());
  for (size_t k = num_inputs; k < inputs.size(); ++k) inputs[k] = inputs[k].detach();
  std::vector<at::Tensor> outs = entry->fn(inputs);
  // Gradients of lifted tensors accumulate into their .grad, as eager's
  // backward does (the optimizer updates only the module's own parameters).
  for (size_t o = 1; o < outs.size(); ++o) {
    const at::Tensor& t = lifted.at(entry->grad_of.at(o - 1));
    if (t.grad().defined())
      t.mutable_grad().add_(outs[o]);
    else
      t.mutable_grad() = outs[o].detach();
  }
  return outs.at(0);
}

void TrainStep::compile(const std::vector<at::Tensor>& batch) const {
  std::vector<at::Tensor> inputs = state_->graph_inputs(batch);
  state_->entry_for(inputs, batch);
}

size_t TrainStep::num_compilations() const {
  std::lock_guard lock(state_->mu);
  return state_->cache.size();
}

const ir::Graph& TrainStep::graph() const {
  std::lock_guard lock(state_->mu);
  if (!state_->latest)
    throw PipelineError("TrainStep::graph: nothing is compiled yet; call the step or TrainStep::compile first");
  return state_->latest->graph;
}

std::vector<at::Tensor> TrainStep::graph_inputs(const std::vector<at::Tensor>& batch) const {
  std::vector<at::Tensor> inputs = state_->graph_inputs(batch);
  std::lock_guard lock(state_->mu);
  if (state_->latest) {
    const size_t n = inputs.size();
    if (!state_->latest->lifted.append_to(inputs))
      throw PipelineError("TrainStep::graph_inputs: " + state_->latest->lifted.freed());
    for (size_t k = n; k < inputs.size(); ++k) inputs[k] = inputs[k].detach();
  }
  return inputs;
}

const OptimizerOptions& TrainStep::optimizer_options() const { return state_->options; }
const OptimizerState& TrainStep::optimizer_state() const { return state_->optimizer_state; }

TrainStep compile_train_step(std::shared_ptr<torch::nn::Module> module, torch::optim::Optimizer& optimizer,
                             LossFn loss_fn, const Builder& builder) {
  if (!module) throw PipelineError("compile_train_step: the module is null");
  if (!loss_fn) throw PipelineError("compile_train_step: the loss function is empty");
  auto s = std::make_shared<detail::TrainStepState>();
  s->options = optimizer_options_from(optimizer);
  std::unordered_map<const c10::TensorImpl*, std::string> module_params;
  for (const auto& p : module->named_parameters(/*recurse=*/true))
    module_params.emplace(p.value().unsafeGetTensorImpl(), p.key());
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& group : optimizer.param_groups())
    for (const at::Tensor& p : group.params()) {
      auto it = module_params.find(p.unsafeGetTensorImpl());
      if (it == module_params.end())
        throw PipelineError("compile_train_step: the optimizer updates a tensor of sizes " + c10::str(p.sizes()) +
                            " that is not a parameter of the module; build the optimizer over module->parameters()");
      if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
      s->params.push_back(p);
      s->param_names.push_back(it->second);
    }
  if (s->params.empty()) throw PipelineError("compile_train_step: the optimizer has no parameters");
  s->module = std::move(module);
  s->optimizer = &optimizer;
  s->loss_fn = std::move(loss_fn);
  s->builder = builder;
  s->optimizer_state = optimizer_state_from(optimizer, s->options, s->params);
  s->flat_state = s->optimizer_state.flat();
  s->lr = lr_tensor(s->options.lr);  // on the CPU, as the step count: Note [Traceable optimizer state]
  s->lr_value = s->options.lr;
  TrainStep step;
  step.state_ = std::move(s);
  return step;
}

TrainStep compile_train_step(std::shared_ptr<torch::nn::Module> module, torch::optim::Optimizer& optimizer,
                             LossFn loss_fn) {
  return compile_train_step(std::move(module), optimizer, std::move(loss_fn), Builder());
}

}  // namespace crucible::pipeline
