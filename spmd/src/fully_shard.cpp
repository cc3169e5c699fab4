// See Note [Fully-sharded step] in data_parallel.h.
#include "fully_shard.h"

#include <crucible/ir/aliasing.h>
#include <crucible/ir/graph.h>
#include <crucible/ir/propagate_meta.h>
#include <crucible/spmd/collectives.h>
#include <crucible/spmd/data_parallel.h>
#include <crucible/spmd/error.h>

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace crucible::spmd::detail {

FullyShard::FullyShard(ProcessGroup group, std::string group_name, std::vector<at::Tensor> params,
                       std::optional<c10::ScalarType> param_dtype)
    : group_(std::move(group)), group_name_(std::move(group_name)), param_dtype_(param_dtype) {
  for (at::Tensor& t : params) {
    Param p;
    p.tensor = std::move(t);
    params_.push_back(std::move(p));
  }
}

// Rank r's chunk of `whole` (of p's whole sizes): rows [r * chunk, (r + 1) *
// chunk) of it padded with zero rows to world * chunk.
at::Tensor FullyShard::cut(const at::Tensor& whole, const Param& p) const {
  at::Tensor rows = whole.detach().reshape({p.rows, -1});
  const int64_t padded = p.chunk * group_.size();
  if (padded != p.rows) rows = at::constant_pad_nd(rows, {0, 0, 0, padded - p.rows});
  std::vector<int64_t> sizes = p.sizes.empty() ? std::vector<int64_t>{1} : p.sizes;
  sizes[0] = p.chunk;
  return rows.narrow(0, group_.rank() * p.chunk, p.chunk).reshape(sizes).clone(at::MemoryFormat::Contiguous);
}

// The whole parameter from the ranks' chunks concatenated (a view of it).
at::Tensor FullyShard::whole_of(const at::Tensor& gathered, const Param& p) const {
  at::Tensor whole = gathered.size(0) == p.rows ? gathered : gathered.narrow(0, 0, p.rows);
  return p.sizes.empty() ? whole.view({}) : whole;
}

namespace {

// A ParamState's tensors of the parameter's sizes (not the step count).
std::vector<const at::Tensor*> buffers_of(const pipeline::ParamState& s, c10::IntArrayRef sizes) {
  std::vector<const at::Tensor*> out;
  for (const at::Tensor* t : {&s.momentum_buffer, &s.exp_avg, &s.exp_avg_sq, &s.max_exp_avg_sq})
    if (t->defined() && t->sizes() == sizes) out.push_back(t);
  return out;
}

}  // namespace

void FullyShard::shard(const pipeline::OptimizerState& state) {
  if (sharded_) return;
  at::NoGradGuard no_grad;
  const int64_t world = group_.size();
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    p.sizes = p.tensor.sizes().vec();
    p.rows = p.sizes.empty() ? 1 : p.sizes[0];
    p.chunk = (p.rows + world - 1) / world;
    p.dtype = p.tensor.scalar_type();
    for (const at::Tensor* t : buffers_of(state.params.at(i), p.tensor.sizes())) t->set_data(cut(*t, p));
    p.tensor.set_data(cut(p.tensor, p));
  }
  sharded_ = true;
}

at::Tensor FullyShard::to_gather(const at::Tensor& shard) const {
  if (!param_dtype_) return shard;
  // The shard a trace reads is its plain copy of the parameter, never a
  // functional tensor, and so is all that the gather makes of it. Under
  // functionalization (AOTAutograd's analysis) a cast would wrap its result
  // in one, which set_data cannot put into the plain parameter: cast below
  // it.
  const c10::impl::ExcludeDispatchKeyGuard plain(c10::DispatchKey::Functionalize);
  return shard.to(*param_dtype_);
}

at::Tensor FullyShard::gather(const at::Tensor& shard, const Param& p) const {
  const at::Tensor gathered = wait_tensor(all_gather_into_tensor(shard.detach(), group_.size(), group_name_));
  return whole_of(gathered, p).clone(at::MemoryFormat::Contiguous);
}

at::Tensor FullyShard::whole(const at::Tensor& param) const {
  if (!sharded_) return param;
  for (const Param& p : params_)
    if (p.tensor.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) {
      at::NoGradGuard no_grad;
      return gather(p.tensor, p);
    }
  return param;
}

