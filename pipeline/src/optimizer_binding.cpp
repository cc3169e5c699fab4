// See Note [The optimizer's own state] in optimizer_binding.h.
#include "optimizer_binding.h"

#include <crucible/pipeline/error.h>

#include <c10/core/GradMode.h>
#include <c10/util/Type.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <memory>
#include <typeinfo>
#include <utility>

namespace crucible::pipeline::detail {
namespace {

bool same_layout(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.device() == b.device() && a.sizes() == b.sizes() &&
         a.strides() == b.strides();
}

// The first tensor of a fresh ParamState (its layout is the parameter's when
// it was made); undefined for SGD without momentum, which has none.
const at::Tensor& first_buffer(const ParamState& s) {
  return s.momentum_buffer.defined() ? s.momentum_buffer : s.exp_avg;
}

std::string describe(const torch::optim::OptimizerParamState& s) { return c10::demangle(typeid(s).name()); }

}  // namespace

OptimizerBinding::OptimizerBinding(torch::optim::Optimizer& optimizer, std::vector<Param> params)
    : optimizer_(&optimizer) {
  c10::NoGradGuard no_grad;
  for (Param& p : params) {
    Slot s;
    // On the CPU unless capturable: Note [Traceable optimizer state].
    s.step = at::zeros({}, at::TensorOptions()
                               .dtype(at::kDouble)
                               .device(p.options.capturable ? p.tensor.device() : c10::Device(c10::kCPU)));
    s.param = std::move(p);
    slots_.push_back(std::move(s));
  }
  bound_.params.resize(slots_.size());
}

bool OptimizerBinding::keeps_state(const Slot& s) const {
  return s.param.options.kind != OptimizerKind::SGD || s.param.options.momentum != 0;
}

void OptimizerBinding::make_fresh(Slot& s) {
  s.fresh = std::move(init_optimizer_state(s.param.options, {s.param.tensor}).params.front());
}

void OptimizerBinding::set_step(Slot& s, int64_t count) {
  c10::NoGradGuard no_grad;
  s.step.fill_(static_cast<double>(count));
  s.mirrored = count;
}

const OptimizerState& OptimizerBinding::bind() {
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    const at::Tensor& p = s.param.tensor;
    const OptimizerOptions& o = s.param.options;
    // A capturable count lives on the parameter's device (module->to(...)).
    if (o.capturable && s.step.device() != p.device()) {
      c10::NoGradGuard no_grad;
      s.step = s.step.to(p.device());
    }
    s.bound = nullptr;
    if (keeps_state(s))
      if (auto it = optimizer_->state().find(p.unsafeGetTensorImpl()); it != optimizer_->state().end())
        s.bound = it->second.get();
    ParamState& out = bound_.params[i];
    if (!s.bound) {
      // Zeros until torch::optim would have made its state; made again when
      // the parameter's layout changed since, or after the optimizer's state
      // for it was erased.
      if (s.mirrored) {
        set_step(s, 0);
        s.mirrored.reset();
      }
      const at::Tensor& made = first_buffer(s.fresh);
      if (!s.fresh.step.defined() || (made.defined() && !same_layout(made, p))) make_fresh(s);
      out = s.fresh;
      out.step = s.step;
      continue;
    }
    s.fresh = ParamState{};
    auto field = [&](const at::Tensor& t, const char* name) {
      if (!t.defined())
        throw PipelineError("TrainStep: the optimizer's state for the parameter '" + s.param.name + "' has no " + name +
                            ", which this optimizer's options read (a state saved with other options, such "
                            "as without amsgrad?); load a state saved with these options, or erase the "
                            "parameter's entry in optimizer.state() to start it afresh");
      if (t.sizes() != p.sizes())
        throw PipelineError("TrainStep: the optimizer's " + std::string(name) + " of the parameter '" + s.param.name +
                            "' has sizes " + c10::str(t.sizes()) + " but the parameter " + c10::str(p.sizes()) +
                            "; was the optimizer's state loaded for another model?");
      if (t.device() != p.device())
        throw PipelineError("TrainStep: the optimizer's " + std::string(name) + " of the parameter '" + s.param.name +
                            "' is on " + t.device().str() + " but the parameter on " + p.device().str() +
                            " (torch::load keeps the device a state was saved from, and module->to() does not move "
                            "the optimizer's state; eager's step fails the same way): move the state to the "
                            "parameter's device");
      return t;
    };
    int64_t count = 1;  // SGD keeps no count: a momentum buffer means "after the first step"
    auto read_adam = [&](auto& state) {
      out.exp_avg = field(state.exp_avg(), "exp_avg");
      out.exp_avg_sq = field(state.exp_avg_sq(), "exp_avg_sq");
      out.max_exp_avg_sq = o.amsgrad ? field(state.max_exp_avg_sq(), "max_exp_avg_sq") : at::Tensor();
      count = state.step();
    };
    auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(s.bound);
    auto* adam = dynamic_cast<torch::optim::AdamParamState*>(s.bound);
    auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(s.bound);
    out = ParamState{};
    if (o.kind == OptimizerKind::SGD && sgd)
      out.momentum_buffer = field(sgd->momentum_buffer(), "momentum_buffer");
    else if (o.kind == OptimizerKind::Adam && adam)
      read_adam(*adam);
    else if (o.kind == OptimizerKind::AdamW && adamw)
      read_adam(*adamw);
    else
      throw PipelineError("TrainStep: the optimizer's state for the parameter '" + s.param.name + "' is a " +
                          describe(*s.bound) +
                          ", not its own kind of state; load a state saved by this kind of "
                          "optimizer");
    if (s.mirrored != count) set_step(s, count);
    out.step = s.step;
  }
  return bound_;
}

