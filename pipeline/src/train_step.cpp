// See Note [Train step graph] in train_step.h.
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/error.h>
#include <crucible/pipeline/train_step.h>

#include "optimizer_binding.h"

#include <crucible/autograd/aot_module.h>
#include <crucible/partitioner/min_cut_partition.h>
#include <crucible/tracer/error.h>
#include <crucible/tracer/functional_call.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <limits>
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

// What the traced step does besides loss, backward and update: Note [Train
// step graph], TrainStepOptions.
struct StepSpec {
  std::vector<StepGroup> groups;   // each group's options and parameter count (the rates are inputs)
  std::vector<at::Tensor> params;  // the optimizer's parameters, in its order
  size_t num_flat = 0;             // optimizer-state inputs, before the rates
  LossFn loss_fn;
  GradientHook gradient_hook;
  AroundLoss around_loss;
  std::function<void(bool)> around_pre_grad_trace;
  std::optional<double> clip_grad_value;
  std::optional<ClipGradNorm> clip_grad_norm;
  bool keep_gradients = false;
};

struct TrainStepState {
  std::shared_ptr<torch::nn::Module> module;
  std::string backend_name;  // Builder::backend_name
  torch::optim::Optimizer* optimizer = nullptr;
  std::vector<StepGroup> groups;
  std::vector<at::Tensor> params;                     // the optimizer's parameters, in its order
  std::vector<const c10::TensorImpl*> module_params;  // the module's, as module_parameters() lists them
  std::optional<OptimizerBinding> binding;            // Note [The optimizer's own state]
  bool clips_norm = false;
  bool keep_gradients = false;
  // Whether the compilation the latest call ran updates each parameter (a
  // gradient reaches it), and the total norm of the gradients it clipped.
  std::shared_ptr<const std::vector<bool>> updated;
  at::Tensor grad_norm;
  std::vector<std::string> param_names;      // the parameters' names in the module
  std::optional<std::vector<size_t>> hooks;  // per parameter: hooks_of() once first compiled
  std::shared_ptr<LatestGraph> latest = std::make_shared<LatestGraph>();
  std::optional<autograd::AotModule> aot;  // the step, compiled by AOTAutograd (Note [Train step graph])

  // The AOT arguments after the module's state: the optimizer's state as it
  // holds it now, the rates, the batch.
  std::vector<at::Tensor> arguments(const std::vector<at::Tensor>& batch) {
    std::vector<at::Tensor> in = binding->bind().flat();
    for (const StepGroup& g : groups) in.push_back(g.lr);
    in.insert(in.end(), batch.begin(), batch.end());
    return in;
  }

