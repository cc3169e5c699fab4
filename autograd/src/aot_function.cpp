#include <crucible/autograd/aot_function.h>
#include <crucible/autograd/error.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <crucible/runtime/metrics.h>
#include <crucible/runtime/timing.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <mutex>
#include <sstream>
#include <unordered_map>

namespace crucible::autograd {

namespace {

void record_metrics(const std::string& compile_id, const char* kind, const ir::Graph& g, double compile_ms,
                    double backend_ms, std::string reason);
double elapsed_ms(std::chrono::steady_clock::time_point since);

// What the autograd path compiled for one input metadata.
// See Note [AOT dispatch].
struct CompiledGraphs : torch::CustomClassHolder {
  ir::CompiledFn forward;
  ir::Graph backward_graph;
  ir::Backend bw_compiler;
  std::once_flag backward_compiled;
  ir::CompiledFn backward;
  size_t num_outputs = 0;                 // fn's outputs
  std::vector<size_t> tangent_outputs;    // outputs that have a tangent, in order
  std::vector<ir::TensorMeta> tangent_meta;
  size_t num_saved = 0;
  std::vector<size_t> gradient_inputs;    // per backward output: the primal index
  size_t num_primals = 0;
  std::string compile_id;

  const ir::CompiledFn& compiled_backward(const std::vector<at::Tensor>& example_inputs) {
    std::call_once(backward_compiled, [&] {
      auto timed = runtime::default_phase_timer().time("bw_compiler");
      const auto start = std::chrono::steady_clock::now();
      backward = bw_compiler(backward_graph, example_inputs);
      record_metrics(compile_id, "backward", backward_graph, elapsed_ms(start), elapsed_ms(start), "first backward");
    });
    return backward;
  }
};

struct CompiledFunction : torch::autograd::Function<CompiledFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const c10::intrusive_ptr<CompiledGraphs>& graphs,
                                                at::TensorList primals) {
    std::vector<at::Tensor> args(primals.begin(), primals.end());
    std::vector<at::Tensor> results = graphs->forward(args);
    std::vector<at::Tensor> outs(results.begin(), results.begin() + static_cast<std::ptrdiff_t>(graphs->num_outputs));
    ctx->save_for_backward(torch::autograd::variable_list(
        results.begin() + static_cast<std::ptrdiff_t>(graphs->num_outputs), results.end()));
    ctx->saved_data["graphs"] = c10::IValue::make_capsule(graphs);
    // Outputs without a tangent do not depend differentiably on any input.
    std::vector<bool> differentiable(outs.size(), false);
    for (size_t i : graphs->tangent_outputs) differentiable[i] = true;
    torch::autograd::variable_list non_diff;
    for (size_t i = 0; i < outs.size(); ++i)
      if (!differentiable[i]) non_diff.push_back(outs[i]);
    if (!non_diff.empty()) ctx->mark_non_differentiable(non_diff);
    return outs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto graphs = c10::static_intrusive_pointer_cast<CompiledGraphs>(ctx->saved_data.at("graphs").toCapsule());
    std::vector<at::Tensor> inputs = ctx->get_saved_variables();
    for (size_t t = 0; t < graphs->tangent_outputs.size(); ++t) {
      const at::Tensor& g = grad_outputs.at(graphs->tangent_outputs[t]);
      const ir::TensorMeta& m = graphs->tangent_meta[t];
      // See Note [AOT dispatch]: zeros for an unused output, contiguous always.
      inputs.push_back(g.defined() ? g.contiguous()
                                   : at::zeros(m.sizes, at::TensorOptions().dtype(m.dtype).device(m.device)));
    }
    const ir::CompiledFn& bw = graphs->compiled_backward(inputs);
    std::vector<at::Tensor> grads = bw(inputs);
    // One entry per forward() argument: the graphs capsule, then each primal.
    torch::autograd::variable_list result(1 + graphs->num_primals);
    for (size_t i = 0; i < grads.size(); ++i) result[1 + graphs->gradient_inputs[i]] = grads[i];
    return result;
  }
};

