// See Note [Train step graph] in train_step.h.
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/error.h>
#include <crucible/pipeline/train_step.h>

#include <crucible/autograd/aot_module.h>
#include <crucible/ir/tensor_meta.h>
#include <crucible/tracer/functional_call.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace crucible::pipeline {

namespace detail {

// What the latest compilation made, kept by the graph compiler of the step.
struct LatestGraph {
  std::mutex mu;
  std::vector<std::unique_ptr<const ir::Graph>> graphs;  // every compilation's, after the passes
  std::vector<at::Tensor> lifted_examples;               // the lifted tensors the latest was given (aliases)
};

// One param group of the optimizer: its options (Note [Train step graph])
// and its learning rate as the graph reads it.
struct StepGroup {
  OptimizerOptions options;
  size_t num_params = 0;  // its parameters follow the previous groups' in TrainStepState::params
  at::Tensor lr;          // float64 0-dim, on the CPU unless capturable (lr_tensor)
  double lr_value = 0;
};

struct TrainStepState {
  std::shared_ptr<torch::nn::Module> module;
  torch::optim::Optimizer* optimizer = nullptr;
  std::vector<StepGroup> groups;
  std::vector<at::Tensor> params;  // the optimizer's parameters, in its order
  OptimizerState optimizer_state;
  std::vector<at::Tensor> flat_state;
  // Per parameter: its layout when compile_train_step made its fresh state
  // (torch::optim had none for it; see follow_params), or nullopt.
  std::vector<std::optional<ir::TensorMeta>> fresh;
  bool stepped = false;                      // a step has run: the state is the graph's own since
  std::vector<std::string> param_names;      // the parameters' names in the module
  std::optional<std::vector<size_t>> hooks;  // per parameter: hooks_of() once first compiled
  std::shared_ptr<LatestGraph> latest = std::make_shared<LatestGraph>();
  std::optional<autograd::AotModule> aot;  // the step, compiled by AOTAutograd (Note [Train step graph])

  // The AOT arguments after the module's state: flat state, rates, batch.
  std::vector<at::Tensor> arguments(const std::vector<at::Tensor>& batch) const {
    std::vector<at::Tensor> in = flat_state;
    for (const StepGroup& g : groups) in.push_back(g.lr);
    in.insert(in.end(), batch.begin(), batch.end());
    return in;
  }

  // torch::optim makes a parameter's state at its first step, with the
  // parameter's dtype, device and layout then. Until a step has run, the
  // fresh state compile_train_step made is made again for a parameter that
  // has changed since (module->to(at::kDouble) or to a GPU after
  // compile_train_step), so that the step neither rounds through the old
  // dtype nor mixes devices. A change is seen in the parameter's layout,
  // not by making its state again (GPT-2's Adam state is a gigabyte).
  void follow_params() {
    if (stepped) return;
    bool remade = false;
    size_t i = 0;
    for (const StepGroup& g : groups)
      for (size_t k = 0; k < g.num_params; ++k, ++i) {
        if (!fresh[i]) continue;
        const ir::TensorMeta now = ir::TensorMeta::of(params[i]);
        const ir::TensorMeta& made = *fresh[i];
        if (now.dtype == made.dtype && now.device == made.device && now.sizes == made.sizes &&
            now.strides == made.strides)
          continue;
        optimizer_state.params[i] = std::move(init_optimizer_state(g.options, {params[i]}).params.front());
        fresh[i] = now;
        remade = true;
      }
    if (remade) flat_state = optimizer_state.flat();
  }

  // A step traces its backward, so the tensor hooks registered on a
  // parameter (Tensor::register_hook) are ops of its graph: one registered or
  // removed later would be silently ignored, so the call refuses it.
  static size_t hooks_of(const at::Tensor& p) {
    const torch::autograd::AutogradMeta* meta = torch::autograd::impl::get_autograd_meta(p);
    if (!meta || !meta->cpp_hooks_list_) return 0;
    return std::count_if(meta->cpp_hooks_list_->begin(), meta->cpp_hooks_list_->end(),
                         [](const auto& hook) { return static_cast<bool>(hook); });  // removed ones are empty
  }
  std::vector<size_t> hooks_now() const {
    std::vector<size_t> now;
    for (const at::Tensor& p : params) now.push_back(hooks_of(p));
    return now;
  }
  void check_hooks() const {
    if (!hooks) return;
    const std::vector<size_t> now = hooks_now();
    for (size_t i = 0; i < params.size(); ++i)
      if (now[i] != (*hooks)[i])
        throw PipelineError("TrainStep: a gradient hook was registered on or removed from the parameter '" +
                            param_names[i] +
                            "' after the step was compiled; the compiled step holds the hooks it traced: "
                            "create a new step with compile_train_step after changing hooks, or rewrite "
                            "gradients with TrainStepOptions::gradient_hook");
  }