  // Every parameter of the module's tree, module by module (Module::apply):
  // cheaper at every call than named_parameters(), which builds the names.
  static std::vector<const c10::TensorImpl*> module_parameters(const torch::nn::Module& module) {
    std::vector<const c10::TensorImpl*> impls;
    module.apply([&impls](const torch::nn::Module& m) {
      for (const at::Tensor& p : m.parameters(/*recurse=*/false)) impls.push_back(p.unsafeGetTensorImpl());
    });
    return impls;
  }
  // A parameter replaced in the module after compile_train_step would be
  // updated by the graph, which writes the module's tensors, where eager's
  // optimizer updates the one it holds: refused.
  void check_module() const {
    if (module_parameters(*module) != module_params)
      throw PipelineError(
          "TrainStep: the module's parameters changed since compile_train_step (a parameter replaced, registered "
          "or removed); the optimizer still holds the tensors it was given, which eager's step would update "
          "instead of the module's: build the optimizer over the module's parameters now and compile a new step "
          "(torch::load, load_state_dict and module->to() keep the parameters' tensors and need neither)");
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

  // The optimizer as compiled: the same param groups over the same
  // parameters, with the same options but the learning rate, which is read
  // into the rate inputs here (so that schedulers work).
  void read_optimizer() {
    const auto& torch_groups = optimizer->param_groups();
    if (torch_groups.size() != groups.size())
      throw PipelineError("TrainStep: the optimizer has " + std::to_string(torch_groups.size()) +
                          " parameter groups; the step was compiled for " + std::to_string(groups.size()) +
                          " and updates those only: compile a new step for the new groups");
    size_t first = 0;
    for (size_t i = 0; i < groups.size(); ++i) {
      const std::vector<at::Tensor>& now = torch_groups[i].params();
      bool same = now.size() == groups[i].num_params;
      for (size_t k = 0; same && k < now.size(); ++k)
        same = now[k].unsafeGetTensorImpl() == params[first + k].unsafeGetTensorImpl();
      if (!same)
        throw PipelineError("TrainStep: the parameters of the optimizer's parameter group " + std::to_string(i) +
                            " changed since compile_train_step; the compiled step updates those it was compiled "
                            "for: compile a new step for the new parameters");
      first += groups[i].num_params;
    }
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

  // What a call does once the graph ran, with its outputs (loss, the total
  // norm with clip_grad_norm, the gradients with keep_gradients).
  at::Tensor finish(std::vector<at::Tensor> out) {
    size_t next = 1;
    if (clips_norm) grad_norm = out.at(next++);
    // The optimizer's parameters end as after zero_grad() (Note [Train step
    // graph]) also where they held a gradient before the step, which it
    // neither reads nor clears: one a GAN's other step accumulated into them,
    // reading them from outside its module. Left there, the next such
    // backward would add to it where eager's zero_grad() starts afresh.
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor& grad = params[i].mutable_grad();
      if (keep_gradients && updated && (*updated)[i])
        grad = std::move(out.at(next++));
      else if (grad.defined())
        grad.reset();
    }
    if (!hooks) hooks = hooks_now();
    return std::move(out.at(0));
  }
};

// torch::nn::utils::clip_grad_norm_ (torch/nn/utils/clip_grad.h) on the
// defined gradients, op for op, so that it rounds as eager's does; returns
// the total norm before clipping (0 without gradients, as there).
at::Tensor clip_grad_norm(std::vector<at::Tensor>& grads, const ClipGradNorm& clip) {
  std::vector<at::Tensor*> defined;
  for (at::Tensor& g : grads)
    if (g.defined()) defined.push_back(&g);
  if (defined.empty()) return at::zeros({}, at::kDouble);
  at::Tensor total;
  if (clip.norm_type == std::numeric_limits<double>::infinity()) {
    std::vector<at::Tensor> norms;
    for (const at::Tensor* g : defined) norms.push_back(g->abs().max());
    total = norms.size() == 1 ? norms[0] : at::max(at::stack(norms));
  } else if (clip.norm_type == 0) {
    total = at::full({}, static_cast<double>(defined.size()));
  } else {
    std::vector<at::Tensor> norms;
    for (const at::Tensor* g : defined) norms.push_back(g->norm(clip.norm_type));
    total = norms.size() == 1 ? norms[0] : at::stack(norms).norm(clip.norm_type);
  }
  const at::Tensor coef = at::clamp(clip.max_norm / (total + 1e-6), std::nullopt, 1.0);
  for (at::Tensor* g : defined) *g = g->mul(coef);
  return total;
}

// A value read back to the host inside the step (the trace refuses it) is,
// after a backward, most likely torch::nn::utils::clip_grad_norm_, which
// returns its norm as a double: point to the compiled clipping.
template <typename Fn>
auto with_clipping_hint(const std::vector<at::Tensor>& params, Fn&& fn) {
  try {
    return fn();
  } catch (const tracer::DataDependentError& e) {
    const bool any_grad =
        std::any_of(params.begin(), params.end(), [](const at::Tensor& p) { return p.grad().defined(); });
    if (!any_grad) throw;
    throw tracer::DataDependentError(
        std::string(e.what()) +
        ". A compiled step cannot read values back to the host while it runs: torch::nn::utils::clip_grad_norm_ "
        "returns the norm as a double, so it cannot run inside the step; clip with "
        "TrainStepOptions::clip_grad_norm or clip_grad_value, which compile the clipping into the step "
        "(TrainStep::grad_norm() gives the norm)");
  }
}

// The step as AOTAutograd traces it, over the module and (flat state, rates,
// batch...): Note [Train step graph]. Returns the loss, then with
// clip_grad_norm the gradients' total norm, then with keep_gradients the
// gradients the update read (of the parameters a gradient reached, in the
// optimizer's order).
tracer::ModuleFn step_function(StepSpec spec) {
  return [spec = std::move(spec)](torch::nn::Module& m, const std::vector<at::Tensor>& in) {
    // The compiled call runs under no_grad; the step differentiates itself.
    at::AutoGradMode grad_on(true);
    const std::vector<at::Tensor> batch(in.begin() + static_cast<std::ptrdiff_t>(spec.num_flat + spec.groups.size()),
                                        in.end());
    at::Tensor loss = with_clipping_hint(spec.params, [&] {
      return spec.around_loss ? spec.around_loss(m, batch, spec.loss_fn) : spec.loss_fn(m, batch);
    });
    // One element, as eager's backward() takes without a gradient argument.
    if (!loss.defined() || loss.numel() != 1)
      throw PipelineError(
          "compile_train_step: the loss function must return a tensor of one element (reduce the loss with mean() "
          "or sum()); it returned " +
          (loss.defined() ? "sizes " + c10::str(loss.sizes()) : std::string("an undefined tensor")));
    loss.backward();
    std::vector<at::Tensor> grads;
    for (const at::Tensor& p : spec.params) grads.push_back(p.grad());
    if (spec.gradient_hook) {
      const size_t n = grads.size();
      grads = with_clipping_hint(spec.params, [&] { return spec.gradient_hook(std::move(grads)); });
      if (grads.size() != n)
        throw PipelineError("compile_train_step: the gradient hook returned " + std::to_string(grads.size()) +
                            " gradients for " + std::to_string(n) + " parameters; return one per parameter");
    }
    std::vector<at::Tensor> out{loss.detach()};
    if (spec.clip_grad_value)
      for (at::Tensor& g : grads)
        if (g.defined()) g = g.clamp(-*spec.clip_grad_value, *spec.clip_grad_value);
    if (spec.clip_grad_norm) out.push_back(clip_grad_norm(grads, *spec.clip_grad_norm));
    // Each group's update with its options, state and rate.
    size_t first = 0, flat_first = 0;
    for (size_t g = 0; g < spec.groups.size(); ++g) {
      const OptimizerOptions& options = spec.groups[g].options;
      const size_t n = spec.groups[g].num_params;
      const size_t flat_n = n * OptimizerState::field_names(options).size();
      auto flat_begin = in.begin() + static_cast<std::ptrdiff_t>(flat_first);
      OptimizerState state = OptimizerState::from_flat(
          options, n, std::vector<at::Tensor>(flat_begin, flat_begin + static_cast<std::ptrdiff_t>(flat_n)));
      const auto at_first = static_cast<std::ptrdiff_t>(first), at_end = static_cast<std::ptrdiff_t>(first + n);
      optimizer_step(options, std::vector<at::Tensor>(spec.params.begin() + at_first, spec.params.begin() + at_end),
                     std::vector<at::Tensor>(grads.begin() + at_first, grads.begin() + at_end), state,
                     in[spec.num_flat + g]);
      first += n;
      flat_first += flat_n;
    }
    if (spec.keep_gradients)
      for (const at::Tensor& g : grads)
        if (g.defined()) out.push_back(g);
    // The gradients stay inside the graph: the parameters end as after zero_grad().
    for (const at::Tensor& p : spec.params) p.mutable_grad().reset();
    return out;
  };
}

// See Note [Pre-grad passes in a training step]: the step whose loss is the
// pre-grad passes' forward graph, run by the interpreter. `flat_args`: the
// compilation's (module state, flat state, rates, batch).
tracer::TensorFn pre_grad_step(const Builder& builder, const std::shared_ptr<torch::nn::Module>& module, StepSpec spec,
                               const autograd::TraceFn& trace, const std::vector<at::Tensor>& flat_args) {
  const size_t num_state = autograd::module_state(*module).size();
  const auto batch_begin =
      flat_args.begin() + static_cast<std::ptrdiff_t>(num_state + spec.num_flat + spec.groups.size());
  std::vector<at::Tensor> forward_args(flat_args.begin(), flat_args.begin() + static_cast<std::ptrdiff_t>(num_state));
  forward_args.insert(forward_args.end(), batch_begin, flat_args.end());
  const tracer::TensorFn loss_alone = [module, loss_fn = spec.loss_fn, num_state](const std::vector<at::Tensor>& full) {
    const std::vector<at::Tensor> batch(full.begin() + static_cast<std::ptrdiff_t>(num_state), full.end());
    return std::vector<at::Tensor>{loss_fn(*module, batch)};
  };
  // Traced with grad mode on, as the step runs the loss: at::matmul, for
  // one, decomposes by whether its operands require grad, and ops the loss
  // runs under no_grad are tagged so (Note [Nodes traced under no_grad]).
  at::AutoGradMode grad_on(true);
  struct Around {  // TrainStepOptions::around_pre_grad_trace
    const std::function<void(bool)>& fn;
    explicit Around(const std::function<void(bool)>& f) : fn(f) {
      if (fn) fn(true);
    }
    ~Around() {
      if (fn) fn(false);
    }
    Around(const Around&) = delete;
    Around& operator=(const Around&) = delete;
  };
  tracer::TensorFn forward;
  {
    const Around around(spec.around_pre_grad_trace);
    forward = builder.pre_grad_function(loss_alone, trace, forward_args);
  }
  spec.loss_fn = [forward = std::move(forward)](torch::nn::Module& m, const std::vector<at::Tensor>& batch) {
    std::vector<at::Tensor> in = autograd::module_state(m);
    in.insert(in.end(), batch.begin(), batch.end());
    return forward(in).at(0);
  };
  tracer::ModuleFn step = step_function(std::move(spec));
  return [module, step = std::move(step), num_state](const std::vector<at::Tensor>& full) {
    return step(*module, std::vector<at::Tensor>(full.begin() + static_cast<std::ptrdiff_t>(num_state), full.end()));
  };
}

// Names the graph's inputs and output as Note [Train step graph] says
// (functional_call names its arguments arg0, arg1, ...). Returns the
// placeholder index of each parameter's step count.
std::vector<size_t> name_train_step(ir::Graph& g, size_t num_module_tensors,
                                    const std::vector<std::string>& param_names, const std::vector<StepGroup>& groups) {
  const std::vector<ir::Value*> ph = g.placeholders();
  size_t i = num_module_tensors;
  auto mark = [&](const std::string& target) {
    g.signature().inputs.at(i) = ir::InputSpec{ir::InputKind::State, target, std::nullopt};
    g.rename(ph.at(i), g.unique_name(target));
    ++i;
  };
  std::vector<size_t> steps;
  size_t param = 0;
  for (const StepGroup& group : groups) {
    const std::vector<std::string> per_param = OptimizerState::field_names(group.options);  // "step" first
    for (size_t p = 0; p < group.num_params; ++p, ++param) {
      steps.push_back(i);
      for (const std::string& s : per_param) mark(param_names.at(param) + "." + s);
    }
  }
  for (size_t k = 0; k < groups.size(); ++k) mark(groups.size() == 1 ? "lr" : "lr." + std::to_string(k));
  for (size_t b = 0; i < ph.size() && g.signature().inputs[i].kind == ir::InputKind::UserInput; ++b, ++i)
    g.rename(ph[i], g.unique_name("batch" + std::to_string(b)));
  g.signature().outputs.at(0) = ir::OutputSpec{ir::OutputKind::Loss, std::nullopt};
  return steps;
}

}  // namespace detail

