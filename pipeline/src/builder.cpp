// See Note [Compilation stages] in ir/instrument.h.
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/error.h>

#include <crucible/ir/interpreter.h>
#include <crucible/partitioner/default_partition.h>
#include <crucible/runtime/instruments.h>
#include <crucible/runtime/lifted_inputs.h>
#include <crucible/tracer/decomposition.h>
#include <crucible/tracer/error.h>
#include <crucible/tracer/functional_call.h>

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/nn/module.h>

#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>

namespace crucible::pipeline {
const std::vector<std::string>& Builder::default_passes() {
  static const std::vector<std::string> names = {"dce", "cse"};
  return names;
}

Builder::Builder() : partition_fn_(partitioner::default_partition), instruments_(runtime::default_instruments()) {
  passes(default_passes());
  backend(runtime::BackendRegistry::builtin().best().name);
}

Builder& Builder::trace_options(tracer::TraceOptions options) {
  decompositions_chosen_ = !options.decompositions.empty();
  trace_options_ = std::move(options);
  return *this;
}

tracer::TraceOptions Builder::trace_options() const {
  tracer::TraceOptions options = trace_options_;
  if (!decompositions_chosen_ && backend_decompositions_ == "core")
    options.decompositions = tracer::core_aten_decompositions();
  return options;
}

Builder& Builder::name_module(std::string name, const std::shared_ptr<torch::nn::Module>& module) {
  if (!module) throw PipelineError("Builder::name_module: the module named '" + name + "' is null");
  named_modules_.emplace_back(std::move(name), module);
  return *this;
}

Builder& Builder::decompositions(tracer::DecompositionTable table) {
  trace_options_.decompositions = std::move(table);
  decompositions_chosen_ = true;
  return *this;
}

Builder& Builder::passes(const std::vector<std::string>& names) {
  passes_ = ir::PassRegistry::builtin().passes(names);
  return *this;
}

Builder& Builder::pre_grad_passes(const std::vector<std::string>& names) {
  pre_grad_passes_ = ir::PassRegistry::builtin().passes(names);
  pre_grad_chosen_ = true;
  return *this;
}

Builder& Builder::joint_passes(const std::vector<std::string>& names) {
  joint_passes_ = ir::PassRegistry::builtin().passes(names);
  return *this;
}

Builder& Builder::passes(const std::vector<std::string>& names, const ir::PassRegistry& registry) {
  passes_ = registry.passes(names);
  user_compilers_ = true;
  return *this;
}

Builder& Builder::add_pass(ir::Pass pass) {
  passes_.push_back(std::move(pass));
  user_compilers_ = true;
  return *this;
}

Builder& Builder::add_joint_pass(ir::Pass pass) {
  joint_passes_.push_back(std::move(pass));
  user_compilers_ = true;
  return *this;
}

Builder& Builder::verify_passes(bool verify) {
  verify_passes_ = verify;
  return *this;
}

Builder& Builder::partitioner(partitioner::PartitionFn partition_fn) {
  if (!partition_fn) throw PipelineError("Builder::partitioner: the partition function is empty");
  partition_fn_ = std::move(partition_fn);
  return *this;
}

Builder& Builder::remat(std::optional<partitioner::MinCutOptions> options) {
  remat_ = std::move(options);
  remat_chosen_ = true;
  return *this;
}

Builder& Builder::backend(std::string_view name) {
  const runtime::BackendRegistry builtin = runtime::BackendRegistry::builtin();  // outlives the entry read from it
  set_backend(builtin.get(name));
  return *this;
}

Builder& Builder::backend(std::string_view name, const runtime::BackendRegistry& registry) {
  set_backend(registry.get(name));
  user_compilers_ = true;
  return *this;
}

void Builder::set_backend(const runtime::BackendInfo& info) {
  backend_name_ = info.name;
  backend_ = info.compile;
  backend_cuda_graphs_ = info.cuda_graphs;
  backend_cache_dir_ = info.cache_dir;
  backend_decompositions_ = info.decompositions;
  if (!pre_grad_chosen_) pre_grad_passes_ = ir::PassRegistry::builtin().passes(info.pre_grad_passes);
  if (!remat_chosen_) {
    remat_.reset();
    if (info.estimated_ms) remat_ = partitioner::MinCutOptions{.estimated_ms = info.estimated_ms};
  }
}

Builder& Builder::backend(std::string name, ir::Backend backend) {
  if (!backend) throw PipelineError("Builder::backend: backend '" + name + "' is an empty function");
  backend_name_ = std::move(name);
  backend_ = std::move(backend);
  backend_cuda_graphs_ = false;
  backend_cache_dir_.reset();
  backend_decompositions_.clear();
  if (!pre_grad_chosen_) pre_grad_passes_.clear();
  if (!remat_chosen_) remat_.reset();
  user_compilers_ = true;
  return *this;
}

Builder& Builder::add_wrapper(std::shared_ptr<runtime::GraphWrapper> wrapper) {
  if (!wrapper) throw PipelineError("Builder::add_wrapper: the wrapper is null");
  wrappers_.push_back(std::move(wrapper));
  user_compilers_ = true;
  return *this;
}

Builder& Builder::add_aot_wrapper(std::shared_ptr<autograd::AotWrapper> wrapper) {
  if (!wrapper) throw PipelineError("Builder::add_aot_wrapper: the wrapper is null");
  aot_wrappers_.push_back(std::move(wrapper));
  user_compilers_ = true;
  return *this;
}

Builder& Builder::compiler_key(std::string key) {
  compiler_key_ = std::move(key);
  return *this;
}

// See Note [Builder compiler key].
std::string Builder::compiler_key() const {
  if (compiler_key_) return *compiler_key_;
  if (user_compilers_) return {};
  std::string key = "backend=" + backend_name_;
  for (const auto& [phase, list] : {std::pair{";pre_grad=", &pre_grad_passes_}, std::pair{";joint=", &joint_passes_},
                                    std::pair{";passes=", &passes_}}) {
    if (list->empty() && std::string_view(phase) != ";passes=") continue;
    key += phase;
    for (size_t i = 0; i < list->size(); ++i) key += (i ? "," : "") + (*list)[i].name;
  }
  return key;
}

Builder& Builder::instrument(std::shared_ptr<ir::Instrument> instrument) {
  if (!instrument) throw PipelineError("Builder::instrument: the instrument is null");
  instruments_.push_back(std::move(instrument));
  return *this;
}

Builder& Builder::instruments(ir::Instruments instruments) {
  for (const auto& i : instruments)
    if (!i) throw PipelineError("Builder::instruments: an instrument of the list is null");
  instruments_ = std::move(instruments);
  return *this;
}

tracer::TraceResult Builder::trace(std::string_view graph_name,
                                   const std::function<tracer::TraceResult(const tracer::TraceOptions&)>& trace) const {
  tracer::TraceOptions options = trace_options();
  for (const auto& [name, weak] : named_modules_)
    if (std::shared_ptr<torch::nn::Module> m = weak.lock())
      for (tracer::NamedTensor& t : tracer::module_state(*m, name).tensors)
        options.source_names.push_back(std::move(t));
  return ir::run_stage(
      instruments_, ir::StageEvent{.stage = "trace"}, [&] { return trace(options); },
      [&](const tracer::TraceResult& r) {
        return std::vector<ir::StageGraph>{{graph_name, &r.graph}};
      });
}

void Builder::run_passes(ir::Graph& graph, std::string_view graph_name) const {
  run_passes(passes_, graph, graph_name);
}

void Builder::run_passes(const std::vector<ir::Pass>& passes, ir::Graph& graph, std::string_view graph_name) const {
  ir::PassManager(passes, ir::PassManagerOptions{verify_passes_, instruments_, std::string(graph_name)}).run(graph);
}

ir::CompiledFn Builder::run_backend(const ir::Graph& graph, const std::vector<at::Tensor>& example_inputs,
                                    std::string_view graph_name) const {
  const std::vector<ir::StageGraph> graphs = {{graph_name, &graph}};
  return ir::run_stage(
      instruments_, ir::StageEvent{.stage = "backend", .graphs = graphs},
      [&] {
        return wrappers_.empty() ? backend_(graph, example_inputs)
                                 : runtime::wrap_backend(wrappers_, backend_)(graph, example_inputs);
      },
      [&](const ir::CompiledFn&) { return graphs; }, /*changed=*/false);
}

ir::Backend Builder::graph_compiler(std::string graph_name) const {
  return [self = *this, graph_name = std::move(graph_name)](const ir::Graph& graph,
                                                            const std::vector<at::Tensor>& example_inputs) {
    ir::Graph g = graph.clone();
    self.run_passes(g, graph_name);
    return self.run_backend(g, example_inputs, graph_name);
  };
}

autograd::AotConfig Builder::aot_config() const {
  autograd::AotConfig config;
  config.fw_compiler = graph_compiler("forward");
  config.bw_compiler = graph_compiler("backward");
  config.inference_compiler = graph_compiler("inference");
  config.partition_fn = [self = *this](const ir::Graph& joint, size_t num_fwd_outputs) {
    std::optional<ir::Graph> rewritten;
    if (!self.joint_passes_.empty()) {
      rewritten.emplace(joint.clone());
      self.run_passes(self.joint_passes_, *rewritten, "joint");
    }
    return self.partition_fn_(rewritten ? *rewritten : joint, num_fwd_outputs);
  };
  if (!pre_grad_passes_.empty())
    config.pre_grad = [self = *this](const tracer::TensorFn& fn, const autograd::TraceFn& trace,
                                     const std::vector<at::Tensor>& args) {
      return self.pre_grad_function(fn, trace, args);
    };
  tracer::TraceOptions options = trace_options();
  config.decompositions = std::move(options.decompositions);
  config.freeze = options.freeze;
  config.trace_mode = options.mode;
  config.wrappers = aot_wrappers_;
  config.instruments = instruments_;
  config.named_modules = named_modules_;
  config.compiler_key = compiler_key();
  config.disk_cache_dir = backend_cache_dir_;
  return config;
}

// Note [Pre-grad graphs]
// The pre-grad passes need the function's forward graph before AOTAutograd
// differentiates and functionalizes it. AotConfig::pre_grad, called once per
// compilation with the real arguments, traces the function with the
// compilation's TraceFn (make_fx, or functional_call over the module) as the
// trace options say, neither functionalized nor decomposed (the ops as the
// program called them, as dynamo's graphs hold them: a pattern such as
// fuse_attention's sees aten::_softmax, not its decomposition; AOTAutograd's
// trace decomposes what the interpreter dispatches), runs the pre-grad
// passes over that graph, and hands AOTAutograd, in the function's place,
// one that runs the graph with the interpreter: AOTAutograd's own traces
// then record the ATen
// ops the interpreter dispatches, so they differentiate, functionalize and
// lift what the passes made. The tensors the forward graph lifted are read
// again from outside at each run (held weakly), so AOTAutograd lifts them
// in turn and guards them as usual.
//
// Note [Pre-grad traces that read values]
// Some of ATen's composite ops choose their kernel by whether an argument is
// "subclass-like" (a functional wrapper, a meta or fake tensor, which have no
// values to read): cross_entropy with label smoothing and class weights
// divides by the weights of the targets that are not ignored, gathered
// through masked_select (a data-dependent shape) for a plain tensor and with
// masked_fill for a subclass-like one. AOTAutograd's trace is functionalized
// (or on fake tensors), so it takes the second kernel; the pre-grad trace,
// not functionalized, gets real tensors and the first, which no graph can
// hold. ATen's cuDNN RNN on a GPU, likewise, points its weights at a
// flattened Storage with set_, which only a functionalized trace can hold.
// The passes are rewrites that keep the function's values, so where the
// pre-grad trace meets either the compilation goes on without them (with a
// warning where the user chose them) and AOTAutograd traces the function
// itself: it compiles if its own trace avoids the op, and refuses it by
// name if not.
//
// Note [Pre-grad graphs that autograd cannot replay]
// A pre-grad graph is differentiated by autograd recording the ATen ops the
// interpreter dispatches, so its gradient is the derivative of those ops.
// The function's own gradient may be another: a custom
// torch::autograd::Function's backward (a straight-through estimator, a
// gradient reversal layer; its forward's ops even run, and are traced, under
// no_grad, so the replay would not differentiate them at all), or a hook
// registered on an intermediate tensor (Tensor::register_hook scaling or
// clipping a gradient). The graph holds neither, so running it again would
// silently give other gradients. The pre-grad trace runs the function under
// autograd, so the autograd graph behind its outputs shows them: a node of a
// custom Function (CppNode<T>, the only node C++ custom Functions make) or a
// node carrying hooks other than a leaf's (a leaf's hooks stay on the input
// tensor the replay is given; retain_grad changes no gradient). Where there is one, the compilation goes on
// without the pre-grad passes (with a warning), and AOTAutograd traces the
// function itself, whose joint trace records the backward autograd runs,
// custom backwards and hooks included. Backwards that run inside the function
// (torch::autograd::grad in a loss) are traced as ops and replay as they ran.

namespace {

// Why autograd's graph behind `outputs` is not what autograd records for the
// ops of their trace (Note [Pre-grad graphs that autograd cannot replay]), or
// nullopt.
std::optional<std::string> unreplayable_autograd(const std::vector<at::Tensor>& outputs) {
  std::vector<torch::autograd::Node*> stack;
  std::unordered_set<torch::autograd::Node*> seen;
  for (const at::Tensor& t : outputs)
    if (t.defined() && t.grad_fn() && seen.insert(t.grad_fn().get()).second) stack.push_back(t.grad_fn().get());
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    const std::string name = node->name();
    constexpr std::string_view custom = "torch::autograd::CppNode<";
    if (name.rfind(custom, 0) == 0)
      return "the custom autograd Function " + name.substr(custom.size(), name.size() - custom.size() - 1) +
             " has a backward of its own";
    if (!dynamic_cast<torch::autograd::AccumulateGrad*>(node) &&
        (!node->tensor_pre_hooks().empty() || !node->pre_hooks().empty() || !node->post_hooks().empty()))
      return "a hook is registered on an intermediate tensor (the output of " + name + ")";
    for (const torch::autograd::Edge& e : node->next_edges())
      if (e.function && seen.insert(e.function.get()).second) stack.push_back(e.function.get());
  }
  return std::nullopt;
}

}  // namespace

