// See Note [Fully-sharded step] in data_parallel.h.
#include "fully_shard.h"

#include <crucible/ir/aliasing.h>
#include <crucible/ir/graph.h>
#include <crucible/spmd/collectives.h>
#include <crucible/spmd/data_parallel.h>
#include <crucible/spmd/error.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <numeric>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace crucible::spmd::detail {

FullyShard::FullyShard(ProcessGroup group, std::string group_name, std::vector<at::Tensor> params)
    : group_(std::move(group)), group_name_(std::move(group_name)) {
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
    for (const at::Tensor* t : buffers_of(state.params.at(i), p.tensor.sizes())) t->set_data(cut(*t, p));
    p.tensor.set_data(cut(p.tensor, p));
  }
  sharded_ = true;
}

at::Tensor FullyShard::gather(const at::Tensor& shard, const Param& p) const {
  const at::Tensor gathered = wait_tensor(all_gather_into_tensor(shard.detach(), group_.size(), group_name_));
  return whole_of(gathered, p).clone(at::MemoryFormat::Contiguous);
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
      const at::Tensor gathered = wait_tensor(all_gather_into_tensor(p.traced_shard, world, self->group_name_));
      p.tensor.set_data(self->whole_of(gathered, p));
      // The backward calls it once with the parameter's whole gradient (the
      // sum over every use), as soon as it is complete.
      p.hook = p.tensor.register_hook([weak = std::weak_ptr<FullyShard>(self), i, world](const at::Tensor& grad) {
        const std::shared_ptr<FullyShard> fs = weak.lock();
        if (!fs) return;
        Param& q = fs->params_[i];
        at::Tensor rows = grad.reshape({q.rows, -1});
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
        const at::Tensor whole = self->gather(p.tensor, p);
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

// A gather of a fully-sharded step and the wait that reads it.
struct Gather {
  ir::Node* gather;
  ir::Node* wait;
};

std::vector<Gather> gathers_of(const ir::Graph& graph) {
  std::vector<Gather> out;
  for (ir::Node* n : graph.nodes())
    if (n->is_call() && n->target() == "crucible::all_gather_into_tensor" && n->result()->users().size() == 1 &&
        n->result()->users().front()->target() == "crucible::wait_tensor")
      out.push_back({n, n->result()->users().front()});
  return out;
}

bool in_backward(const ir::Node* n) { return n->has_tag("backward"); }

// Reshard after forward for one gather: Note [Scheduling a fully-sharded
// step]. Returns whether the backward now gathers it again.
bool regather(ir::Graph& graph, const Gather& g, const std::unordered_map<const ir::Node*, size_t>& position) {
  // What the forward derives from the gathered parameter by views alone.
  std::vector<ir::Value*> derived{g.wait->result()};
  std::unordered_set<const ir::Value*> is_derived{g.wait->result()};
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
  ir::Value* gathered = add(g.gather, g.gather->args());
  add(g.wait, {gathered});
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

}  // namespace

FullyShardReport schedule_fully_shard(ir::Graph& graph, const DataParallelOptions& options) {
  FullyShardReport report;
  auto positions = [&graph] {
    std::unordered_map<const ir::Node*, size_t> position;
    for (const ir::Node* n : graph.nodes()) position.emplace(n, position.size());
    return position;
  };
  if (options.reshard_after_forward) {
    const std::unordered_map<const ir::Node*, size_t> position = positions();
    for (const Gather& g : gathers_of(graph)) report.regathers += regather(graph, g, position);
  }
  std::vector<Gather> gathers = gathers_of(graph);
  report.gathers = gathers.size();
  // Prefetch: in the order of their first readers.
  const std::unordered_map<const ir::Node*, size_t> position = positions();
  auto first_reader = [&](const Gather& g) {
    const std::vector<ir::Node*>& users = g.wait->result()->users();
    return users.empty() ? nullptr
                         : *std::min_element(users.begin(), users.end(), [&](const ir::Node* a, const ir::Node* b) {
                             return position.at(a) < position.at(b);
                           });
  };
  std::erase_if(gathers, [&](const Gather& g) { return first_reader(g) == nullptr; });
  std::vector<ir::Node*> firsts;
  for (const Gather& g : gathers) firsts.push_back(first_reader(g));
  std::vector<size_t> order(gathers.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return position.at(firsts[a]) < position.at(firsts[b]); });
  // Gather k (in that order) is issued at the first reader of gather j, the
  // earliest such that gathers j+1 .. k hold at most prefetch_bytes (j < k);
  // a backward one no earlier than at the last forward one's, which would
  // keep both gathers of a parameter alive.
  std::optional<size_t> last_forward;
  for (size_t k = 0; k < order.size(); ++k)
    if (!in_backward(gathers[order[k]].gather)) last_forward = k;
  size_t j = 0;
  int64_t ahead_bytes = 0;  // of gathers j+1 .. k
  auto bytes = [&](size_t k) { return gathers[order[k]].gather->result()->meta().nbytes(); };
  for (size_t k = 0; k < order.size(); ++k) {
    const Gather& g = gathers[order[k]];
    if (k > 0) {
      if (last_forward && k > *last_forward && j < *last_forward) {
        for (size_t i = j + 1; i <= *last_forward; ++i) ahead_bytes -= bytes(i);
        j = *last_forward;
      }
      ahead_bytes += bytes(k);
      while (j + 1 < k && ahead_bytes > options.prefetch_bytes) ahead_bytes -= bytes(++j);
      graph.move_before(g.gather, firsts[order[j]]);
    }
    graph.move_before(g.wait, firsts[order[k]]);
  }
  return report;
}

}  // namespace crucible::spmd