  void update_lr() {
    const auto& torch_groups = optimizer->param_groups();
    if (torch_groups.size() != groups.size())
      throw PipelineError("TrainStep: the optimizer has " + std::to_string(torch_groups.size()) +
                          " parameter groups; the step was compiled for " + std::to_string(groups.size()) +
                          " and updates those only: compile a new step for the new groups");
    // The other options are constants of the graph: a change (a momentum
    // or weight decay schedule) would be silently ignored.
    const std::vector<OptimizerOptions> now = optimizer_group_options(*optimizer);
    for (size_t i = 0; i < groups.size(); ++i) {
      OptimizerOptions o = now[i];
      o.lr = groups[i].options.lr;
      o.capturable = groups[i].options.capturable;
      o.device_type = groups[i].options.device_type;
      if (!(o == groups[i].options))
        throw PipelineError("TrainStep: the options of the optimizer's parameter group " + std::to_string(i) +
                            " other than the learning rate (momentum, dampening, weight decay, betas, eps, ...) "
                            "changed since compile_train_step; the compiled step holds them as constants: compile "
                            "a new step for the new options");
    }
    for (size_t i = 0; i < groups.size(); ++i) {
      const double lr = torch_groups[i].options().get_lr();
      if (lr != groups[i].lr_value) {
        groups[i].lr.fill_(lr);
        groups[i].lr_value = lr;
      }
    }
  }
};

// The step as AOTAutograd traces it, over the module and (flat state, rate,
// batch...): Note [Train step graph].
// `groups` gives each group's options and parameter count (their rates are
// inputs).
tracer::ModuleFn step_function(std::vector<StepGroup> groups, std::vector<at::Tensor> params, size_t num_flat,
                               LossFn loss_fn, GradientHook gradient_hook) {
  return [groups = std::move(groups), params = std::move(params), num_flat, loss_fn = std::move(loss_fn),
          gradient_hook = std::move(gradient_hook)](torch::nn::Module& m, const std::vector<at::Tensor>& in) {
    // The compiled call runs under no_grad; the step differentiates itself.
    at::AutoGradMode grad_on(true);
    const std::vector<at::Tensor> batch(in.begin() + static_cast<std::ptrdiff_t>(num_flat + groups.size()), in.end());
    at::Tensor loss = loss_fn(m, batch);
    // One element, as eager's backward() takes without a gradient argument.
    if (!loss.defined() || loss.numel() != 1)
      throw PipelineError(
          "compile_train_step: the loss function must return a tensor of one element (reduce the loss with mean() "
          "or sum()); it returned " +
          (loss.defined() ? "sizes " + c10::str(loss.sizes()) : std::string("an undefined tensor")));
    loss.backward();
    std::vector<at::Tensor> grads;
    for (const at::Tensor& p : params) grads.push_back(p.grad());
    if (gradient_hook) {
      const size_t n = grads.size();
      grads = gradient_hook(std::move(grads));
      if (grads.size() != n)
        throw PipelineError("compile_train_step: the gradient hook returned " + std::to_string(grads.size()) +
                            " gradients for " + std::to_string(n) + " parameters; return one per parameter");
    }
    // Each group's update with its options, state and rate.
    size_t first = 0, flat_first = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      const OptimizerOptions& options = groups[g].options;
      const size_t n = groups[g].num_params;
      const size_t flat_n = n * OptimizerState::field_names(options).size();
      auto flat_begin = in.begin() + static_cast<std::ptrdiff_t>(flat_first);
      OptimizerState state = OptimizerState::from_flat(
          options, n, std::vector<at::Tensor>(flat_begin, flat_begin + static_cast<std::ptrdiff_t>(flat_n)));
      const auto at_first = static_cast<std::ptrdiff_t>(first), at_end = static_cast<std::ptrdiff_t>(first + n);
      optimizer_step(options, std::vector<at::Tensor>(params.begin() + at_first, params.begin() + at_end),
                     std::vector<at::Tensor>(grads.begin() + at_first, grads.begin() + at_end), state,
                     in[num_flat + g]);
      first += n;
      flat_first += flat_n;
    }
    // The gradients stay inside the graph: the parameters end as after zero_grad().
    for (const at::Tensor& p : params) p.mutable_grad().reset();
    return std::vector<at::Tensor>{loss.detach()};
  };
}