void FullyShard::unshard(const pipeline::OptimizerState& state) {
  if (!sharded_) return;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Param& p = params_[i];
    for (const at::Tensor* t : buffers_of(state.params.at(i), p.tensor.sizes())) t->set_data(gather(*t, p));
    p.tensor.set_data(gather(p.tensor, p));
  }
  sharded_ = false;
}

void FullyShard::restore(bool point_back) {
  for (Param& p : params_) {
    if (p.hook) p.tensor.remove_hook(*p.hook);
    p.hook.reset();
    if (point_back && p.traced_shard.defined()) p.tensor.set_data(p.traced_shard);
    p.traced_shard = at::Tensor();
  }
}

pipeline::AroundLoss FullyShard::around_loss() {
  return [self = shared_from_this()](torch::nn::Module& m, const std::vector<at::Tensor>& batch,
                                     const pipeline::LossFn& loss) {
    const int64_t world = self->group_.size();
    // A trace that threw in its backward left its hooks; the tracer has put
    // the tensors' own data back.
    self->restore(/*point_back=*/false);
    for (size_t i = 0; i < self->params_.size(); ++i) {
      Param& p = self->params_[i];
      // The tensor holds the trace's copy of the shard (Note [Swapping
      // reached tensors] in tracer/src/trace_session.cpp); its data is kept
      // to point it back at once the backward is done.
      p.traced_shard = p.tensor.variable_data();
      p.grad_shard = at::Tensor();
      const at::Tensor gathered =
          wait_tensor(all_gather_into_tensor(self->to_gather(p.traced_shard), world, self->group_name_));
      p.tensor.set_data(self->whole_of(gathered, p));
      // The backward calls it once with the parameter's whole gradient (the
      // sum over every use), as soon as it is complete.
      p.hook = p.tensor.register_hook([weak = std::weak_ptr<FullyShard>(self), i, world](const at::Tensor& grad) {
        const std::shared_ptr<FullyShard> fs = weak.lock();
        if (!fs) return;
        Param& q = fs->params_[i];
        at::Tensor rows = grad.to(q.dtype).reshape({q.rows, -1});
        if (q.chunk * world != q.rows) rows = at::constant_pad_nd(rows, {0, 0, 0, q.chunk * world - q.rows});
        std::vector<int64_t> sizes = q.sizes.empty() ? std::vector<int64_t>{1} : q.sizes;
        sizes[0] = q.chunk * world;
        q.grad_shard = wait_tensor(reduce_scatter_tensor(rows.reshape(sizes), ReduceOp::Avg, world, fs->group_name_));
      });
    }
    try {
      return loss(m, batch);
    } catch (...) {
      self->restore(/*point_back=*/true);
      throw;
    }
  };
}

std::function<void(bool)> FullyShard::around_pre_grad_trace() {
  return [self = shared_from_this()](bool before) {
    auto put_back = [&self] {
      for (Param& p : self->params_)
        if (p.untraced_shard.defined()) p.tensor.set_data(std::exchange(p.untraced_shard, at::Tensor()));
    };
    if (!before) return put_back();
    at::NoGradGuard no_grad;
    try {
      for (Param& p : self->params_) {
        const at::Tensor whole = self->gather(self->to_gather(p.tensor), p);
        p.untraced_shard = p.tensor.variable_data();
        p.tensor.set_data(whole);
      }
    } catch (...) {
      put_back();
      throw;
    }
  };
}

pipeline::GradientHook FullyShard::gradient_hook() {
  return [self = shared_from_this()](std::vector<at::Tensor> grads) {
    if (grads.size() != self->params_.size())
      throw SpmdError("fully_shard: the step gives " + std::to_string(grads.size()) + " gradients for " +
                      std::to_string(self->params_.size()) + " sharded parameters; this is a bug in spmd");
    self->restore(/*point_back=*/true);
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = std::exchange(self->params_[i].grad_shard, at::Tensor());
    return grads;
  };
}

}  // namespace crucible::spmd::detail