// The key of Note [AOT cache guards].
std::string guard_key(const std::vector<at::Tensor>& inputs, bool grad_enabled) {
  std::ostringstream os;
  os << (grad_enabled ? 'G' : 'N');
  for (const auto& t : inputs) {
    if (!t.defined()) {
      os << "|undef";
      continue;
    }
    os << '|' << t.sizes() << t.strides() << c10::toString(t.scalar_type()) << t.device() << t.requires_grad();
  }
  return os.str();
}

// Copies the function can be traced on without touching the caller's tensors;
// they require grad as the originals do when `keep_requires_grad`.
std::vector<at::Tensor> detached_copies(const std::vector<at::Tensor>& inputs, bool keep_requires_grad = true) {
  std::vector<at::Tensor> out;
  out.reserve(inputs.size());
  for (const auto& t : inputs) out.push_back(t.detach().clone().requires_grad_(keep_requires_grad && t.requires_grad()));
  return out;
}

// One CompilationMetrics record for a compiled graph.
void record_metrics(const std::string& compile_id, const char* kind, const ir::Graph& g, double compile_ms,
                    double backend_ms, std::string reason) {
  runtime::CompilationMetrics m;
  m.compile_id = compile_id;
  m.kind = kind;
  for (const ir::Node* n : g.nodes()) {
    ++m.graph_node_count;
    m.graph_op_count += n->is_call();
    m.graph_input_count += n->is_placeholder();
  }
  m.compile_time_ms = compile_ms;
  m.backend_compile_time_ms = backend_ms;
  m.recompile_reason = std::move(reason);
  runtime::default_metrics_log().record(std::move(m));
}

double elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}

void require_no_input_mutation(const tracer::TraceResult& traced, const char* path) {
  for (size_t i = 0; i < traced.input_mutations.size(); ++i)
    if (traced.input_mutations[i].data || traced.input_mutations[i].metadata)
      throw AotError(std::string("aot_function: input ") + std::to_string(i) + " is mutated in place by the function (" +
                     (traced.input_mutations[i].data && traced.input_mutations[i].metadata ? "data and metadata"
                      : traced.input_mutations[i].data ? "data" : "metadata") + "); the " + path +
                     " path does not compile input mutations: make the function return the new value instead");
}

}  // namespace

namespace detail {

struct AotState {
  size_t id = 0;  // this function's number, for compile ids "function/compilation"
  tracer::TensorFn fn;
  AotConfig config;
  std::mutex mu;
  // guard key -> the compiled callable for those inputs
  std::unordered_map<std::string, ir::CompiledFn> cache;

  ir::CompiledFn compile_inference(const std::vector<at::Tensor>& inputs, const std::string& compile_id) {
    auto timed = runtime::default_phase_timer().time("aot_inference");
    const auto start = std::chrono::steady_clock::now();
    at::NoGradGuard no_grad;
    tracer::TraceOptions options;
    options.functionalize = true;
    options.decompositions = config.decompositions;
    const std::vector<at::Tensor> examples = detached_copies(inputs);
    tracer::TraceResult traced = tracer::make_fx(fn, examples, options);
    // Data mutations come back as extra outputs (OutputKind::MutatedInput);
    // the epilogue copies them into the caller's tensors, as the seed's
    // RuntimeWrapper does. Metadata mutations are refused.
    for (size_t i = 0; i < traced.input_mutations.size(); ++i)
      if (traced.input_mutations[i].metadata)
        throw AotError("aot_function: input " + std::to_string(i) +
                       " has its metadata mutated in place (sizes, strides or offset, e.g. transpose_); this is "
                       "not compiled yet: make the function return the new view instead");
    const ir::GraphSignature& sig = traced.graph.signature();
    std::vector<size_t> mutated_inputs;  // per extra output: the input it updates
    size_t num_outputs = 0;
    for (const auto& spec : sig.outputs) {
      if (spec.kind == ir::OutputKind::MutatedInput)
        mutated_inputs.push_back(*spec.input_index);
      else
        ++num_outputs;
    }
    const auto backend_start = std::chrono::steady_clock::now();
    ir::CompiledFn compiled = config.inference_compiler(traced.graph, examples);
    record_metrics(compile_id, "inference", traced.graph, elapsed_ms(start), elapsed_ms(backend_start),
                   compile_id.ends_with("/0") ? "first call" : "input metadata changed");
    return [compiled = std::move(compiled), num_outputs, mutated_inputs](std::vector<at::Tensor>& args) {
      at::NoGradGuard no_grad;
      // The compiled callable may steal its inputs: keep the caller's tensors.
      const std::vector<at::Tensor> originals = mutated_inputs.empty() ? std::vector<at::Tensor>() : args;
      // See Note [Duplicated inputs].
      for (size_t i : mutated_inputs)
        for (size_t j = 0; j < originals.size(); ++j)
          if (j != i && originals[j].defined() && originals[j].is_alias_of(originals[i]))
            throw AotError("aot_function: input " + std::to_string(i) + " is mutated in place and shares storage with input " +
                           std::to_string(j) + "; aliased mutated inputs are not compiled yet: pass distinct tensors");
      std::vector<at::Tensor> outs = compiled(args);
      for (size_t k = 0; k < mutated_inputs.size(); ++k) originals[mutated_inputs[k]].copy_(outs[num_outputs + k]);
      outs.resize(num_outputs);
      return outs;
    };
  }

