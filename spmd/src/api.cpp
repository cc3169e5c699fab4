// See api.h.
#include "fully_shard.h"
#include "group_state.h"

#include <crucible/autograd/aot_module.h>
#include <crucible/ir/hash.h>
#include <crucible/ir/instrument.h>
#include <crucible/spmd/api.h>
#include <crucible/spmd/collectives.h>
#include <crucible/spmd/error.h>
#include <crucible/tracer/functional_call.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>
#include <utility>

namespace crucible::spmd {

namespace detail {

struct SpmdState {
  ProcessGroup group;
  std::optional<pipeline::TrainStep> step;
  std::shared_ptr<torch::nn::Module> module;
  std::mutex mu;
  std::optional<SpmdReport> report;
  bool broadcast_buffers = true;
  // This compilation's graph hash was exchanged with the other ranks (Note
  // [A rank that fails to compile]).
  bool hash_exchanged = false;
  // The module state indices (tracer::module_state order) of the buffers
  // some compilation of the step writes: Note [Buffers across ranks].
  std::set<size_t> written_buffers;
  // FullyShard's parameters (Note [Fully-sharded step]); null under Replicate.
  std::shared_ptr<FullyShard> fully_shard;

  explicit SpmdState(ProcessGroup g) : group(std::move(g)) {}

  // Under FullyShard, the model as shards: at compile, and again after
  // SpmdStep::unshard().
  void shard() const {
    if (fully_shard && !fully_shard->sharded()) fully_shard->shard(step->optimizer_state());
  }