namespace crucible::spmd {

namespace {

// A gather of a fully-sharded step, as schedule_fully_shard moves it: the
// nodes that issue it (the all_gather last; before it, for a bucket, the
// shards flattened and concatenated) and those from its wait on (the wait
// first; after it, for a bucket, each parameter copied out of the gathered
// buffer), and the values the step reads.
struct Gather {
  std::vector<ir::Node*> issue;
  std::vector<ir::Node*> unpack;
  std::vector<ir::Value*> outputs;
  ir::Node* gather() const { return issue.back(); }
  ir::Node* wait() const { return unpack.front(); }
};

std::vector<Gather> gathers_of(const ir::Graph& graph) {
  std::vector<Gather> out;
  for (ir::Node* n : graph.nodes())
    if (n->is_call() && n->target() == "crucible::all_gather_into_tensor" && n->result()->users().size() == 1 &&
        n->result()->users().front()->target() == "crucible::wait_tensor") {
      ir::Node* wait = n->result()->users().front();
      out.push_back({{n}, {wait}, {wait->result()}});
    }
  return out;
}

bool in_backward(const ir::Node* n) { return n->has_tag("backward"); }

using Positions = std::unordered_map<const ir::Node*, size_t>;

Positions positions_of(const ir::Graph& graph) {
  Positions position;
  for (const ir::Node* n : graph.nodes()) position.emplace(n, position.size());
  return position;
}

// Reshard after forward for one gather: Note [Scheduling a fully-sharded
// step]. Returns whether the backward now gathers it again.
bool regather(ir::Graph& graph, const Gather& g, const Positions& position) {
  // What the forward derives from the gathered parameter by views alone.
  std::vector<ir::Value*> derived{g.wait()->result()};
  std::unordered_set<const ir::Value*> is_derived{g.wait()->result()};
  for (size_t k = 0; k < derived.size(); ++k)
    for (ir::Node* u : derived[k]->users())
      if (!in_backward(u) && u->is_call() && u->num_results() == 1 && ir::aliased_argument(*u->result()) &&
          is_derived.insert(u->result()).second)
        derived.push_back(u->result());
  std::vector<ir::Node*> readers;
  bool forward_reads = false;
  for (const ir::Value* v : derived)
    for (ir::Node* u : v->users()) {
      if (!in_backward(u)) forward_reads = true;
      if (in_backward(u) && std::find(readers.begin(), readers.end(), u) == readers.end()) readers.push_back(u);
    }
  if (readers.empty() || !forward_reads) return false;
  ir::Node* first = *std::min_element(readers.begin(), readers.end(), [&](const ir::Node* a, const ir::Node* b) {
    return position.at(a) < position.at(b);
  });
  ir::Graph::InsertGuard at(graph, first);
  std::unordered_map<const ir::Value*, ir::Value*> again;
  auto add = [&](const ir::Node* like, std::vector<ir::Argument> args) {
    ir::Node* n = graph.add_call(like->op(), std::move(args), {}, like->result()->name());
    n->result()->set_meta(like->result()->meta());
    n->add_tag("backward");
    again.emplace(like->result(), n->result());
    return n->result();
  };
  ir::Value* gathered = add(g.gather(), g.gather()->args());
  add(g.wait(), {gathered});
  // The forward's views, taken again of the second gather (in graph order,
  // so each one's base is taken first).
  for (ir::Value* v : derived) {
    if (again.contains(v)) continue;
    std::vector<ir::Argument> args = v->node()->args();
    for (ir::Argument& a : args)
      if (a.is_value() && again.contains(a.value())) a = ir::Argument(again.at(a.value()));
    add(v->node(), std::move(args));
  }
  for (ir::Node* r : readers)
    for (size_t i = 0; i < r->args().size(); ++i) {
      const ir::Argument& a = r->arg(i);
      if (a.is_value() && again.contains(a.value())) {
        r->set_arg(i, ir::Argument(again.at(a.value())));
      } else if (a.is_value_list()) {
        ir::Argument::ValueList list = a.value_list();
        bool changed = false;
        for (ir::Value*& v : list)
          if (v && again.contains(v)) v = again.at(v), changed = true;
        if (changed) r->set_arg(i, ir::Argument(list));
      }
    }
  return true;
}

// Adds a bucket's nodes at the insertion point: calls whose metadata their
// op derives, tagged as the collectives they replace (backward or not).
class BucketNodes {
 public:
  BucketNodes(ir::Graph& graph, const ir::Node* like) : graph_(graph), backward_(in_backward(like)) {}
  ir::Node* call(const c10::OperatorHandle& op, std::vector<ir::Argument> args, std::string_view name,
                 std::optional<size_t> list_size = {}) {
    return added(graph_.add_call(op, std::move(args), list_size, name));
  }
  ir::Node* call(std::string_view op, std::vector<ir::Argument> args, std::string_view name,
                 std::optional<size_t> list_size = {}) {
    return added(graph_.add_call(op, std::move(args), list_size, name));
  }
  // `v`'s elements in order as `rows` rows (copied first where its layout
  // is not contiguous).
  ir::Value* rows(ir::Value* v, int64_t rows, std::string_view name) {
    if (!v->meta().is_contiguous()) v = copy(v, name);
    return call("aten::view", {v, std::vector<int64_t>{rows, v->meta().numel() / rows}}, name)->result();
  }
  ir::Value* copy(ir::Value* v, std::string_view name) {
    return call("aten::clone", {v, static_cast<int64_t>(c10::MemoryFormat::Contiguous)}, name)->result();
  }
  std::vector<ir::Node*> nodes;