// See Note [Pre-grad passes in a training step]: the step whose loss is the
// pre-grad passes' forward graph, run by the interpreter. `flat_args`: the
// compilation's (module state, flat state, rates, batch).
tracer::TensorFn pre_grad_step(const Builder& builder, const std::shared_ptr<torch::nn::Module>& module,
                               const LossFn& loss_fn, const std::vector<StepGroup>& groups,
                               const std::vector<at::Tensor>& params, size_t num_flat,
                               const GradientHook& gradient_hook, const autograd::TraceFn& trace,
                               const std::vector<at::Tensor>& flat_args) {
  const size_t num_state = autograd::module_state(*module).size();
  const auto batch_begin = flat_args.begin() + static_cast<std::ptrdiff_t>(num_state + num_flat + groups.size());
  std::vector<at::Tensor> forward_args(flat_args.begin(), flat_args.begin() + static_cast<std::ptrdiff_t>(num_state));
  forward_args.insert(forward_args.end(), batch_begin, flat_args.end());
  const tracer::TensorFn loss_alone = [module, loss_fn, num_state](const std::vector<at::Tensor>& full) {
    const std::vector<at::Tensor> batch(full.begin() + static_cast<std::ptrdiff_t>(num_state), full.end());
    return std::vector<at::Tensor>{loss_fn(*module, batch)};
  };
  // Traced with grad mode on, as the step runs the loss: at::matmul, for
  // one, decomposes by whether its operands require grad, and ops the loss
  // runs under no_grad are tagged so (Note [Nodes traced under no_grad]).
  at::AutoGradMode grad_on(true);
  tracer::TensorFn forward = builder.pre_grad_function(loss_alone, trace, forward_args);
  LossFn graph_loss = [forward = std::move(forward)](torch::nn::Module& m, const std::vector<at::Tensor>& batch) {
    std::vector<at::Tensor> in = autograd::module_state(m);
    in.insert(in.end(), batch.begin(), batch.end());
    return forward(in).at(0);
  };
  tracer::ModuleFn step = step_function(groups, params, num_flat, std::move(graph_loss), gradient_hook);
  return [module, step = std::move(step), num_state](const std::vector<at::Tensor>& full) {
    return step(*module, std::vector<at::Tensor>(full.begin() + static_cast<std::ptrdiff_t>(num_state), full.end()));
  };
}

// Names the graph's inputs and output as Note [Train step graph] says
// (functional_call names its arguments arg0, arg1, ...).
void name_train_step(ir::Graph& g, size_t num_module_tensors, const std::vector<std::string>& param_names,
                     const std::vector<StepGroup>& groups) {
  const std::vector<ir::Value*> ph = g.placeholders();
  size_t i = num_module_tensors;
  auto mark = [&](const std::string& target) {
    g.signature().inputs.at(i) = ir::InputSpec{ir::InputKind::State, target, std::nullopt};
    g.rename(ph.at(i), g.unique_name(target));
    ++i;
  };
  size_t param = 0;
  for (const StepGroup& group : groups) {
    const std::vector<std::string> per_param = OptimizerState::field_names(group.options);
    for (size_t p = 0; p < group.num_params; ++p, ++param)
      for (const std::string& s : per_param) mark(param_names.at(param) + "." + s);
  }
  for (size_t k = 0; k < groups.size(); ++k) mark(groups.size() == 1 ? "lr" : "lr." + std::to_string(k));
  for (size_t b = 0; i < ph.size() && g.signature().inputs[i].kind == ir::InputKind::UserInput; ++b, ++i)
    g.rename(ph[i], g.unique_name("batch" + std::to_string(b)));
  g.signature().outputs.at(0) = ir::OutputSpec{ir::OutputKind::Loss, std::nullopt};
}

}  // namespace detail