  std::vector<at::Tensor> flat_state() const {
    std::vector<at::Tensor> flat = autograd::module_state(*module);
    for (const at::Tensor& t : step->optimizer_state().flat()) flat.push_back(t);
    return flat;
  }
};

}  // namespace detail

namespace {

void apply_overrides(torch::nn::Module& parent, const std::string& prefix,
                     const std::vector<std::shared_ptr<Override>>& overrides) {
  for (const auto& item : parent.named_children()) {
    const std::string fqn = prefix.empty() ? item.key() : prefix + "." + item.key();
    std::shared_ptr<torch::nn::Module> child = item.value();
    bool replaced = false;
    for (const auto& o : overrides) {
      std::shared_ptr<torch::nn::Module> r = o->replacement(fqn, child);
      if (!r) throw SpmdError("spmd::compile: an Override returned no module for \"" + fqn + "\"");
      if (r != child) {
        parent.replace_module(item.key(), r);
        child = r;
        replaced = true;
      }
    }
    if (!replaced) apply_overrides(*child, fqn, overrides);
  }
}

// Every rank starts from rank 0's state, as DDP's constructor broadcasts it.
void broadcast_state(const ProcessGroup& group, const std::vector<at::Tensor>& state) {
  if (group.size() == 1) return;
  const bool cuda = group.backend() == "nccl";
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> staged;
  for (const at::Tensor& t : state)
    staged.push_back(t.is_cuda() == cuda ? t.detach() : t.detach().to(cuda ? at::kCUDA : at::kCPU));
  group.broadcast(staged, 0);
  for (size_t i = 0; i < state.size(); ++i)
    if (!staged[i].is_same(state[i])) state[i].detach().copy_(staged[i]);
}

// Note [Buffers across ranks]
// The step updates buffers (batch norm's running statistics) from each
// rank's own shard, so left alone the ranks' buffers drift apart, and a
// model evaluated on two ranks gives two answers. DDP (broadcast_buffers,
// its default) copies rank 0's buffers to every rank before each forward;
// SpmdStep does the same before each step, outside the graph: the buffers
// are the graph's inputs, and a host-side broadcast needs no change to the
// traced step nor to its hash. After a step each rank holds rank 0's
// buffers as they were before it, updated by its own shard, exactly as
// under DDP; in training mode batch norm normalizes with the batch's
// statistics, so the broadcast changes no loss or gradient. Only buffers a
// compilation of the step writes (a trailing copy_ into its placeholder)
// are broadcast: every rank starts from rank 0's state, so the others stay
// equal, and GPT-2's causal masks (48 MiB) would cost a broadcast each
// step for nothing. The buffers are packed into one tensor per dtype and
// device (DDP coalesces them too), so ResNet-18's 60 buffers cost two
// broadcasts a step (float32 and int64), and unpacked by one _foreach_copy_
// (one kernel on a GPU). On NCCL the broadcasts are waited for as the
// step's all_reduces are (Note [Waiting for NCCL]): the stream waits, and
// the host goes on launching the step, whose end blocks on them within the
// timeout. A blocking wait here would hold the host until the previous
// step's update had run, and ResNet-18's step is bound by the host.

// The indices in tracer::module_state order of the module buffers `g` (a
// training step's graph, Note [Train step graph]) writes back.
std::set<size_t> buffers_written(const ir::Graph& g, const tracer::ModuleState& state) {
  const std::vector<bool> written_inputs = ir::placeholders_written(g);
  std::set<size_t> written;
  for (size_t i = state.num_parameters; i < state.tensors.size() && i < written_inputs.size(); ++i)
    if (written_inputs[i]) written.insert(i);
  return written;
}

void broadcast_buffers(const ProcessGroup& group, const torch::nn::Module& module, const std::set<size_t>& which) {
  if (group.size() == 1 || which.empty()) return;
  const tracer::ModuleState state = tracer::module_state(module);
  std::vector<std::vector<at::Tensor>> packs;  // buffers of one dtype and device
  for (size_t i : which) {
    const at::Tensor b = state.tensors.at(i).tensor.detach();
    auto same = [&](const std::vector<at::Tensor>& pack) {
      return pack.front().scalar_type() == b.scalar_type() && pack.front().device() == b.device();
    };
    auto it = std::find_if(packs.begin(), packs.end(), same);
    if (it == packs.end())
      packs.push_back({b});
    else
      it->push_back(b);
  }
  at::NoGradGuard no_grad;
  const bool cuda = group.backend() == "nccl";
  for (const std::vector<at::Tensor>& pack : packs) {
    std::vector<at::Tensor> pieces;
    std::vector<int64_t> sizes;
    for (const at::Tensor& b : pack) {
      pieces.push_back(b.reshape({-1}));
      sizes.push_back(b.numel());
    }
    at::Tensor flat = at::cat(pieces);
    if (flat.is_cuda() != cuda) flat = flat.to(cuda ? at::kCUDA : at::kCPU);
    detail::broadcast_awaited(group, flat, 0, "SpmdStep: the broadcast of rank 0's buffers");
    std::vector<at::Tensor> parts = flat.split_with_sizes(sizes);
    for (size_t i = 0; i < parts.size(); ++i) parts[i] = parts[i].view(pack[i].sizes());
    at::_foreach_copy_(pack, parts);
  }
}

// Note [A rank that fails to compile]
// Every rank compiles the step itself, and the data_parallel pass compares
// the ranks' graph hashes (all_gather_string) before any collective runs. A
// rank whose compilation fails before that (its trace met a data-dependent
// op on its own shard, an ATen error in its loss) never publishes a hash:
// the others would wait for it in the store for the whole timeout and then
// report only that it "did not publish", without its reason. This
// instrument sees each compilation of the step end: one that failed before
// its hash was exchanged publishes "compile failed: <error>" in the hash's
// place, without waiting, and the others fail at once with the rank's own
// error. A failure after the exchange (the backend's compiler) leaves the
// others to the step's collectives, which time out as for a dead rank.
constexpr std::string_view kCompileFailed = "compile failed: ";

class CompileFailures : public ir::Instrument {
 public:
  explicit CompileFailures(std::weak_ptr<detail::SpmdState> state) : state_(std::move(state)) {}
  void before_stage(const ir::StageEvent& event) override {
    if (event.stage != "compile") return;
    if (auto s = state_.lock()) {
      std::lock_guard lock(s->mu);
      s->hash_exchanged = false;
    }
  }
  void after_stage(const ir::StageEvent& event) override {
    if (event.stage != "compile" || !event.failed) return;
    auto s = state_.lock();
    if (!s || s->group.size() == 1) return;
    {
      std::lock_guard lock(s->mu);
      if (s->hash_exchanged) return;
    }
    try {
      detail::publish_string(s->group, "graph_hash", std::string(kCompileFailed) + std::string(event.detail));
    } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch): the rank's own error is thrown anyway
    }
  }

