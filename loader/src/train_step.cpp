// See crucible/loader/train_step.h.
#include <crucible/loader/train_step.h>

#include <crucible/inductor/options.h>
#include <crucible/inductor/package.h>
#include <crucible/ir/backend.h>
#include <crucible/ir/interpreter.h>
#include <crucible/ir/parser.h>
#include <crucible/runtime/disk_cache.h>
#include <crucible/runtime/package.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/irange.h>
#include <torch/nn/module.h>
#include <torch/serialize.h>

#include <algorithm>
#include <mutex>
#include <sstream>
#include <unordered_map>

namespace crucible {

namespace detail {

struct LoadedStepState {
  runtime::PackageManifest manifest;
  ir::CompiledFn fn;
  // Per placeholder: the tensor bound to it (undefined for the batch's,
  // and for the optimizer state of a package without state.pt until
  // ensure_state runs).
  std::vector<at::Tensor> bound;
  std::vector<at::Tensor> example_batch;
  std::shared_ptr<torch::nn::Module> module;  // kept alive where bound
  // A package without state.pt: its optimizer state, zeros as a fresh
  // optimizer's, made at the first step rather than at load (as
  // torch::optim makes its state lazily): GPT-2 small's Adam state is
  // 1 GB, 0.2 s of page faults a load would otherwise pay.
  std::once_flag zero_state;
  bool has_state = true;
  void ensure_state() {
    if (has_state) return;
    std::call_once(zero_state, [this] {
      for (const auto i : c10::irange(manifest.inputs.size())) {
        const runtime::PackageInput& in = manifest.inputs[i];
        if (in.kind != ir::InputKind::State || in.duplicate_of) continue;
        bound[i] = at::zeros(in.sizes, at::TensorOptions().dtype(in.dtype).device(in.device));
        if (in.value) bound[i].fill_(*in.value);
      }
      for (const auto i : c10::irange(manifest.inputs.size()))
        if (const auto& d = manifest.inputs[i].duplicate_of; d && manifest.inputs[i].kind == ir::InputKind::State)
          bound[i] = bound[*d];
    });
  }
};

}  // namespace detail

namespace {

std::vector<at::Tensor> loaded(const std::string& dir, const runtime::PackageManifest& m, const std::string& name) {
  std::vector<at::Tensor> tensors;
  std::istringstream in(runtime::read_package_file(dir, m, name));
  try {
    torch::load(tensors, in);
  } catch (const c10::Error& e) {
    throw runtime::PackageError("package: " + dir + "/" + name + " does not load: " + e.what_without_backtrace());
  }
  return tensors;
}

std::string describe(c10::ScalarType dtype, at::IntArrayRef sizes, c10::Device device) {
  std::ostringstream os;
  os << c10::toString(dtype) << sizes << " on " << device;
  return os.str();
}

// Throws unless `t` has the metadata `in` declares.
void check(const at::Tensor& t, const runtime::PackageInput& in, const std::string& what) {
  if (t.scalar_type() == in.dtype && t.sizes().vec() == in.sizes && t.device() == in.device) return;
  throw runtime::PackageError(
      "load_train_step: " + what + " is " + describe(t.scalar_type(), t.sizes(), t.device()) +
      "; the package was exported for " + describe(in.dtype, in.sizes, in.device) +
      (in.kind == ir::InputKind::UserInput ? " (export again for batches of these sizes)" : ""));
}

ir::CompiledFn backend_fn(const std::string& dir, const runtime::PackageManifest& m) {
  if (m.backend == "interpreter") return ir::interpret(ir::parse(runtime::read_file(dir + "/graph.txt")));
  if (m.backend == "inductor" || m.backend == "inductor-cudagraphs")
    return inductor::load_compiled(dir, inductor::InductorOptions::from_environment());
  throw runtime::PackageError("load_train_step: the package in " + dir + " is for backend " + m.backend +
                              ", which this loader cannot run (it runs the interpreter's and the inductor's)");
}

}  // namespace

LoadedTrainStep load_train_step(const std::string& dir, std::shared_ptr<torch::nn::Module> module,
                                const std::vector<std::pair<std::string, at::Tensor>>& lifted) {
  auto s = std::make_shared<detail::LoadedStepState>();
  s->manifest = runtime::read_manifest(dir);
  const std::vector<runtime::PackageInput>& inputs = s->manifest.inputs;
  std::unordered_map<std::string, at::Tensor> own;
  if (module) {
    for (const auto& p : module->named_parameters()) own.emplace(p.key(), p.value().detach());
    for (const auto& b : module->named_buffers()) own.emplace(b.key(), b.value().detach());
  }
  // The tensor files are read only where bound (Note [Exported training
  // step]): a module's own weights, and zeros for a package without state.
  const runtime::PackageManifest& m = s->manifest;
  if (!module && !m.files.contains("module.pt"))
    throw runtime::PackageError("load_train_step: the package in " + dir +
                                " holds no weights (exported without ExportOptions::state): pass the module to train");
  const std::vector<at::Tensor> module_state = module ? std::vector<at::Tensor>{} : loaded(dir, m, "module.pt");
  const bool has_state = s->has_state = m.files.contains("state.pt");
  const std::vector<at::Tensor> state = has_state ? loaded(dir, m, "state.pt") : std::vector<at::Tensor>{};
  std::unordered_map<std::string, at::Tensor> given;
  for (const auto& [name, t] : lifted) {
    const bool read = std::any_of(inputs.begin(), inputs.end(), [&](const runtime::PackageInput& in) {
      return in.kind == ir::InputKind::Lifted && in.name == name;
    });
    if (!read)
      throw runtime::PackageError("load_train_step: the package's step reads no lifted tensor '" + name +
                                  "' (LoadedTrainStep::named_lifted_inputs lists those it reads)");
    given.emplace(name, t.detach());
  }
  // lifted.pt holds every lifted tensor's value at export, in order; it is
  // read only where one is not given.
  std::vector<at::Tensor> lifted_at_export;
  size_t next_module = 0, next_state = 0, next_lifted = 0;
  s->bound.resize(inputs.size());
  for (const auto i : c10::irange(inputs.size())) {
    const runtime::PackageInput& in = inputs[i];
    if (in.duplicate_of) {
      s->bound[i] = s->bound.at(*in.duplicate_of);  // a State one's again in ensure_state
      continue;
    }
    switch (in.kind) {
      case ir::InputKind::Parameter:
      case ir::InputKind::Buffer: {
        if (!module) {
          if (next_module >= module_state.size())
            throw runtime::PackageError("package: " + dir + "/module.pt holds fewer tensors than the graph reads");
          s->bound[i] = module_state[next_module++];
          check(s->bound[i], in, "module.pt's " + in.name);
          break;
        }
        const auto it = own.find(in.name);
        if (it == own.end())
          throw runtime::PackageError("load_train_step: the module has no parameter or buffer '" + in.name +
                                      "', which the package trains: load it with the module it was exported from");
        check(it->second, in, "the module's " + in.name);
        s->bound[i] = it->second;
        break;
      }
      case ir::InputKind::State:
        if (!has_state) break;  // ensure_state, at the first step
        if (next_state >= state.size())
          throw runtime::PackageError("package: " + dir + "/state.pt holds fewer tensors than the graph reads");
        s->bound[i] = state[next_state++];
        check(s->bound[i], in, "state.pt's " + in.name);
        break;
      case ir::InputKind::Lifted:
        if (const auto it = given.find(in.name); it != given.end()) {
          check(it->second, in, "lifted tensor '" + in.name + "'");
          s->bound[i] = it->second;
        } else {
          if (!m.files.contains("lifted.pt"))
            throw runtime::PackageError("load_train_step: the package in " + dir + " reads '" + in.name +
                                        "' from outside the module and holds no value of it (exported without "
                                        "ExportOptions::state): pass it to load_train_step's `lifted`");
          if (lifted_at_export.empty()) lifted_at_export = loaded(dir, m, "lifted.pt");
          if (next_lifted >= lifted_at_export.size())
            throw runtime::PackageError("package: " + dir + "/lifted.pt holds fewer tensors than the graph reads");
          s->bound[i] = lifted_at_export[next_lifted];
          check(s->bound[i], in, "lifted.pt's " + in.name);
        }
        ++next_lifted;
        break;
      case ir::InputKind::UserInput:
        break;  // the batch's, at each call
      default:
        throw runtime::PackageError("package: " + dir + ": input " + in.name + " is of kind " +
                                    std::string(ir::to_string(in.kind)) + ", which no loaded step binds");
    }
  }
  s->example_batch = loaded(dir, m, "example_batch.pt");
  s->fn = backend_fn(dir, s->manifest);
  s->module = std::move(module);
  LoadedTrainStep step;
  step.state_ = std::move(s);
  return step;
}

at::Tensor LoadedTrainStep::operator()(const std::vector<at::Tensor>& batch) const {
  const std::vector<runtime::PackageInput>& specs = state_->manifest.inputs;
  state_->ensure_state();
  std::vector<at::Tensor> inputs = state_->bound;
  size_t next = 0;
  for (const auto i : c10::irange(specs.size())) {
    if (specs[i].kind != ir::InputKind::UserInput || specs[i].duplicate_of) continue;
    if (next >= batch.size())
      throw runtime::PackageError("LoadedTrainStep: the batch holds " + std::to_string(batch.size()) +
                                  " tensors; the package's step takes more");
    check(batch[next], specs[i], "batch tensor " + std::to_string(next));
    inputs[i] = batch[next++].detach();
  }
  if (next != batch.size())
    throw runtime::PackageError("LoadedTrainStep: the batch holds " + std::to_string(batch.size()) +
                                " tensors; the package's step takes " + std::to_string(next));
  for (const auto i : c10::irange(specs.size()))
    if (specs[i].duplicate_of && specs[i].kind == ir::InputKind::UserInput) inputs[i] = inputs[*specs[i].duplicate_of];
  // The graph differentiates itself (Note [Train step graph]); as in the
  // process, its ops run without autograd recording them.
  const c10::AutoGradMode no_grad(false);
  return state_->fn(inputs).at(0);
}

const std::vector<at::Tensor>& LoadedTrainStep::example_batch() const { return state_->example_batch; }

std::vector<std::pair<std::string, at::Tensor>> LoadedTrainStep::named_module_state() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto i : c10::irange(state_->manifest.inputs.size())) {
    const runtime::PackageInput& in = state_->manifest.inputs[i];
    if (!in.duplicate_of && (in.kind == ir::InputKind::Parameter || in.kind == ir::InputKind::Buffer))
      out.emplace_back(in.name, state_->bound[i]);
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> LoadedTrainStep::named_lifted_inputs() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto i : c10::irange(state_->manifest.inputs.size())) {
    const runtime::PackageInput& in = state_->manifest.inputs[i];
    if (!in.duplicate_of && in.kind == ir::InputKind::Lifted) out.emplace_back(in.name, state_->bound[i]);
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> LoadedTrainStep::named_optimizer_state() const {
  state_->ensure_state();
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto i : c10::irange(state_->manifest.inputs.size())) {
    const runtime::PackageInput& in = state_->manifest.inputs[i];
    if (!in.duplicate_of && in.kind == ir::InputKind::State) out.emplace_back(in.name, state_->bound[i]);
  }
  return out;
}

}  // namespace crucible