  ir::CompiledFn compile_autograd(const std::vector<at::Tensor>& inputs, const std::string& compile_id) {
    auto timed = runtime::default_phase_timer().time("aot_autograd");
    const auto start = std::chrono::steady_clock::now();
    const std::vector<at::Tensor> primals = detached_copies(inputs);
    // Metadata pass: input mutations (a functionalized trace without
    // gradients), then which outputs need a tangent, and their shapes.
    {
      tracer::TraceOptions options;
      options.functionalize = true;
      options.decompositions = config.decompositions;
      require_no_input_mutation(tracer::make_fx(fn, detached_copies(inputs, false), options), "autograd");
    }
    const std::vector<at::Tensor> probe_outs = fn(detached_copies(inputs));
    auto graphs = c10::make_intrusive<CompiledGraphs>();
    graphs->num_outputs = probe_outs.size();
    graphs->num_primals = primals.size();
    graphs->bw_compiler = config.bw_compiler;
    graphs->compile_id = compile_id;
    std::vector<at::Tensor> tangents;
    for (size_t i = 0; i < probe_outs.size(); ++i)
      if (probe_outs[i].requires_grad()) {
        graphs->tangent_outputs.push_back(i);
        tangents.push_back(at::ones(probe_outs[i].sizes(), probe_outs[i].options().requires_grad(false)));
        graphs->tangent_meta.push_back(ir::TensorMeta::of(tangents.back()));
      }
    std::vector<size_t> wrt;
    for (size_t i = 0; i < primals.size(); ++i)
      if (primals[i].requires_grad()) wrt.push_back(i);

    // The joint function; records which primals got a gradient.
    std::vector<size_t> grad_of;
    const size_t num_primals = primals.size();
    tracer::TensorFn joint = [&](const std::vector<at::Tensor>& all) {
      std::vector<at::Tensor> ps(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(num_primals));
      std::vector<at::Tensor> ts(all.begin() + static_cast<std::ptrdiff_t>(num_primals), all.end());
      std::vector<at::Tensor> outs = fn(ps);
      torch::autograd::variable_list diff_outs, grad_inputs;
      for (size_t i : graphs->tangent_outputs) diff_outs.push_back(outs.at(i));
      for (size_t i : wrt) grad_inputs.push_back(ps[i]);
      torch::autograd::variable_list grads =
          torch::autograd::grad(diff_outs, grad_inputs, ts, /*retain_graph=*/false, /*create_graph=*/false,
                                /*allow_unused=*/true);
      grad_of.clear();
      for (size_t k = 0; k < grads.size(); ++k)
        if (grads[k].defined()) {
          outs.push_back(grads[k]);
          grad_of.push_back(wrt[k]);
        }
      return outs;
    };
    std::vector<at::Tensor> joint_inputs = primals;
    joint_inputs.insert(joint_inputs.end(), tangents.begin(), tangents.end());
    tracer::TraceOptions options;
    options.functionalize = true;
    options.decompositions = config.decompositions;
    std::optional<runtime::PhaseTimer::Scope> phase(runtime::default_phase_timer().time("trace_joint"));
    tracer::TraceResult traced = tracer::make_fx(joint, joint_inputs, options);
    phase.reset();
    ir::Graph& g = traced.graph;
    // Mark the joint graph per Note [Joint graph contract].
    for (size_t i = num_primals; i < joint_inputs.size(); ++i) g.signature().inputs[i].kind = ir::InputKind::Tangent;
    for (size_t k = 0; k < grad_of.size(); ++k)
      g.signature().outputs[graphs->num_outputs + k] = ir::OutputSpec{ir::OutputKind::Gradient, grad_of[k]};

    phase.emplace(runtime::default_phase_timer().time("partition"));
    partitioner::PartitionResult parts = config.partition_fn(g, graphs->num_outputs);
    phase.reset();
    graphs->num_saved = parts.saved_values.size();
    graphs->gradient_inputs = parts.gradient_inputs;
    phase.emplace(runtime::default_phase_timer().time("fw_compiler"));
    const auto backend_start = std::chrono::steady_clock::now();
    graphs->forward = config.fw_compiler(parts.forward, primals);
    const double backend_ms = elapsed_ms(backend_start);
    phase.reset();
    record_metrics(compile_id, "forward", parts.forward, elapsed_ms(start), backend_ms,
                   compile_id.ends_with("/0") ? "first call" : "input metadata changed");
    graphs->backward_graph = std::move(parts.backward);
    return [graphs](std::vector<at::Tensor>& args) {
      std::vector<at::Tensor> outs = CompiledFunction::apply(graphs, at::TensorList(args));
      return outs;
    };
  }
};

}  // namespace detail