at::Tensor TrainStep::operator()(const std::vector<at::Tensor>& batch) const {
  detail::TrainStepState& s = *state_;
  s.update_lr();
  s.check_hooks();
  s.follow_params();
  at::NoGradGuard no_grad;  // the inference path: one graph, forward to update
  at::Tensor loss = s.aot->operator()(s.arguments(batch)).at(0);
  // The optimizer's parameters end as after zero_grad() (Note [Train step
  // graph]) also where they held a gradient before the step, which it
  // neither reads nor clears: one a GAN's other step accumulated into them,
  // reading them from outside its module. Left there, the next such
  // backward would add to it where eager's zero_grad() starts afresh.
  for (const at::Tensor& p : s.params)
    if (p.grad().defined()) p.mutable_grad().reset();
  s.stepped = true;
  if (!s.hooks) s.hooks = s.hooks_now();
  return loss;
}

void TrainStep::compile(const std::vector<at::Tensor>& batch) const {
  state_->check_hooks();
  state_->follow_params();
  at::NoGradGuard no_grad;
  state_->aot->compile(state_->arguments(batch));
  if (!state_->hooks) state_->hooks = state_->hooks_now();
}

size_t TrainStep::num_compilations() const { return state_->aot->num_compilations(); }

const ir::Graph& TrainStep::graph() const {
  std::lock_guard lock(state_->latest->mu);
  if (state_->latest->graphs.empty())
    throw PipelineError("TrainStep::graph: nothing is compiled yet; call the step or TrainStep::compile first");
  return *state_->latest->graphs.back();
}

std::vector<at::Tensor> TrainStep::graph_inputs(const std::vector<at::Tensor>& batch) const {
  state_->follow_params();
  std::vector<at::Tensor> inputs = autograd::module_state(*state_->module);
  for (at::Tensor& t : inputs) t = t.detach();
  for (const at::Tensor& t : state_->arguments(batch)) inputs.push_back(t);
  std::lock_guard lock(state_->latest->mu);
  inputs.insert(inputs.end(), state_->latest->lifted_examples.begin(), state_->latest->lifted_examples.end());
  return inputs;
}

const OptimizerOptions& TrainStep::optimizer_options() const { return state_->groups.front().options; }
const OptimizerState& TrainStep::optimizer_state() const { return state_->optimizer_state; }