at::Tensor TrainStep::operator()(const std::vector<at::Tensor>& batch) const {
  detail::TrainStepState& s = *state_;
  s.check_module();
  s.read_optimizer();
  s.check_hooks();
  std::vector<at::Tensor> out;
  {
    at::NoGradGuard no_grad;  // the inference path: one graph, forward to update
    out = s.aot->operator()(s.arguments(batch));
  }
  return s.finish(std::move(out));
}

void TrainStep::compile(const std::vector<at::Tensor>& batch) const {
  detail::TrainStepState& s = *state_;
  s.check_module();
  s.check_hooks();
  at::NoGradGuard no_grad;
  s.aot->compile(s.arguments(batch));
  if (!s.hooks) s.hooks = s.hooks_now();
}

size_t TrainStep::num_compilations() const { return state_->aot->num_compilations(); }

const ir::Graph& TrainStep::graph() const {
  std::lock_guard lock(state_->latest->mu);
  if (state_->latest->graphs.empty())
    throw PipelineError("TrainStep::graph: nothing is compiled yet; call the step or TrainStep::compile first");
  return *state_->latest->graphs.back();
}

std::vector<at::Tensor> TrainStep::graph_inputs(const std::vector<at::Tensor>& batch) const {
  std::vector<at::Tensor> inputs = autograd::module_state(*state_->module);
  for (at::Tensor& t : inputs) t = t.detach();
  for (const at::Tensor& t : state_->arguments(batch)) inputs.push_back(t);
  std::lock_guard lock(state_->latest->mu);
  inputs.insert(inputs.end(), state_->latest->lifted_examples.begin(), state_->latest->lifted_examples.end());
  return inputs;
}