tracer::TensorFn Builder::pre_grad_function(const tracer::TensorFn& fn, const autograd::TraceFn& trace,
                                            const std::vector<at::Tensor>& args) const {
  std::optional<tracer::TraceResult> traced;
  std::optional<std::string> unreplayable;  // Note [Pre-grad graphs that autograd cannot replay]
  const tracer::TensorFn inspected = [&fn, &unreplayable](const std::vector<at::Tensor>& in) {
    std::vector<at::Tensor> out = fn(in);
    unreplayable = unreplayable_autograd(out);
    return out;
  };
  // Note [Pre-grad traces that read values]: what only a functionalized
  // trace holds. The backend's own passes are an optimization the user
  // did not ask for: skipped quietly.
  auto skipped = [&](const char* what, const tracer::TraceError& e) {
    if (pre_grad_chosen_)
      TORCH_WARN("pre-grad passes skipped for this compilation: the forward traced without functionalization ", what,
                 " (", e.what(), "); Note [Pre-grad traces that read values]");
    return fn;
  };
  try {
    traced.emplace(this->trace("pre_grad", [&](const tracer::TraceOptions& options) {
      tracer::TraceOptions forward = options;
      forward.functionalize = false;
      forward.decompositions.clear();
      return trace(inspected, args, forward);
    }));
  } catch (const tracer::DataDependentError& e) {
    return skipped("reads tensor values", e);
  } catch (const tracer::NeedsFunctionalizationError& e) {
    return skipped("points a tensor at a Storage", e);
  }
  if (unreplayable) {
    if (pre_grad_chosen_)
      TORCH_WARN("pre-grad passes skipped for this compilation: ", *unreplayable,
                 ", which a graph of the forward's ops differentiated again would lose; Note [Pre-grad graphs that "
                 "autograd cannot replay]");
    return fn;
  }
  tracer::TraceResult& r = *traced;
  run_passes(pre_grad_passes_, r.graph, "pre_grad");
  std::vector<at::Tensor> lifted;
  std::vector<std::string> names;
  for (const tracer::LiftedTensor& l : r.lifted) {
    lifted.push_back(l.tensor);
    names.push_back(r.graph.signature().inputs.at(l.input_index).target);
  }
  auto graph = std::make_shared<const ir::Graph>(std::move(r.graph));
  auto interpreter = std::make_shared<const ir::Interpreter>(*graph);
  return [graph, interpreter,
          lifted = runtime::LiftedInputs(lifted, std::move(names))](const std::vector<at::Tensor>& in) {
    std::vector<at::Tensor> all = in;
    if (!lifted.append_to(all))
      throw PipelineError("pre-grad graph: " + lifted.freed() + " since the forward graph was traced");
    return interpreter->run(all);
  };
}

autograd::AotFunction Builder::compile(tracer::TensorFn fn) const {
  return autograd::aot_function(std::move(fn), aot_config());
}

autograd::AotModule Builder::compile(std::shared_ptr<torch::nn::Module> module, tracer::ModuleFn fn) const {
  return autograd::aot_module(std::move(module), std::move(fn), aot_config());
}

TrainStep Builder::compile_train_step(std::shared_ptr<torch::nn::Module> module, torch::optim::Optimizer& optimizer,
                                      LossFn loss_fn) const {
  return pipeline::compile_train_step(std::move(module), optimizer, std::move(loss_fn), *this);
}

}  // namespace crucible::pipeline
