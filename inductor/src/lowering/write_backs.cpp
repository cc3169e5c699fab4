// Lowering of the writes into a graph's inputs: the trailing write-backs
// of a training step ordered so that each writes in place (Notes
// [Trailing write-backs] and [In-place write-backs]).
#include "lowering/lowerer.h"

#include <tuple>

namespace crucible::inductor::detail {

// Note [Trailing write-backs]
// A functional training step ends with copy_(input, new value) for every
// parameter, buffer and optimizer state it updates, and each new value
// was computed from the old values of the others (a parameter's update
// reads the old momentum). Those copies commute — none reads another's
// result — so lowering may take them in any order; taking first the
// copies whose new value reads an input another copy overwrites lets
// every one of them write in place (Note [In-place write-backs]): the
// parameter is written while the momentum still holds its old value, then
// the momentum. A cycle (two copies that each read the other's input)
// keeps graph order, and the realization before each write keeps it
// right. Among the copies free to go, the order also serves speed:
//  - first those that wait on no collective, then those whose
//    collective was issued earliest (Note [Sinking waits]), so that in a
//    data-parallel step the parameters whose gradients are reduced first
//    are updated while the last buckets are still on the wire;
//  - then a copy of the last one's size: a parameter's new value and its
//    optimizer state, one after the other, fuse into one loop group
//    (Note [Fusion]) that reads the gradient and the old state once;
//  - then graph order.
bool Lowerer::is_write_back(const ir::Node* n) {
  return n->is_call() && n->target() == "aten::copy_" && n->num_results() == 1 && !n->result()->has_users() &&
         n->arg(0).is_value() && n->arg(0).value()->node()->is_placeholder();
}

std::vector<const ir::Node*> Lowerer::write_back_order(const std::vector<const ir::Node*>& copies) const {
  // reads[i]: the buffers copy i's new value reads.
  std::vector<std::unordered_set<int>> reads(copies.size());
  std::vector<int> dst(copies.size(), -1);
  for (size_t i = 0; i < copies.size(); ++i) {
    if (auto b = p_.buffer_of.find(copies[i]->arg(0).value()); b != p_.buffer_of.end()) dst[i] = b->second;
    if (!copies[i]->arg(1).is_value()) continue;
    const ir::Value* src = copies[i]->arg(1).value();
    if (auto b = p_.buffer_of.find(src); b != p_.buffer_of.end()) continue;  // computed already
    auto l = lazy_.find(src);
    if (l == lazy_.end()) continue;
    Loop probe;
    probe.sizes = l->second.sizes;
    probe.fn = l->second.fn;
    for (const Read& r : reads_of(p_, probe, probe.numel(), 1)) reads[i].insert(r.buffer);
  }
  auto numel_of = [](const ir::Node* copy) {
    const ir::Value* d = copy->arg(0).value();
    return d->has_meta() ? d->meta().numel() : int64_t{-1};
  };
  // blockers[j]: the pending copies other than j that read what j overwrites.
  std::vector<int> blockers(copies.size(), 0);
  std::vector<size_t> ready(copies.size(), 0);  // 0: waits on nothing; else 1 + its collective's position
  for (size_t i = 0; i < copies.size(); ++i) {
    for (size_t j = 0; j < copies.size(); ++j)
      if (i != j && dst[j] >= 0 && reads[i].contains(dst[j])) ++blockers[j];
    for (int b : reads[i])
      if (auto w = waited_.find(b); w != waited_.end()) ready[i] = std::max(ready[i], 1 + w->second);
  }
  std::vector<const ir::Node*> order;
  std::vector<bool> done(copies.size(), false);
  int64_t last_numel = -1;
  while (order.size() < copies.size()) {
    size_t pick = copies.size();
    auto key = [&](size_t j) { return std::make_tuple(ready[j], numel_of(copies[j]) != last_numel, j); };
    for (size_t j = 0; j < copies.size(); ++j)
      if (!done[j] && blockers[j] == 0 && (pick == copies.size() || key(j) < key(pick))) pick = j;
    if (pick == copies.size())  // a cycle: graph order
      for (size_t j = 0; j < copies.size() && pick == copies.size(); ++j)
        if (!done[j]) pick = j;
    done[pick] = true;
    for (size_t j = 0; j < copies.size(); ++j)
      if (j != pick && dst[j] >= 0 && reads[pick].contains(dst[j])) --blockers[j];
    order.push_back(copies[pick]);
    last_numel = numel_of(copies[pick]);
  }
  return order;
}

// Note [In-place write-backs]
// copy_(dst, src) with dst a graph input and src a value whose every other
// reader is lowered already (an optimizer's new parameter or state,
// functionalization's write-back): src's loop writes dst's memory
// directly, with no buffer of its own and no copy. Where src is a buffer
// already (an extern kernel's result), a copy loop writes dst. Safe when src reads dst only at the element it
// writes (read, then write, in one iteration); the readers of dst's old
// value were realized above, and the scheduler keeps them before the
// write (a read of dst elsewhere in the same kernel must be in the same
// outer iteration, Note [Fusion]).
bool Lowerer::write_in_place(const ir::Node* n) {
  if (n->target() != "aten::copy_" || n->num_results() != 1 || n->result()->has_users()) return false;
  if (!n->arg(0).is_value() || !n->arg(1).is_value()) return false;
  const ir::Value* dst = n->arg(0).value();
  const ir::Value* src = n->arg(1).value();
  auto db = p_.buffer_of.find(dst);
  auto sl = lazy_.find(src);
  if (!dst->node()->is_placeholder() || db == p_.buffer_of.end() || sl == lazy_.end() || sl->second.view) return false;
  // A src realized already (an extern kernel's result: batch norm's new
  // running statistics) is copied by a loop, which the scheduler launches
  // with the other write-backs instead of one copy kernel each.
  if (auto sb = p_.buffer_of.find(src);
      sb != p_.buffer_of.end() ? p_.buffers[sb->second].kind == Buffer::Input : pending_[src] > 0)
    return false;
  const Buffer& d = p_.buffers[db->second];
  if (!loop_tensor(dst) || d.kind != Buffer::Input || d.loop >= 0 || !dense(dst->meta()) ||
      d.sizes != sl->second.sizes || d.dtype != sl->second.dtype)
    return false;
  Loop loop;
  loop.buffer = db->second;
  loop.sizes = d.sizes;
  loop.fn = sl->second.fn;
  Expr o = Expr::var("o", loop.numel());
  for (const Read& r : reads_of(p_, loop, loop.numel(), 1))
    if (r.buffer == loop.buffer && !(r.flat == o)) return false;
  loop.nodes = sl->second.nodes;
  loop.nodes.push_back(n);
  p_.buffers[db->second].loop = static_cast<int>(p_.loops.size());
  p_.items.push_back({nullptr, static_cast<int>(p_.loops.size())});
  p_.loops.push_back(std::move(loop));
  return true;
}

}  // namespace crucible::inductor::detail
