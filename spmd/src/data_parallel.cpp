// See Note [Data-parallel expansion] in data_parallel.h.
#include <crucible/ir/effects.h>
#include <crucible/spmd/data_parallel.h>
#include <crucible/spmd/error.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <unordered_map>

namespace crucible::spmd {

namespace {

struct Slot {
  ir::Value* grad = nullptr;    // the gradient the backward computed
  std::vector<ir::Node*> tags;  // the tag_grad nodes that read it
  size_t position = 0;          // where grad is computed, in graph order
};

void set_contiguous_meta(ir::Value* v, std::vector<int64_t> sizes, const ir::TensorMeta& like) {
  v->set_meta(ir::TensorMeta::contiguous(std::move(sizes), like.dtype, like.device));
}

}  // namespace

DataParallelStyle parse_data_parallel_style(const std::string& name) {
  if (name == "replicate") return DataParallelStyle::Replicate;
  if (name == "fully_shard") return DataParallelStyle::FullyShard;
  throw SpmdError("unknown data-parallel style \"" + name + "\"; use \"replicate\" or \"fully_shard\"");
}

DataParallelReport expand_data_parallel(ir::Graph& graph, const DataParallelOptions& options) {
  std::unordered_map<const ir::Node*, size_t> position;
  std::vector<Slot> slots;
  std::unordered_map<const ir::Value*, size_t> slot_of;
  for (ir::Node* n : graph.nodes()) {
    position.emplace(n, position.size());
    if (!n->is_call() || n->target() != "crucible::tag_grad") continue;
    ir::Value* g = n->arg(0).value();
    if (!g->has_meta())
      throw SpmdError("expand_data_parallel: the gradient %" + g->name() +
                      " has no metadata; run the expansion on a traced graph");
    auto [it, fresh] = slot_of.emplace(g, slots.size());
    if (fresh) slots.push_back(Slot{g, {}, position.at(g->node())});
    slots[it->second].tags.push_back(n);
  }
  DataParallelReport report;
  report.gradients = slots.size();
  if (slots.empty()) return report;
  std::stable_sort(slots.begin(), slots.end(), [](const Slot& a, const Slot& b) { return a.position < b.position; });

  // Buckets in backward order, one dtype and device each.
  std::vector<std::vector<const Slot*>> buckets;
  int64_t bytes = 0;
  for (const Slot& s : slots) {
    const ir::TensorMeta& m = s.grad->meta();
    const bool fits = !buckets.empty() && options.bucket_bytes > 0 && bytes < options.bucket_bytes &&
                      buckets.back().front()->grad->meta().dtype == m.dtype &&
                      buckets.back().front()->grad->meta().device == m.device;
    if (!fits) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().push_back(&s);
    bytes += m.nbytes();
  }

  for (const auto& bucket : buckets) {
    int64_t bucket_bytes = 0;
    for (const Slot* s : bucket) bucket_bytes += s->grad->meta().nbytes();
    report.bucket_bytes.push_back(bucket_bytes);
    const ir::TensorMeta& like = bucket.front()->grad->meta();

    // Issue: right after the bucket's last gradient is computed.
    ir::Value* reduced = nullptr;
    std::vector<int64_t> numels;
    {
      ir::Graph::InsertGuard at(graph, bucket.back()->grad->node(), ir::Graph::InsertGuard::Where::After);
      ir::Node* ar = nullptr;
      if (bucket.size() == 1) {
        ar = graph.add_call("crucible::all_reduce", {bucket.front()->grad, std::string("avg"), options.group}, {},
                            "all_reduce");
        set_contiguous_meta(ar->result(), like.sizes, like);
      } else {
        ir::Argument::ValueList grads;
        for (const Slot* s : bucket) {
          numels.push_back(s->grad->meta().numel());
          grads.push_back(s->grad);
        }
        ar = graph.add_call("crucible::all_reduce_bucket", {grads, std::string("avg"), options.group}, {}, "bucket");
        set_contiguous_meta(ar->result(), {bucket_bytes / static_cast<int64_t>(c10::elementSize(like.dtype))}, like);
      }
      reduced = ar->result();
    }

    // Wait: just before the first node that reads any of the bucket's tags.
    ir::Node* first_use = graph.output_node();
    size_t first_pos = position.at(first_use);
    for (const Slot* s : bucket)
      for (const ir::Node* tag : s->tags)
        for (ir::Node* u : tag->result()->users())
          if (position.at(u) < first_pos) first_pos = position.at(u), first_use = u;
    ir::Graph::InsertGuard at(graph, first_use, ir::Graph::InsertGuard::Where::Before);
    ir::Node* wait = graph.add_call("crucible::wait_tensor", {reduced}, {}, "wait");
    wait->result()->set_meta(reduced->meta());
    std::vector<ir::Value*> averaged;
    if (bucket.size() == 1) {
      averaged.push_back(wait->result());
    } else {
      ir::Node* split =
          graph.add_call("aten::split_with_sizes", {wait->result(), numels, int64_t{0}}, numels.size(), "split");
      for (size_t i = 0; i < bucket.size(); ++i) {
        const ir::TensorMeta& m = bucket[i]->grad->meta();
        set_contiguous_meta(split->result(i), {numels[i]}, m);
        ir::Node* view =
            graph.add_call("aten::view", {split->result(i), m.sizes}, {}, bucket[i]->grad->name() + "_avg");
        set_contiguous_meta(view->result(), m.sizes, m);
        averaged.push_back(view->result());
      }
    }
    for (size_t i = 0; i < bucket.size(); ++i)
      for (ir::Node* tag : bucket[i]->tags) {
        tag->result()->replace_all_uses_with(averaged[i]);
        graph.erase(tag);
      }
  }
  return report;
}

size_t dedup_collectives(ir::Graph& graph) {
  std::map<std::string, ir::Value*> first;
  std::vector<ir::Node*> doomed;
  for (ir::Node* n : graph.nodes()) {
    if (!n->is_call() || (n->target() != "crucible::all_reduce" && n->target() != "crucible::all_reduce_bucket" &&
                          n->target() != "crucible::wait_tensor"))
      continue;
    std::ostringstream key;
    key << n->target();
    for (const ir::Argument& a : n->args()) {
      if (a.is_value())
        key << "|%" << a.value()->name();
      else if (a.is_constant())
        key << "|" << a.constant();
      else
        for (const ir::Value* v : a.value_list()) key << "|[%" << (v ? v->name() : "None");
    }
    auto [it, fresh] = first.emplace(key.str(), n->result());
    if (fresh) continue;
    n->result()->replace_all_uses_with(it->second);
    doomed.push_back(n);
  }
  for (ir::Node* n : doomed) graph.erase(n);
  return doomed.size();
}

}  // namespace crucible::spmd