const OptimizerOptions& TrainStep::optimizer_options() const { return state_->groups.front().options; }

const std::string& TrainStep::backend_name() const { return state_->backend_name; }

const OptimizerState& TrainStep::optimizer_state() const { return state_->binding->bind(); }

void TrainStep::adopt_step_counts() const { state_->binding->adopt_step_counts(); }

const at::Tensor& TrainStep::grad_norm() const {
  if (!state_->clips_norm)
    throw PipelineError("TrainStep::grad_norm: the step computes no norm; set TrainStepOptions::clip_grad_norm");
  if (!state_->grad_norm.defined()) throw PipelineError("TrainStep::grad_norm: no step has run yet");
  return state_->grad_norm;
}

TrainStep compile_train_step(std::shared_ptr<torch::nn::Module> module, torch::optim::Optimizer& optimizer,
                             LossFn loss_fn, const Builder& builder, TrainStepOptions step_options) {
  if (!module) throw PipelineError("compile_train_step: the module is null");
  if (!loss_fn) throw PipelineError("compile_train_step: the loss function is empty");
  if ((step_options.clip_grad_value && std::isnan(*step_options.clip_grad_value)) ||
      (step_options.clip_grad_norm &&
       (std::isnan(step_options.clip_grad_norm->max_norm) || std::isnan(step_options.clip_grad_norm->norm_type))))
    throw PipelineError(
        "compile_train_step: TrainStepOptions::clip_grad_value and clip_grad_norm take numbers, not "
        "NaN (every gradient would become NaN)");
  auto s = std::make_shared<detail::TrainStepState>();
  const std::vector<OptimizerOptions> group_options = optimizer_group_options(optimizer);
  const bool capturable = step_options.capturable.value_or(builder.backend_cuda_graphs());
  std::unordered_map<const c10::TensorImpl*, std::string> module_params;
  for (const auto& p : module->named_parameters(/*recurse=*/true))
    module_params.emplace(p.value().unsafeGetTensorImpl(), p.key());
  std::unordered_set<const c10::TensorImpl*> seen;
  std::vector<detail::OptimizerBinding::Param> bound;
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
      s->param_names.push_back(it->second);
      bound.push_back({p, it->second, group.options});
      ++group.num_params;
    }
    // Where the step counts are: Note [Traceable optimizer state].
    const at::Tensor* first = group.num_params ? &s->params[s->params.size() - group.num_params] : nullptr;
    group.lr = lr_tensor(group.options.lr, capturable && first ? first->device() : c10::Device(c10::kCPU));
    group.lr_value = group.options.lr;
    s->groups.push_back(std::move(group));
  }
  if (s->params.empty()) throw PipelineError("compile_train_step: the optimizer has no parameters");
  s->optimizer = &optimizer;
  s->module_params = detail::TrainStepState::module_parameters(*module);
  s->binding.emplace(optimizer, std::move(bound));
  s->clips_norm = step_options.clip_grad_norm.has_value();
  s->keep_gradients = step_options.keep_gradients;
  // The update rounds as on the parameters' device, also when traced on fake tensors.
  detail::StepSpec spec;
  spec.groups = s->groups;
  for (detail::StepGroup& g : spec.groups) {
    g.options.device_type = s->params.front().device().type();
    g.lr = at::Tensor();  // the traced step reads its rates from its inputs
  }
  spec.params = s->params;
  for (const detail::StepGroup& g : s->groups)
    spec.num_flat += g.num_params * OptimizerState::field_names(g.options).size();
  spec.loss_fn = std::move(loss_fn);
  spec.gradient_hook = std::move(step_options.gradient_hook);
  spec.around_loss = std::move(step_options.around_loss);
  spec.around_pre_grad_trace = std::move(step_options.around_pre_grad_trace);
  spec.clip_grad_value = step_options.clip_grad_value;
  spec.clip_grad_norm = step_options.clip_grad_norm;
  spec.keep_gradients = step_options.keep_gradients;

  // See Note [Train step graph].
  autograd::AotConfig config = builder.aot_config();
  config.keep_inference_input_mutations = true;
  config.cache = nullptr;  // the step keeps its own latest graph, which a cache hit would not give
  config.inference_graph_name = "train_step";
  const size_t num_module_tensors = autograd::module_state(*module).size();
  config.inference_compiler = [builder, latest = s->latest, num_module_tensors, param_names = s->param_names,
                               groups = s->groups, state = std::weak_ptr<detail::TrainStepState>(s)](
                                  const ir::Graph& graph, const std::vector<at::Tensor>& examples) -> ir::CompiledFn {
    auto g = std::make_unique<ir::Graph>(graph.clone());
    // Naming the optimizer state and the batch is the first pass, so that
    // instruments (a dump) see the names.
    std::vector<size_t> step_inputs;
    const ir::Pass name_state{"name_state", [&](ir::Graph& step) {
                                step_inputs = detail::name_train_step(step, num_module_tensors, param_names, groups);
                              }};
    // The step's graph holds forward, backward and update: the joint passes,
    // then the post-grad ones and the rematerialization, in one run (the
    // graph verified once on entry). The rematerialization comes last, so
    // the graph its cost model weighs is the one the backend compiles.
    std::vector<ir::Pass> passes = {name_state};
    passes.insert(passes.end(), builder.joint_passes().begin(), builder.joint_passes().end());
    passes.insert(passes.end(), builder.passes().begin(), builder.passes().end());
    if (builder.remat()) passes.push_back(partitioner::remat_pass(*builder.remat()));
    builder.run_passes(passes, *g, "train_step");
    ir::CompiledFn fn = builder.run_backend(*g, examples, "train_step");
    // A parameter is updated where the graph writes its step count (Note
    // [The optimizer's own state]).
    const std::vector<bool> written = ir::placeholders_written(*g);
    auto updated = std::make_shared<std::vector<bool>>();
    for (size_t i : step_inputs) updated->push_back(written.at(i));
    std::vector<at::Tensor> lifted;
    for (size_t i = 0; i < g->signature().inputs.size(); ++i)
      if (g->signature().inputs[i].kind == ir::InputKind::Lifted) lifted.push_back(examples.at(i));
    {
      std::lock_guard lock(latest->mu);
      latest->graphs.push_back(std::move(g));
      latest->lifted_examples = std::move(lifted);
    }
    return [fn = std::move(fn), updated = std::shared_ptr<const std::vector<bool>>(std::move(updated)),
            state](std::vector<at::Tensor>& inputs) {
      std::vector<at::Tensor> out = fn(inputs);
      if (const std::shared_ptr<detail::TrainStepState> s = state.lock()) {
        s->binding->stepped(*updated);
        s->updated = updated;
      }
      return out;
    };
  };
  if (!builder.pre_grad_passes().empty())
    config.pre_grad = [builder, module, spec](const tracer::TensorFn&, const autograd::TraceFn& trace,
                                              const std::vector<at::Tensor>& flat_args) {
      return detail::pre_grad_step(builder, module, spec, trace, flat_args);
    };
  s->aot.emplace(autograd::aot_module(module, detail::step_function(std::move(spec)), config));
  s->module = std::move(module);
  s->backend_name = builder.backend_name();
  TrainStep step;
  step.state_ = std::move(s);
  return step;
}

TrainStep compile_train_step(std::shared_ptr<torch::nn::Module> module, torch::optim::Optimizer& optimizer,
                             LossFn loss_fn) {
  return compile_train_step(std::move(module), optimizer, std::move(loss_fn), Builder());
}

}  // namespace crucible::pipeline
