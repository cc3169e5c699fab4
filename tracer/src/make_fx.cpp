#include "trace_session.h"

#include <crucible/tracer/error.h>
#include <crucible/tracer/make_fx.h>

#include <ATen/ATen.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace crucible::tracer {
namespace detail {

// Note [The tracing dispatch key]
// The tracer is a boxed fallback on c10::DispatchKey::Fake (a key LibTorch
// reserves for out-of-tree fake tensors and otherwise leaves unused), switched
// on for the tracing thread with IncludeDispatchKeyGuard. Fake sits below
// the autograd keys, ADInplaceOrView and Functionalize and above
// BackendSelect and the backends, so the fallback sees:
//  * the ops autograd dispatches, after CompositeImplicitAutograd ops have
//    decomposed (their kernels run at the autograd keys, above Fake);
//  * the ops the autograd engine runs for .backward() / torch::autograd::grad:
//    the engine carries the thread's dispatch-key state into the backward pass;
//  * factory ops with no tensor argument (the TLS key is part of every
//    dispatch key set, and BackendSelect is below it);
//  * under functionalization, the functional ops the Functionalize kernels
//    call on the unwrapped tensors.
// The fallback excludes the key while it runs the op (redispatching with the
// keys after Fake), so what kernels call inside is not recorded.

namespace {

std::mutex g_trace_mutex;
std::atomic<TraceSession*> g_active{nullptr};
thread_local bool t_tracing = false;

void trace_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  if (TraceSession* s = g_active.load(std::memory_order_acquire)) {
    s->on_op(op, ks, *stack);
    return;
  }
  // The key survived its trace (a thread that copied the tracing thread's state).
  c10::impl::ExcludeDispatchKeyGuard off(c10::DispatchKey::Fake);
  op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::Fake), stack);
}

// Note [Writes into reached tensors under functionalization]
// Module state and lifted tensors are not functional wrappers (Note
// [Swapping reached tensors]), and LibTorch's Functionalize kernels refuse to
// write a functional tensor's value into a tensor that is not one
// ("mutating a non-functional tensor with a functional tensor is not
// allowed"): a BatchNorm's statistics copied from the batch, a counter buffer
// advanced by a computed value. A second fallback, on DispatchKey::
// DeferredInit (a key LibTorch leaves unused without torchdistx; it sits
// above autograd and Functionalize), is switched on with functionalization
// and sees each op first: when the op writes a tensor that is not a
// functional wrapper and reads one that is, it replaces the functional
// arguments it only reads by their current values (synced, unwrapped: the
// tensors the tracer records), so the op reaches the tracer as a write of
// traced values into the reached tensor, which Note [Functionalizing module
// state] turns into an out-of-place op and a MutatedInput output. Autograd
// then records no history for the write; a value that requires grad written
// this way under grad mode raises TraceError instead of losing its gradient.
// native_batch_norm in training writes its running statistics although its
// schema does not say so (Note [Ops with hidden writes]). Where they are
// functional tensors (the function's inputs or tensors it made), that write
// must reach Functionalize to become an input mutation or the tensors' new
// value, so the op runs as _native_batch_norm_legit instead: the same kernel
// and backward, with the write in its schema, which Functionalize turns into
// _native_batch_norm_legit_functional and writes into the wrappers. Returns
// false, changing nothing, for any other call.
bool batch_norm_into_functional_statistics(const c10::OperatorHandle& op, torch::jit::Stack& stack) {
  namespace fn = at::functionalization::impl;
  if (op.schema().name() != "aten::native_batch_norm" || !op.schema().overload_name().empty()) return false;
  const size_t base = stack.size() - 8;
  const c10::IValue &mean = stack[base + 3], &var = stack[base + 4];
  if (!stack[base + 5].toBool() || !mean.isTensor() || !var.isTensor() || !fn::isFunctionalTensor(mean.toTensor()) ||
      !fn::isFunctionalTensor(var.toTensor()))
    return false;
  at::Tensor running_mean = mean.toTensor(), running_var = var.toTensor();
  auto [out, save_mean, save_invstd] = at::_native_batch_norm_legit(
      stack[base].toTensor(), stack[base + 1].toOptional<at::Tensor>(), stack[base + 2].toOptional<at::Tensor>(),
      running_mean, running_var, /*training=*/true, stack[base + 6].toDouble(), stack[base + 7].toDouble());
  stack.resize(base);
  stack.emplace_back(out);
  stack.emplace_back(save_mean);
  stack.emplace_back(save_invstd);
  return true;
}