 private:
  std::weak_ptr<detail::SpmdState> state_;
};

}  // namespace

SpmdStep compile(std::shared_ptr<torch::nn::Module> module, torch::optim::Optimizer& optimizer,
                 pipeline::LossFn loss_fn, SpmdOptions options) {
  if (!module) throw SpmdError("spmd::compile: the module is null");
  auto s = std::make_shared<detail::SpmdState>(resolve_process_group(options.parallel_mode.group));
  apply_overrides(*module, "", options.module_override);
  s->module = module;
  s->broadcast_buffers = options.broadcast_buffers;

  // See Note [Fully-sharded step]: the loss runs on whole parameters
  // gathered from the shards, and the update reads the gradients' shards.
  pipeline::TrainStepOptions step_options;
  if (options.parallel_mode.style == DataParallelStyle::FullyShard) {
    std::vector<at::Tensor> params;
    for (const torch::optim::OptimizerParamGroup& g : optimizer.param_groups())
      params.insert(params.end(), g.params().begin(), g.params().end());
    s->fully_shard = std::make_shared<detail::FullyShard>(s->group, options.parallel_mode.group, std::move(params),
                                                          options.parallel_mode.param_dtype);
    if (const std::optional<c10::ScalarType> dtype = options.parallel_mode.param_dtype)
      loss_fn = [dtype = *dtype, loss = std::move(loss_fn)](torch::nn::Module& m,
                                                            const std::vector<at::Tensor>& batch) {
        std::vector<at::Tensor> cast;
        for (const at::Tensor& t : batch) cast.push_back(t.is_floating_point() ? t.to(dtype) : t);
        return loss(m, cast);
      };
    step_options.around_loss = s->fully_shard->around_loss();
    step_options.around_pre_grad_trace = s->fully_shard->around_pre_grad_trace();
    step_options.gradient_hook = s->fully_shard->gradient_hook();
  } else {
    if (options.parallel_mode.param_dtype)
      throw SpmdError(
          "spmd::compile: DataParallelOptions::param_dtype is fully_shard's (the dtype parameters are "
          "gathered in); under replicate, run the loss under autocast (runtime::AutocastGuard) instead");
    step_options.gradient_hook = [](std::vector<at::Tensor> grads) {
      for (at::Tensor& g : grads)
        if (g.defined()) g = tag_grad(g);
      return grads;
    };
  }

  pipeline::Builder builder = options.builder;
  const ir::Pass expand{
      "data_parallel", [state = std::weak_ptr<detail::SpmdState>(s), options](ir::Graph& g) {
        auto s = state.lock();
        if (!s) throw SpmdError("spmd: the step was destroyed while it compiled");
        SpmdReport report;
        report.data_parallel = expand_data_parallel(g, options.parallel_mode);
        report.deduplicated = dedup_collectives(g);
        if (s->fully_shard) {
          report.fully_shard = schedule_fully_shard(g, options.parallel_mode);
          report.fully_shard.parameters = s->fully_shard->num_sharded();
        }
        for (const auto& o : options.module_override) o->transform(g, s->flat_state());
        if (options.gm_transformation) options.gm_transformation(g);
        // Ranks whose graphs differ would issue different collectives and hang
        // or compute garbage: compare before the first collective runs.
        report.graph_hash = ir::graph_hash(g, {.device_index = false}).hex();
        const std::set<size_t> written = buffers_written(g, tracer::module_state(*s->module));
        std::lock_guard lock(s->mu);
        s->written_buffers.insert(written.begin(), written.end());
        const std::vector<std::string> hashes = s->group.all_gather_string("graph_hash", report.graph_hash);
        s->hash_exchanged = true;
        for (size_t r = 0; r < hashes.size(); ++r)  // See Note [A rank that fails to compile].
          if (hashes[r].starts_with(kCompileFailed))
            throw SpmdError("spmd::compile: rank " + std::to_string(r) + " failed to compile the step (seen from " +
                            s->group.describe() + "): " + hashes[r].substr(kCompileFailed.size()));
        for (size_t r = 0; r < hashes.size(); ++r)
          if (hashes[r] != hashes[0])
            throw SpmdError("spmd::compile: rank " + std::to_string(r) + " compiled another graph than rank 0 (hash " +
                            hashes[r] + " vs " + hashes[0] + ", seen from " + s->group.describe() +
                            "): every rank must trace the same step on batches of the same sizes");
        s->report = std::move(report);
      }};
  builder.add_joint_pass(expand);
  builder.instrument(std::make_shared<CompileFailures>(s));
  s->step.emplace(pipeline::compile_train_step(module, optimizer, std::move(loss_fn), builder, step_options));
  broadcast_state(s->group, s->flat_state());
  s->step->adopt_step_counts();  // rank 0's counts are the optimizer's own on every rank
  s->shard();
  SpmdStep step;
  step.state_ = std::move(s);
  return step;
}