TrainStep compile_train_step(std::shared_ptr<torch::nn::Module> module, torch::optim::Optimizer& optimizer,
                             LossFn loss_fn, const Builder& builder, TrainStepOptions step_options) {
  if (!module) throw PipelineError("compile_train_step: the module is null");
  if (!loss_fn) throw PipelineError("compile_train_step: the loss function is empty");
  auto s = std::make_shared<detail::TrainStepState>();
  const std::vector<OptimizerOptions> group_options = optimizer_group_options(optimizer);
  const bool capturable = step_options.capturable.value_or(builder.backend_cuda_graphs());
  std::vector<std::string> param_names;
  std::unordered_map<const c10::TensorImpl*, std::string> module_params;
  for (const auto& p : module->named_parameters(/*recurse=*/true))
    module_params.emplace(p.value().unsafeGetTensorImpl(), p.key());
  std::unordered_set<const c10::TensorImpl*> seen;
  for (size_t gi = 0; gi < group_options.size(); ++gi) {
    detail::StepGroup group;
    group.options = group_options[gi];
    group.options.capturable = capturable;
    for (const at::Tensor& p : optimizer.param_groups()[gi].params()) {
      auto it = module_params.find(p.unsafeGetTensorImpl());
      if (it == module_params.end())
        throw PipelineError("compile_train_step: the optimizer updates a tensor of sizes " + c10::str(p.sizes()) +
                            " that is not a parameter of the module; build the optimizer over module->parameters()");
      // torch::optim updates a tensor once per listing, with one state: a
      // parameter listed twice takes two steps a call, which one update in
      // the graph would not reproduce.
      if (!seen.insert(p.unsafeGetTensorImpl()).second)
        throw PipelineError("compile_train_step: the optimizer lists the parameter '" + it->second + "' (sizes " +
                            c10::str(p.sizes()) +
                            ") more than once (a submodule registered under two names, or a param group that "
                            "repeats it), so torch::optim would update it more than once a step; give the "
                            "optimizer each parameter once");
      s->params.push_back(p);
      param_names.push_back(it->second);
      s->param_names.push_back(it->second);
      ++group.num_params;
    }
    const std::vector<at::Tensor> group_params(s->params.end() - static_cast<std::ptrdiff_t>(group.num_params),
                                               s->params.end());
    for (ParamState& ps : optimizer_state_from(optimizer, group.options, group_params).params)
      s->optimizer_state.params.push_back(std::move(ps));
    for (const at::Tensor& p : group_params)
      s->fresh.push_back(optimizer.state().count(p.unsafeGetTensorImpl()) ? std::nullopt
                                                                          : std::optional(ir::TensorMeta::of(p)));
    // Where the step counts are: Note [Traceable optimizer state].
    group.lr = lr_tensor(group.options.lr,
                         capturable && !group_params.empty() ? group_params.front().device() : c10::Device(c10::kCPU));
    group.lr_value = group.options.lr;
    s->groups.push_back(std::move(group));
  }
  if (s->params.empty()) throw PipelineError("compile_train_step: the optimizer has no parameters");
  s->optimizer = &optimizer;
  s->flat_state = s->optimizer_state.flat();
  // The update rounds as on the parameters' device, also when traced on meta tensors.
  std::vector<detail::StepGroup> traced_groups = s->groups;
  for (detail::StepGroup& g : traced_groups) {
    g.options.device_type = s->params.front().device().type();
    g.lr = at::Tensor();  // the traced step reads its rates from its inputs
  }

  // See Note [Train step graph].
  autograd::AotConfig config = builder.aot_config();
  config.keep_inference_input_mutations = true;
  config.cache = nullptr;  // the step keeps its own latest graph, which a cache hit would not give
  config.inference_graph_name = "train_step";
  const size_t num_module_tensors = autograd::module_state(*module).size();
  config.inference_compiler = [builder, latest = s->latest, num_module_tensors, param_names = std::move(param_names),
                               groups = s->groups](const ir::Graph& graph, const std::vector<at::Tensor>& examples) {
    auto g = std::make_unique<ir::Graph>(graph.clone());
    // Naming the optimizer state and the batch is the first pass, so that
    // instruments (a dump) see the names.
    const ir::Pass name_state{
        "name_state", [&](ir::Graph& step) { detail::name_train_step(step, num_module_tensors, param_names, groups); }};
    // The step's graph holds forward, backward and update: the joint passes,
    // then the post-grad ones, in one run (the graph verified once on entry).
    std::vector<ir::Pass> passes = {name_state};
    passes.insert(passes.end(), builder.joint_passes().begin(), builder.joint_passes().end());
    passes.insert(passes.end(), builder.passes().begin(), builder.passes().end());
    builder.run_passes(passes, *g, "train_step");
    ir::CompiledFn fn = builder.run_backend(*g, examples, "train_step");
    std::vector<at::Tensor> lifted;
    for (size_t i = 0; i < g->signature().inputs.size(); ++i)
      if (g->signature().inputs[i].kind == ir::InputKind::Lifted) lifted.push_back(examples.at(i));
    std::lock_guard lock(latest->mu);
    latest->graphs.push_back(std::move(g));
    latest->lifted_examples = std::move(lifted);
    return fn;
  };
  const size_t num_flat = s->flat_state.size();
  if (!builder.pre_grad_passes().empty())
    config.pre_grad = [builder, module, loss_fn, traced_groups, params = s->params, num_flat,
                       hook = step_options.gradient_hook](const tracer::TensorFn&, const autograd::TraceFn& trace,
                                                          const std::vector<at::Tensor>& flat_args) {
      return detail::pre_grad_step(builder, module, loss_fn, traced_groups, params, num_flat, hook, trace, flat_args);
    };
  s->aot.emplace(autograd::aot_module(module,
                                      detail::step_function(std::move(traced_groups), s->params, num_flat,
                                                            std::move(loss_fn), std::move(step_options.gradient_hook)),
                                      config));
  s->module = std::move(module);
  TrainStep step;
  step.state_ = std::move(s);
  return step;
}

TrainStep compile_train_step(std::shared_ptr<torch::nn::Module> module, torch::optim::Optimizer& optimizer,
                             LossFn loss_fn) {
  return compile_train_step(std::move(module), optimizer, std::move(loss_fn), Builder());
}

}  // namespace crucible::pipeline