void write_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  namespace fn = at::functionalization::impl;
  if (batch_norm_into_functional_statistics(op, *stack)) return;
  const c10::FunctionSchema& schema = op.schema();
  if (schema.is_mutable()) {
    const auto& formals = schema.arguments();
    const size_t base = stack->size() - formals.size();
    auto written = [&](size_t a) { return formals[a].alias_info() && formals[a].alias_info()->isWrite(); };
    bool writes_plain = false, reads_functional = false;
    for (size_t a = 0; a < formals.size(); ++a) {
      const c10::IValue& iv = (*stack)[base + a];
      if (!iv.isTensor() || !iv.toTensor().defined()) continue;
      if (written(a))
        writes_plain |= !fn::isFunctionalTensor(iv.toTensor());
      else
        reads_functional |= fn::isFunctionalTensor(iv.toTensor());
    }
    if (writes_plain && reads_functional) {
      for (size_t a = 0; a < formals.size(); ++a) {
        c10::IValue& iv = (*stack)[base + a];
        if (written(a) || !iv.isTensor() || !fn::isFunctionalTensor(iv.toTensor())) continue;
        at::Tensor t = iv.toTensor();
        if (t.requires_grad() && at::GradMode::is_enabled())
          throw TraceError(ir::operator_name(op) +
                           " writes a value that requires grad into module state or a "
                           "tensor read from outside the function (argument '" +
                           formals[a].name() +
                           "'); the compiled graph cannot carry its gradient through that write: detach() the "
                           "value, or write under NoGradGuard as eager training code does");
        fn::sync(t);
        iv = fn::from_functional_tensor(t);
      }
    }
  }
  op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::DeferredInit), stack);
}

struct ActiveTrace {
  explicit ActiveTrace(TraceSession& s) { g_active.store(&s, std::memory_order_release); }
  ~ActiveTrace() { g_active.store(nullptr, std::memory_order_release); }
  ActiveTrace(const ActiveTrace&) = delete;
  ActiveTrace& operator=(const ActiveTrace&) = delete;
};

}  // namespace