namespace {

// A rank's shard is often a slice of the global batch: its storage offset
// differs by rank, and the compiled graph would too (offsets are part of an
// input's metadata). Such inputs are copied to offset 0.
std::vector<at::Tensor> at_offset_zero(const std::vector<at::Tensor>& batch) {
  std::vector<at::Tensor> local;
  local.reserve(batch.size());
  for (const at::Tensor& t : batch) local.push_back(t.defined() && t.storage_offset() != 0 ? t.clone() : t);
  return local;
}

}  // namespace

at::Tensor SpmdStep::operator()(const std::vector<at::Tensor>& batch) const {
  state_->shard();
  detail::AwaitedCollectives awaited;  // See Note [Waiting for NCCL] in collectives.cpp.
  if (state_->broadcast_buffers) {     // See Note [Buffers across ranks].
    std::set<size_t> written;
    {
      std::lock_guard lock(state_->mu);
      written = state_->written_buffers;
    }
    broadcast_buffers(state_->group, *state_->module, written);
  }
  at::Tensor loss = (*state_->step)(at_offset_zero(batch));
  awaited.await();
  return loss;
}
void SpmdStep::compile(const std::vector<at::Tensor>& batch) const {
  state_->shard();
  state_->step->compile(at_offset_zero(batch));
}
const ir::Graph& SpmdStep::graph() const { return state_->step->graph(); }
const pipeline::TrainStep& SpmdStep::train_step() const { return *state_->step; }
const ProcessGroup& SpmdStep::group() const { return state_->group; }

void SpmdStep::unshard() const {
  if (state_->fully_shard) state_->fully_shard->unshard(state_->step->optimizer_state());
}

std::vector<std::pair<std::string, at::Tensor>> SpmdStep::full_state_dict() const {
  const bool keep = state_->group.rank() == 0;
  std::vector<std::pair<std::string, at::Tensor>> out;
  auto add = [&](const std::string& name, const at::Tensor& t) {
    const at::Tensor whole = state_->fully_shard ? state_->fully_shard->whole(t) : t;
    if (keep) out.emplace_back(name, whole.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true));
  };
  for (const auto& p : state_->module->named_parameters(/*recurse=*/true))
    if (p.value().defined()) add(p.key(), p.value());
  for (const auto& b : state_->module->named_buffers(/*recurse=*/true))
    if (b.value().defined()) add(b.key(), b.value());
  return out;
}

const SpmdReport& SpmdStep::report() const {
  std::lock_guard lock(state_->mu);
  if (!state_->report) throw SpmdError("SpmdStep::report: nothing is compiled yet; call the step first");
  return *state_->report;
}

}  // namespace crucible::spmd