 private:
  ir::Node* added(ir::Node* n) {
    ir::infer_meta(*n);
    if (backward_) n->add_tag("backward");
    nodes.push_back(n);
    return n;
  }
  ir::Graph& graph_;
  bool backward_;
};

// The collectives that may share a bucket: those of one phase (forward or
// backward), dtype, device and constant arguments (group, op).
std::string bucket_key(const ir::Node* collective) {
  std::ostringstream key;
  const ir::TensorMeta& m = collective->arg(0).value()->meta();
  key << in_backward(collective) << '|' << m.dtype << '|' << m.device;
  for (size_t i = 1; i < collective->args().size(); ++i) key << '|' << collective->arg(i).constant();
  return key.str();
}

// The earliest of `bucket`'s gathers in graph order: what a bucket of them
// replaces must come before every reader of each.
ir::Node* earliest(const std::vector<Gather>& bucket, const Positions& position) {
  ir::Node* first = bucket.front().gather();
  for (const Gather& g : bucket)
    if (position.at(g.gather()) < position.at(first)) first = g.gather();
  return first;
}

// The earliest graph position `g`'s shard can be ready by: its own, or,
// for a call (a cast to param_dtype, traced just before its own gather),
// just past the last of its inputs, where it can be moved.
size_t shard_ready_at(const Gather& g, const Positions& position) {
  const ir::Node* def = g.gather()->arg(0).value()->node();
  if (!def->is_call()) return position.at(def);
  size_t ready = 0;
  for (const ir::Value* v : def->inputs()) ready = std::max(ready, position.at(v->node()) + 1);
  return std::min(ready, position.at(def));
}

// One all_gather for the gathers of `bucket`: Note [Buckets of a
// fully-sharded step]. Its nodes go where the earliest of them was issued
// (its shards' casts moved there first); schedule_fully_shard then moves
// them.
Gather bucket_gathers(ir::Graph& graph, const std::vector<Gather>& bucket, const Positions& position) {
  const ir::Node* first = bucket.front().gather();
  const int64_t world = first->arg(1).constant().toInt();
  ir::Node* at_first = earliest(bucket, position);
  for (const Gather& g : bucket)
    if (ir::Node* def = g.gather()->arg(0).value()->node(); position.at(def) > position.at(at_first))
      graph.move_before(def, at_first);
  Gather out;
  std::vector<int64_t> numels;
  ir::Value* gathered = nullptr;
  {
    ir::Graph::InsertGuard at(graph, at_first);
    BucketNodes b(graph, first);
    ir::Argument::ValueList flat;
    for (const Gather& g : bucket) {
      flat.push_back(b.rows(g.gather()->arg(0).value(), 1, "shard"));
      numels.push_back(flat.back()->meta().numel());
    }
    ir::Value* shards = b.call("aten::cat", {flat, int64_t{1}}, "shards")->result();
    std::vector<ir::Argument> args = first->args();
    args[0] = ir::Argument(shards);
    gathered = b.call(first->op(), std::move(args), "all_gather")->result();
    out.issue = std::move(b.nodes);
  }
  ir::Graph::InsertGuard at(graph, at_first);
  BucketNodes b(graph, first);
  // Rank r's shards are row r: [world, the sum of the numels].
  ir::Value* by_rank = b.rows(b.call("crucible::wait_tensor", {gathered}, "wait")->result(), world, "gathered");
  ir::Node* split = b.call("aten::split_with_sizes", {by_rank, numels, int64_t{1}}, "split", numels.size());
  for (size_t k = 0; k < bucket.size(); ++k) {
    ir::Value* param = bucket[k].wait()->result();
    ir::Value* whole =
        b.call("aten::view", {b.copy(split->result(k), "whole"), param->meta().sizes}, param->name())->result();
    param->replace_all_uses_with(whole);
    out.outputs.push_back(whole);
  }
  out.unpack = std::move(b.nodes);
  for (const Gather& g : bucket) {
    graph.erase(g.wait());
    graph.erase(g.gather());
  }
  return out;
}

// A reduce_scatter of a fully-sharded step and the wait that reads it.
struct Scatter {
  ir::Node* reduce;
  ir::Node* wait;
};

// One reduce_scatter for the gradients of `bucket`, where the last one's
// wait was: Note [Buckets of a fully-sharded step].
void bucket_scatters(ir::Graph& graph, const std::vector<Scatter>& bucket) {
  const ir::Node* first = bucket.front().reduce;
  const int64_t world = first->arg(2).constant().toInt();
  ir::Graph::InsertGuard at(graph, bucket.back().wait);
  BucketNodes b(graph, first);
  ir::Argument::ValueList by_rank;  // each [world, numel / world]: rank r's chunk is row r
  std::vector<int64_t> numels;
  for (const Scatter& s : bucket) {
    by_rank.push_back(b.rows(s.reduce->arg(0).value(), world, "grad"));
    numels.push_back(by_rank.back()->meta().sizes[1]);
  }
  std::vector<ir::Argument> args = first->args();
  args[0] = ir::Argument(b.call("aten::cat", {by_rank, int64_t{1}}, "grads")->result());
  ir::Value* reduced = b.call(first->op(), std::move(args), "reduce_scatter")->result();
  ir::Value* flat = b.rows(b.call("crucible::wait_tensor", {reduced}, "wait")->result(), 1, "reduced");
  ir::Node* split = b.call("aten::split_with_sizes", {flat, numels, int64_t{1}}, "split", numels.size());
  for (size_t k = 0; k < bucket.size(); ++k) {
    ir::Value* shard = bucket[k].wait->result();
    shard->replace_all_uses_with(
        b.call("aten::view", {split->result(k), shard->meta().sizes}, shard->name())->result());
  }
  for (const Scatter& s : bucket) {
    graph.erase(s.wait);
    graph.erase(s.reduce);
  }
}

// Buckets the reduce_scatters in graph order. A bucket is issued at its
// last member, so it takes another only while no node before that one
// reads a member's result. Returns the reduce_scatters the step issues.
size_t bucket_all_scatters(ir::Graph& graph, int64_t bucket_bytes) {
  std::vector<Scatter> scatters;
  for (ir::Node* n : graph.nodes())
    if (n->is_call() && n->target() == "crucible::reduce_scatter_tensor" && n->result()->users().size() == 1 &&
        n->result()->users().front()->target() == "crucible::wait_tensor")
      scatters.push_back({n, n->result()->users().front()});
  if (bucket_bytes <= 0) return scatters.size();
  const Positions position = positions_of(graph);
  std::vector<std::vector<Scatter>> buckets;
  int64_t bytes = 0;
  size_t read_at = 0;  // the open bucket's first read of a result
  for (const Scatter& s : scatters) {
    const int64_t more = s.reduce->arg(0).value()->meta().nbytes();
    const bool fits = !buckets.empty() && bytes + more <= bucket_bytes && read_at > position.at(s.wait) &&
                      bucket_key(buckets.back().front().reduce) == bucket_key(s.reduce);
    if (!fits) {
      buckets.emplace_back();
      bytes = 0;
      read_at = position.size();
    }
    buckets.back().push_back(s);
    bytes += more;
    for (const ir::Node* u : s.wait->result()->users()) read_at = std::min(read_at, position.at(u));
  }
  for (const std::vector<Scatter>& bucket : buckets)
    if (bucket.size() > 1) bucket_scatters(graph, bucket);
  return buckets.size();
}

// Merges consecutive gathers of one bucket_key into buckets of at most
// `bucket_bytes`.
std::vector<Gather> bucket_all_gathers(ir::Graph& graph, const std::vector<Gather>& gathers, int64_t bucket_bytes) {
  if (bucket_bytes <= 0) return gathers;
  const Positions position = positions_of(graph);
  auto bytes = [&](size_t i) { return gathers[i].gather()->result()->meta().nbytes(); };
  std::vector<Gather> out;
  for (size_t i = 0, end = 0; i < gathers.size(); i = end) {
    const std::string key = bucket_key(gathers[i].gather());
    int64_t held = bytes(i);
    // The bucket is issued at its earliest gather, so every shard must be
    // ready before that.
    size_t issue_at = position.at(gathers[i].gather()), ready_at = shard_ready_at(gathers[i], position);
    for (end = i + 1; end < gathers.size(); ++end) {
      const size_t at = std::min(issue_at, position.at(gathers[end].gather()));
      const size_t ready = std::max(ready_at, shard_ready_at(gathers[end], position));
      if (held + bytes(end) > bucket_bytes || bucket_key(gathers[end].gather()) != key || ready > at) break;
      held += bytes(end);
      issue_at = at;
      ready_at = ready;
    }
    if (end == i + 1)
      out.push_back(gathers[i]);
    else
      out.push_back(bucket_gathers(
          graph, {gathers.begin() + static_cast<std::ptrdiff_t>(i), gathers.begin() + static_cast<std::ptrdiff_t>(end)},
          position));
  }
  return out;
}

}  // namespace

FullyShardReport schedule_fully_shard(ir::Graph& graph, const DataParallelOptions& options) {
  FullyShardReport report;
  if (options.reshard_after_forward) {
    const Positions position = positions_of(graph);
    for (const Gather& g : gathers_of(graph)) report.regathers += regather(graph, g, position);
  }
  report.reduce_scatters = bucket_all_scatters(graph, options.bucket_bytes);
  std::vector<Gather> gathers = gathers_of(graph);
  report.gathers = gathers.size();
  // In the order of their first readers.
  Positions position = positions_of(graph);
  auto first_reader = [&](const Gather& g) {
    ir::Node* first = nullptr;
    for (const ir::Value* v : g.outputs)
      for (ir::Node* u : v->users())
        if (first == nullptr || position.at(u) < position.at(first)) first = u;
    return first;
  };
  std::erase_if(gathers, [&](const Gather& g) { return first_reader(g) == nullptr; });
  std::stable_sort(gathers.begin(), gathers.end(), [&](const Gather& a, const Gather& b) {
    return position.at(first_reader(a)) < position.at(first_reader(b));
  });
  gathers = bucket_all_gathers(graph, gathers, options.bucket_bytes);
  report.all_gathers = gathers.size();
  position = positions_of(graph);
  std::vector<ir::Node*> firsts;
  for (const Gather& g : gathers) firsts.push_back(first_reader(g));
  // Gather k is waited for at its first reader, and issued at the wait for
  // gather j, the earliest such that gathers j+1 .. k hold at most
  // prefetch_bytes (j < k): ahead of the wait, which blocks the host on
  // Gloo. A backward one is issued no earlier than at the last forward
  // one's wait, which would keep both gathers of a parameter alive.
  std::optional<size_t> last_forward;
  for (size_t k = 0; k < gathers.size(); ++k)
    if (!in_backward(gathers[k].gather())) last_forward = k;
  size_t j = 0;
  int64_t ahead_bytes = 0;  // of gathers j+1 .. k
  auto bytes = [&](size_t k) { return gathers[k].gather()->result()->meta().nbytes(); };
  for (size_t k = 0; k < gathers.size(); ++k) {
    if (k > 0) {
      if (last_forward && k > *last_forward && j < *last_forward) {
        for (size_t i = j + 1; i <= *last_forward; ++i) ahead_bytes -= bytes(i);
        j = *last_forward;
      }
      ahead_bytes += bytes(k);
      while (j + 1 < k && ahead_bytes > options.prefetch_bytes) ahead_bytes -= bytes(++j);
      for (ir::Node* n : gathers[k].issue) graph.move_before(n, gathers[j].wait());
    }
    for (ir::Node* n : gathers[k].unpack) graph.move_before(n, firsts[k]);
  }
  return report;
}

}  // namespace crucible::spmd