void OptimizerBinding::install(Slot& s, int64_t count) {
  const OptimizerOptions& o = s.param.options;
  std::unique_ptr<torch::optim::OptimizerParamState> state;
  auto adam_like = [&](auto made) {
    made->step(count);
    made->exp_avg(s.fresh.exp_avg);
    made->exp_avg_sq(s.fresh.exp_avg_sq);
    if (o.amsgrad) made->max_exp_avg_sq(s.fresh.max_exp_avg_sq);
    state = std::move(made);
  };
  switch (o.kind) {
    case OptimizerKind::SGD: {
      auto made = std::make_unique<torch::optim::SGDParamState>();
      made->momentum_buffer(s.fresh.momentum_buffer);
      state = std::move(made);
      count = 1;
      break;
    }
    case OptimizerKind::Adam:
      adam_like(std::make_unique<torch::optim::AdamParamState>());
      break;
    case OptimizerKind::AdamW:
      adam_like(std::make_unique<torch::optim::AdamWParamState>());
      break;
  }
  s.bound = state.get();
  optimizer_->state()[s.param.tensor.unsafeGetTensorImpl()] = std::move(state);
  s.fresh = ParamState{};
  s.mirrored = count;
}

void OptimizerBinding::stepped(const std::vector<bool>& updated) {
  for (size_t i = 0; i < slots_.size() && i < updated.size(); ++i) {
    Slot& s = slots_[i];
    if (!updated[i] || !keeps_state(s)) continue;
    if (!s.bound) {
      install(s, 1);
      continue;
    }
    auto bump = [&](auto& state) {
      state.step(state.step() + 1);
      s.mirrored = state.step();
    };
    if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(s.bound))
      bump(*adam);
    else if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(s.bound))
      bump(*adamw);
  }
}

void OptimizerBinding::adopt_step_counts() {
  for (Slot& s : slots_) {
    if (!keeps_state(s)) continue;
    const auto count = static_cast<int64_t>(s.step.item<double>());
    auto& map = optimizer_->state();
    auto it = map.find(s.param.tensor.unsafeGetTensorImpl());
    if (it == map.end()) {
      if (count > 0) install(s, count);
      continue;
    }
    if (s.param.options.kind == OptimizerKind::SGD) {
      if (count == 0) {  // SGD before its first step keeps no state
        map.erase(it);
        s.bound = nullptr;
        s.mirrored.reset();
      }
      continue;
    }
    if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) adam->step(count);
    if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) adamw->step(count);
    s.mirrored = count;
  }
}

}  // namespace crucible::pipeline::detail