// Note [Functionalizing module state]
// Module state and lifted tensors cannot be wrapped for functionalization
// (see Note [Swapping reached tensors] in trace_session.cpp), so an in-place
// op on a parameter, buffer or lifted tensor reaches the tracer as itself: BatchNorm's `num_batches_tracked += 1`
// records `aten::add_.Scalar(%num_batches_tracked, 1, 1)`. After the trace each such node is replaced by the op's
// out-of-place variant (the same name without the trailing '_', same overload and arguments), later reads use the new
// value, and the state's final value becomes an extra output of kind
// MutatedInput, exactly as for a wrapped input. An in-place op that has no
// such variant, writes several arguments, or writes state through a view
// throws TraceError. A kernel that updates state without saying so in its
// schema (native_batch_norm's running statistics in training) is not a
// mutation the graph can see: the node stays, and running the graph updates
// the tensors it is given, as the eager kernel does.
//
// Tensors the function computes from module state alone are not wrappers
// either (a Functionalize kernel wraps its results only when an argument is
// one), so an in-place op on them reaches the tracer too: a weight
// standardized in place, a mask cloned from a buffer and filled. Such a
// write becomes its out-of-place variant when nothing could see the old
// value through an alias: the tensor is no view (its op returns no alias),
// nothing takes a view of it, and nothing reads it after the write (the
// tracer maps the written tensor to the op's result from then on, so a
// later read of the old Value would be an alias it cannot follow). A write
// through aten::alias of module state (instance_norm's running statistics)
// is a write to that state under the same conditions. Anything else throws.
namespace {

// Whether a result of `n` may alias an argument (a view, an in-place op).
bool returns_alias(const ir::Node& n) {
  if (!n.is_call()) return false;
  for (const c10::Argument& r : n.schema().returns())
    if (r.alias_info()) return true;
  return false;
}

// Whether `v`, written by `write` (through `view`, if set), is read after
// the write or has other views (Note [Functionalizing module state]).
bool aliased_or_read_after(const ir::Graph& graph, const ir::Value* v, const ir::Node* write,
                           const ir::Node* view = nullptr) {
  bool after = false;
  for (const ir::Node* m : graph.nodes()) {
    if (m == write) {
      after = true;
      continue;
    }
    bool reads = false;
    for (const ir::Value* in : m->inputs()) reads |= in == v;
    if (reads && m != view && (after || returns_alias(*m))) return true;
  }
  return false;
}

c10::OperatorHandle out_of_place_variant(const ir::Node& n) {
  const c10::FunctionSchema& schema = n.schema();
  const std::string& name = schema.name();
  size_t written = 0;
  for (const c10::Argument& a : schema.arguments()) written += a.alias_info() && a.alias_info()->isWrite();
  const bool in_place = written == 1 && name.size() > 1 && name.back() == '_' && schema.arguments()[0].alias_info() &&
                        schema.arguments()[0].alias_info()->isWrite();
  if (in_place) {
    auto h = c10::Dispatcher::singleton().findSchema({name.substr(0, name.size() - 1), schema.overload_name()});
    if (h && h->schema().arguments().size() == schema.arguments().size() && h->schema().returns().size() == 1 &&
        !h->schema().is_mutable())
      return *h;
  }
  throw TraceError("functionalize: " + n.target() +
                   " writes to module state (a parameter or buffer) or a lifted tensor in place and has no "
                   "out-of-place variant "
                   "taking the same arguments, so the write cannot be made functional; write the new value "
                   "with an out-of-place op, or trace without functionalize");
}

// See Note [Functionalizing module state].
void functionalize_state_writes(ir::Graph& graph, const std::vector<bool>& reached,
                                std::vector<InputMutation>& input_mutations) {
  std::vector<ir::Node*> writes;
  for (ir::Node* n : graph.nodes())
    if (n->is_call() && n->is_mutating()) writes.push_back(n);
  if (writes.empty()) return;
  std::unordered_map<const ir::Value*, size_t> state_of;  // Value -> the placeholder whose state it holds
  const std::vector<ir::Value*> placeholders = graph.placeholders();
  for (size_t i = 0; i < placeholders.size(); ++i)
    if (reached[i] && !graph.signature().inputs[i].duplicate_of) state_of.emplace(placeholders[i], i);
  std::vector<ir::Value*> final_value(placeholders.size(), nullptr);
  for (ir::Node* n : writes) {
    const c10::OperatorHandle functional = out_of_place_variant(*n);
    const ir::Argument& self = n->arg(0);
    auto it = self.is_value() ? state_of.find(self.value()) : state_of.end();
    const ir::Node* producer = self.is_value() ? self.value()->node() : nullptr;
    bool intermediate = false;
    if (it == state_of.end() && producer && producer->is_call() && !aliased_or_read_after(graph, self.value(), n)) {
      if (!returns_alias(*producer)) {
        intermediate = true;
      } else if (producer->target() == "aten::alias" && producer->arg(0).is_value()) {
        auto base = state_of.find(producer->arg(0).value());
        if (base != state_of.end() && !aliased_or_read_after(graph, base->first, n, producer)) it = base;
      }
    }
    if (it == state_of.end() && !intermediate)
      throw TraceError("functionalize: " + n->target() + " writes in place to %" +
                       (self.is_value() ? self.value()->name() : std::string("?")) +
                       ", a view of module state, of a lifted tensor or of a tensor computed from them alone "
                       "(which functionalization does not wrap), or such a tensor viewed or read after the write; "
                       "write the parameter, buffer or tensor itself, compute the new value out of place, or trace "
                       "without functionalize");
    ir::Node* replacement = nullptr;
    {
      ir::Graph::InsertGuard before(graph, n);
      replacement = graph.add_call(functional, n->args());
    }
    replacement->set_source(n->source());
    for (const auto& tag : n->tags()) replacement->add_tag(tag);
    replacement->result()->set_meta(n->result()->meta());
    n->result()->replace_all_uses_with(replacement->result());
    graph.erase(n);
    if (intermediate) continue;
    state_of.emplace(replacement->result(), it->second);
    final_value[it->second] = replacement->result();
  }
  std::vector<ir::Value*> outputs = graph.outputs();
  std::vector<ir::OutputSpec> specs = graph.signature().outputs;
  for (size_t i = 0; i < final_value.size(); ++i) {
    if (!final_value[i]) continue;
    input_mutations[i].data = true;
    outputs.push_back(final_value[i]);
    specs.push_back(ir::OutputSpec{ir::OutputKind::MutatedInput, i});
  }
  graph.set_output(outputs);
  graph.signature().outputs = specs;
}

// Note [Functionalization]
// With TraceOptions::functionalize the traced function runs on
// FunctionalTensorWrappers (at::functionalization::impl::to_functional_tensor)
// with the Functionalize key also in the thread's include set, so factory
// results are wrapped too. LibTorch's Functionalize kernels turn every
// in-place op into its functional variant and every view into a view op
// whose base is regenerated (view_scatter ops) when an alias is mutated; the
// tracer, below Functionalize, records only those functional ops on the
// unwrapped tensors. At the end each output and each input is synced;
// an input whose wrapper saw a data or metadata mutation contributes its final
// value as an extra output (MutatedInput, or MutatedInputMetadata when only
// its sizes/strides changed), in input order, after the function's outputs.
// Module state (functional_call) is swapped into the module's own tensors,
// which cannot be wrappers; see Note [Functionalizing module state].
TraceResult trace_once(const std::vector<TraceInput>& inputs, const TraceHooks& hooks, const TraceOptions& options) {
  if (t_tracing)
    throw TraceError("make_fx called while this thread is already tracing; nested traces are not supported");
  std::lock_guard<std::mutex> lock(g_trace_mutex);
  TraceResult result;
  ir::Graph& graph = result.graph;
  std::vector<ir::Value*> values;
  std::vector<ir::OutputSpec> specs;
  std::vector<bool> reached;
  {
    // Restores the reached tensors when it goes, also when tracing throws.
    TraceSession session(graph, options);
    std::vector<at::Tensor> traced(inputs.size());
    std::vector<bool> wrapped(inputs.size(), false);
    for (size_t i = 0; i < inputs.size(); ++i) {
      const TraceInput& in = inputs[i];
      if (!in.tensor.defined())
        throw TraceError("input " + std::to_string(i) + " (" + in.name + ") is an undefined tensor");
      if (in.spec.duplicate_of) {
        traced[i] = traced.at(*in.spec.duplicate_of);
        graph.add_placeholder(in.name, ir::TensorMeta::of(in.tensor), in.spec);
        continue;
      }
      at::Tensor t = session.add_input(in);
      wrapped[i] = options.functionalize && !in.reached;
      traced[i] = wrapped[i] ? at::functionalization::impl::to_functional_tensor(t) : t;
      if (!in.reached && in.tensor.requires_grad()) traced[i].requires_grad_(true);
    }

    std::vector<TraceOutput> outputs;
    {
      t_tracing = true;
      struct ResetFlag {
        ~ResetFlag() { t_tracing = false; }
      } reset_flag;
      ActiveTrace active(session);
      c10::impl::IncludeDispatchKeyGuard trace_on(c10::DispatchKey::Fake);
      std::optional<c10::impl::IncludeDispatchKeyGuard> functionalize_on;
      std::optional<at::functionalization::impl::FunctionalizationReapplyViewsGuard> reapply_views;
      std::optional<c10::impl::IncludeDispatchKeyGuard> writes_on;
      if (options.functionalize) {
        functionalize_on.emplace(c10::DispatchKey::Functionalize);
        reapply_views.emplace(true);
      }
      // See Note [Writes into reached tensors under functionalization].
      if (options.functionalize) writes_on.emplace(c10::DispatchKey::DeferredInit);

      try {
        outputs = hooks.body(traced);
      } catch (const c10::Error& e) {
        // See Note [Memory written outside the dispatcher] in trace_session.cpp.
        const std::string what = e.what_without_backtrace();
        if (what.find("data is not allocated yet") == std::string::npos &&
            what.find("doesn't have storage") == std::string::npos)
          throw;
        throw TraceError(
            "the traced function reached a tensor's memory directly (data_ptr(), an accessor, or at::tensor "
            "from C++ values, which fills a new tensor through data_ptr()), and tensors traced with "
            "functionalization or in fake mode have no memory (" +
            what.substr(0, what.find('\n')) +
            "); make that tensor outside the traced function (it is then read at every call) or build it with "
            "torch::tensor, whose writes are traced");
      }
      for (TraceOutput& g : session.gradients(hooks.parameter_gradients)) outputs.push_back(std::move(g));

      result.input_mutations.resize(inputs.size());
      if (options.functionalize) {
        // See Note [Functionalization].
        for (TraceOutput& o : outputs) {
          if (o.tensor.defined() && at::functionalization::impl::isFunctionalTensor(o.tensor)) {
            at::functionalization::impl::sync(o.tensor);
            o.tensor = at::functionalization::impl::from_functional_tensor(o.tensor);
          }
        }
        for (size_t i = 0; i < inputs.size(); ++i) {
          if (!wrapped[i]) continue;
          at::functionalization::impl::sync(traced[i]);
          auto* w = at::functionalization::impl::unsafeGetFunctionalWrapper(traced[i]);
          InputMutation& m = result.input_mutations[i];
          m.data = w->has_data_mutation();
          m.metadata = w->has_metadata_mutation();
          if (m.data || m.metadata)
            outputs.push_back(
                {at::functionalization::impl::from_functional_tensor(traced[i]),
                 ir::OutputSpec{m.data ? ir::OutputKind::MutatedInput : ir::OutputKind::MutatedInputMetadata, i}});
        }
      }
      // Outputs are mapped while the reached tensors are still swapped: one
      // the function read from outside and returns is lifted too.
      c10::impl::ExcludeDispatchKeyGuard no_trace(c10::DispatchKey::Fake);
      for (size_t o = 0; o < outputs.size(); ++o) {
        if (!outputs[o].tensor.defined())
          throw TraceError("output " + std::to_string(o) + " of the traced function is an undefined tensor");
        values.push_back(session.value_of(outputs[o].tensor, "output " + std::to_string(o)));
        specs.push_back(outputs[o].spec);
      }
    }
    result.input_mutations.resize(graph.placeholders().size());
    reached = session.reached_placeholders();
    session.restore();
    // The function's results, and the autograd graphs they hold, go before
    // settle_lifted asks which lifted tensors are still held elsewhere.
    outputs.clear();
    traced.clear();
    graph.set_output(values);
    graph.signature().outputs = specs;
    if (options.functionalize) functionalize_state_writes(graph, reached, result.input_mutations);
    result.lifted = session.settle_lifted(result.input_mutations);
    result.stand_in_ops = session.stand_in_ops();
  }
  result.mode = options.mode;
  return result;
}

// Holds the warnings of a fake-mode attempt: they reach the handler that was
// in place only if the attempt is kept.
class HeldWarnings final : public c10::WarningHandler {
 public:
  HeldWarnings() : outer_(c10::WarningUtils::get_warning_handler()) {}
  void process(const c10::Warning& warning) override { held_.push_back(warning); }
  void release() {
    for (const c10::Warning& w : held_) outer_->process(w);
  }

