// Lowering of extern kernels (everything the loops do not compute, run
// through the dispatcher in graph order), and the waits for collectives
// moved down to their first reader (Note [Sinking waits]).
#include "lowering/lowerer.h"

#include <crucible/ir/effects.h>

#include <algorithm>
#include <utility>

namespace crucible::inductor::detail {

void Lowerer::lower_extern(const ir::Node* n) {
  if (n->is_mutating()) {
    std::unordered_set<int> written;
    for (const ir::Value* v : n->written())
      if (auto b = p_.buffer_of.find(root(v)); b != p_.buffer_of.end()) written.insert(b->second);
    // A view of a written buffer aliases it (its readers see the write, as
    // in eager); anything else computed from it is realized now.
    std::erase_if(unrealized_, [&](const ir::Value* v) { return p_.buffer_of.contains(v) || pending_[v] <= 0; });
    std::vector<const ir::Value*> pending;
    for (const ir::Value* v : unrealized_) {
      auto rb = p_.buffer_of.find(root(v));
      if (lazy_.at(v).view && rb != p_.buffer_of.end() && written.contains(rb->second)) continue;
      pending.push_back(v);
    }
    std::sort(pending.begin(), pending.end(), [&](const ir::Value* a, const ir::Value* b) {
      return order_.at(a->node()) != order_.at(b->node()) ? order_.at(a->node()) < order_.at(b->node())
                                                          : a->index() < b->index();
    });
    for (const ir::Value* v : pending) {
      const std::vector<int>& reads = buffers_read(v);
      if (std::any_of(reads.begin(), reads.end(), [&](int b) { return written.contains(b); })) realize(v);
    }
  }
  if (write_in_place(n)) return;
  for (const ir::Value* v : n->inputs()) ensure_tensor(v);
  p_.items.push_back({n, -1});
  for (const auto& r : n->results())
    if (loop_tensor(r.get()) || host_scalar(r.get())) add_buffer(r.get(), Buffer::Extern);
  if (is_wait(n) && n->arg(0).is_value())
    for (const auto& r : n->results())
      if (auto b = p_.buffer_of.find(r.get()); b != p_.buffer_of.end())
        waited_.emplace(b->second, order_.at(n->arg(0).value()->node()));
}

// A wait for a collective (crucible::wait_tensor, _c10d_functional's).
bool Lowerer::is_wait(const ir::Node* n) { return ir::is_collective(*n) && n->target().ends_with("::wait_tensor"); }

// Note [Sinking waits]
// A wait makes what follows it on the stream wait for a collective (on
// the host, for Gloo). Lowering meets it where the graph put it, before
// the first node that reads its result; but the loops reading it run
// where they are realized, often much later (an optimizer's update is
// computed at its parameter's write-back, Note [Trailing write-backs]).
// So each wait moves down the items to just before the first item that
// reads what it returns, and the work in between runs while the
// collective is in flight (torch/_inductor/comms.py's sink_waits). Waits
// do not write what other items read, and every rank lowers the same
// graph the same way, so the ranks still issue their collectives in one
// order.
void Lowerer::sink_waits() {
  if (std::none_of(p_.items.begin(), p_.items.end(),
                   [](const Item& it) { return it.extern_node && is_wait(it.extern_node); }))
    return;
  std::vector<Item> items;
  items.reserve(p_.items.size());
  std::vector<std::pair<Item, std::vector<int>>> held;  // waits not yet needed, and the buffers they return
  auto buffers_of = [&](const ir::Node* n) {
    std::vector<int> out;
    for (const auto& r : n->results())
      if (auto b = p_.buffer_of.find(r.get()); b != p_.buffer_of.end()) out.push_back(b->second);
    return out;
  };
  for (const Item& it : p_.items) {
    if (it.extern_node && is_wait(it.extern_node)) {
      held.emplace_back(it, buffers_of(it.extern_node));
      continue;
    }
    std::unordered_set<int> reads;
    if (it.extern_node) {
      for (const ir::Value* v : it.extern_node->inputs())
        for (const ir::Value* u : {v, root(v)})
          if (auto b = p_.buffer_of.find(u); b != p_.buffer_of.end()) reads.insert(b->second);
    } else {
      const Loop& l = p_.loops[static_cast<size_t>(it.loop)];
      for (const Read& r : reads_of(p_, l, l.numel(), l.reduction ? l.rnumel() : 1)) reads.insert(r.buffer);
    }
    std::erase_if(held, [&](const auto& h) {
      const bool needed = std::any_of(h.second.begin(), h.second.end(), [&](int b) { return reads.contains(b); });
      if (needed) items.push_back(h.first);
      return needed;
    });
    items.push_back(it);
  }
  for (const auto& h : held) items.push_back(h.first);
  p_.items = std::move(items);
}

}  // namespace crucible::inductor::detail