std::vector<at::Tensor> AotFunction::operator()(const std::vector<at::Tensor>& inputs) const {
  const bool grad_enabled = at::GradMode::is_enabled();
  bool needs_grad = false;
  for (const auto& t : inputs) needs_grad |= t.defined() && t.requires_grad();
  needs_grad &= grad_enabled;
  const std::string key = guard_key(inputs, grad_enabled);
  ir::CompiledFn fn;
  {
    std::lock_guard lock(state_->mu);
    auto it = state_->cache.find(key);
    if (it == state_->cache.end()) {
      if (state_->config.recompile_limit && state_->cache.size() >= *state_->config.recompile_limit)
        throw AotError("aot_function: the inputs' metadata (" + key + ") matches none of the " +
                       std::to_string(state_->cache.size()) +
                       " compiled versions and recompile_limit is reached; raise the limit or keep input "
                       "sizes, dtypes, devices and requires_grad fixed");
      const std::string compile_id = std::to_string(state_->id) + "/" + std::to_string(state_->cache.size());
      // See Note [RNG during compilation].
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      c10::intrusive_ptr<c10::TensorImpl> rng_state;
      {
        std::lock_guard gen_lock(gen.mutex());
        rng_state = gen.get_state().getIntrusivePtr();
      }
      ir::CompiledFn compiled_fn;
      try {
        compiled_fn =
            needs_grad ? state_->compile_autograd(inputs, compile_id) : state_->compile_inference(inputs, compile_id);
      } catch (...) {
        std::lock_guard gen_lock(gen.mutex());
        gen.set_state(at::Tensor(rng_state));
        throw;
      }
      {
        std::lock_guard gen_lock(gen.mutex());
        gen.set_state(at::Tensor(rng_state));
      }
      it = state_->cache.emplace(key, std::move(compiled_fn)).first;
    }
    fn = it->second;
  }
  std::vector<at::Tensor> args = inputs;
  return fn(args);
}

size_t AotFunction::num_compilations() const {
  std::lock_guard lock(state_->mu);
  return state_->cache.size();
}

AotFunction aot_function(tracer::TensorFn fn, AotConfig config) {
  AotFunction f;
  static std::atomic<size_t> next_id{0};
  f.state_ = std::make_shared<detail::AotState>();
  f.state_->id = next_id++;
  f.state_->fn = std::move(fn);
  f.state_->config = std::move(config);
  return f;
}

}  // namespace crucible::autograd