 private:
  c10::WarningHandler* outer_;
  std::vector<c10::Warning> held_;
};

}  // namespace

// Note [Auto trace mode]
// A real-mode trace runs the function on copies of everything it reads:
// the module's parameters and buffers, the optimizer's state, and every
// activation of a training step, so compiling needed more memory than the
// step itself (GPT-2 small on a CPU: 8.7 GiB of peak RSS against eager's
// 3.6). A fake-mode trace computes nothing (3.3 GiB). TraceMode::Auto, the
// default, traces in fake mode and keeps the result unless that trace
// threw: a data-dependent op (at::equal, which real mode guards), an op
// without a Meta kernel that CPU stand-ins cannot run either (a CUDA-only
// kernel without a meta function). Real mode then says whatever it has to
// say: a function that fails in both fails with real mode's error. Fake
// tensors report their device (Note [Fake tensors] in trace_session.cpp),
// so autocast, dropout's fused kernel and attention's device-chosen kernel
// are traced as a real trace traces them.
// The attempt stops where it fails, so the function's own work after that
// point does not run twice. Then the function runs again on real copies; it
// runs twice, as any function traced twice (the metadata analysis and the
// graph trace) does, and code that keeps what it computes across runs must
// start afresh at each (collect_metadata's does).
TraceResult trace(const std::vector<TraceInput>& inputs, const TraceHooks& hooks, const TraceOptions& options) {
  if (options.mode != TraceMode::Auto) return trace_once(inputs, hooks, options);
  TraceOptions attempt = options;
  attempt.mode = TraceMode::Fake;
  std::string abandoned;
  {
    HeldWarnings held;
    std::optional<TraceResult> fake;
    {
      c10::WarningUtils::WarningHandlerGuard guard(&held);
      try {
        fake = trace_once(inputs, hooks, attempt);
      } catch (const std::exception& e) {
        const std::string what = e.what();
        abandoned = what.substr(0, what.find('\n'));
      }
    }
    if (fake) {
      held.release();
      return std::move(*fake);
    }
  }
  attempt.mode = TraceMode::Real;
  TraceResult result = trace_once(inputs, hooks, attempt);
  result.fake_mode_abandoned = std::move(abandoned);
  return result;
}

TORCH_LIBRARY_IMPL(_, Fake, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&trace_fallback>()); }
TORCH_LIBRARY_IMPL(_, DeferredInit, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&write_fallback>()); }

}  // namespace detail

bool is_fake(const at::Tensor& t) {
  if (!t.defined()) return false;
  if (at::functionalization::impl::isFunctionalTensor(t))
    return is_fake(at::functionalization::impl::unsafeGetFunctionalWrapper(t)->value());
  return t.has_storage() && t.storage().device_type() == c10::kMeta && !t.is_meta();
}

TraceResult make_fx(const TensorFn& fn, const std::vector<at::Tensor>& example_inputs, const TraceOptions& options) {
  std::vector<detail::TraceInput> inputs;
  for (size_t i = 0; i < example_inputs.size(); ++i)
    inputs.push_back({example_inputs[i], "arg" + std::to_string(i), ir::InputSpec{}});
  detail::mark_lifted_inputs(inputs, 0, options);
  detail::TraceHooks hooks;
  hooks.body = [&](const std::vector<at::Tensor>& traced) {
    std::vector<detail::TraceOutput> outs;
    for (at::Tensor& t : fn(traced)) outs.push_back({std::move(t), ir::OutputSpec{}});
    return outs;
  };
  return detail::trace(inputs, hooks, options);
}

TraceResult make_fx(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& x,
                    const TraceOptions& options) {
  return make_fx([&](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{fn(in[0])}; }, {x}, options);
}

TraceResult make_fx(const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& fn, const at::Tensor& x,
                    const at::Tensor& y, const TraceOptions& options) {
  return make_fx([&](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{fn(in[0], in[1])}; }, {x, y},
                 options);
}

}  // namespace crucible::tracer
