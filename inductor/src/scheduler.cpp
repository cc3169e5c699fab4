// The scheduler: see scheduler.h and Note [Fusion].
#include "scheduler.h"

#include <algorithm>
#include <limits>
#include <unordered_map>
#include <unordered_set>

namespace crucible::inductor::detail {

namespace {

// Note [Fusion]
// The scheduler walks the lowered program in order and keeps one open
// group (torch/_inductor/scheduler.py fuses by (numel, rnumel) the same way,
// with more freedom to reorder):
//  - a loop joins the open group when its sizes fit the group's tiling —
//    a pointwise loop of outer·inner or outer elements, a reduction over
//    (outer, inner) — retiling a group of pointwise loops when a reduction
//    arrives whose kept × reduced sizes cover them; and when every element
//    it reads from a loop of the group was made in the same outer iteration
//    (checked on the index expressions: the row of each read must simplify
//    to `o`), since outer iterations run in parallel;
//  - an extern kernel that reads a buffer of the open group, or writes
//    memory, closes it; any other extern kernel runs before the group (it
//    neither reads what the group writes nor writes what the group reads),
//    so the group keeps growing across it;
//  - a loop that fits no open group may join one closed shortly before it
//    whose reads it shares (Note [Horizontal fusion]);
//  - buffers read only inside their group never reach memory: a reduction
//    or per-outer value stays a local, a row a per-thread scratch row.
class Scheduler {
 public:
  explicit Scheduler(const Program& p) : p_(p) {}

  void run(std::vector<Group>& groups, std::vector<Schedule::Step>& steps) {
    int open = -1;
    std::vector<size_t> step_of;  // a closed group's step
    auto close = [&] {
      if (open < 0) return;
      steps.push_back({nullptr, open});
      step_of[static_cast<size_t>(open)] = steps.size() - 1;
      for (int li : groups[static_cast<size_t>(open)].loops) made(p_.loops[li].buffer, steps.size() - 1);
      open_writes_.clear();
      open = -1;
    };
    for (const Item& it : p_.items) {
      if (it.extern_node) {
        if (open >= 0 && (it.extern_node->is_mutating() || reads_group(it.extern_node, groups[open]))) close();
        steps.push_back({it.extern_node, -1});
        if (it.extern_node->is_mutating()) barrier_ = steps.size();
        for (size_t r = 0; r < it.extern_node->num_results(); ++r)
          if (auto b = p_.buffer_of.find(it.extern_node->result(r)); b != p_.buffer_of.end())
            made(b->second, steps.size() - 1);
        continue;
      }
      const int b = p_.loops[it.loop].buffer;
      if (open >= 0 && (!p_.device.is_cuda() || related(groups[open], static_cast<size_t>(open), it.loop)) &&
          join(groups[open], it.loop)) {
        if (p_.buffers[b].kind == Buffer::Input) open_writes_.insert(b);
        touch(static_cast<size_t>(open), it.loop);
        continue;
      }
      if (int k = earlier_group(groups, step_of, it.loop); k >= 0) {
        made(b, step_of[static_cast<size_t>(k)]);
        touch(static_cast<size_t>(k), it.loop);
        continue;
      }
      close();
      if (p_.buffers[b].kind == Buffer::Input) open_writes_.insert(b);
      const Loop& l = p_.loops[it.loop];
      Group g;
      g.outer = l.numel();
      g.inner = l.reduction ? l.rnumel() : 1;
      g.outer_size = spelled_numel(l);
      g.inner_size = l.reduction ? spelled_rnumel(l) : 1;
      g.tiled = l.reduction;
      g.loops = {it.loop};
      groups.push_back(std::move(g));
      step_of.push_back(std::numeric_limits<size_t>::max());
      open = static_cast<int>(groups.size()) - 1;
      touch(static_cast<size_t>(open), it.loop);
    }
    close();
  }

 private:
  // Note [Horizontal fusion]
  // A loop that cannot join the open group may still share a read with a
  // group closed shortly before: the two consumers of a tensor with a
  // matmul between them (one feeds it, the other does not), GELU's backward
  // beside its bias's gradient. As torch/_inductor's scheduler fuses nodes
  // that are not neighbours when no dependency runs through what lies
  // between, the loop joins that group, which then runs it at its own place
  // in the program, reading the shared operand once. That is right when
  // everything the loop reads exists there: nothing it reads is made by a
  // later step (the open group included), nor written in place after it (a
  // write-back, a mutating extern kernel, which no move crosses); its own
  // buffer is new, read only by later items. A loop writing a graph input
  // in place keeps its place. The search looks back kHorizontalWindow
  // groups, the nearest first.
  static constexpr size_t kHorizontalWindow = 8;
  static constexpr size_t kNever = std::numeric_limits<size_t>::max();

  // Buffer `b` exists from step `step` on (a graph input written in place:
  // holds its new value from then on).
  void made(int b, size_t step) { ready_[b] = step; }

  // The step from which buffer `b` holds what a read of it now sees: 0 for
  // a graph input not written yet, kNever for what the open group makes or
  // writes in place.
  size_t ready(int b) const {
    if (open_writes_.contains(b)) return kNever;
    if (auto it = ready_.find(b); it != ready_.end()) return it->second;
    return p_.buffers[b].kind == Buffer::Input ? 0 : kNever;
  }

  int earlier_group(std::vector<Group>& groups, const std::vector<size_t>& step_of, int li) {
    if (p_.buffers[p_.loops[li].buffer].kind == Buffer::Input) return -1;
    const std::vector<int>& reads = buffers_read(li);
    size_t needed = 0;
    for (int b : reads) needed = std::max(needed, ready(b));
    size_t looked = 0;
    for (size_t k = groups.size(); k-- > 0 && looked < kHorizontalWindow;) {
      const size_t at = step_of[k];
      if (at == kNever) continue;  // the open group
      ++looked;
      if (at < barrier_ || at < needed) return -1;  // earlier groups are earlier still
      const std::unordered_set<int>& touched = touched_[k];
      if (std::none_of(reads.begin(), reads.end(), [&](int b) { return touched.contains(b); })) continue;
      if (p_.device.is_cuda() && !related(groups[k], k, li)) continue;
      if (join(groups[k], li)) return static_cast<int>(k);
    }
    return -1;
  }

  // The buffers loop `li` reads, found once.
  const std::vector<int>& buffers_read(int li) {
    auto [it, fresh] = reads_.try_emplace(li);
    if (fresh) {
      const Loop& l = p_.loops[li];
      for (const Read& r : reads_of(p_, l, l.numel(), l.reduction ? l.rnumel() : 1)) it->second.push_back(r.buffer);
    }
    return it->second;
  }

  // Note [Independent loops on a GPU]
  // On the CPU a group's loops share the threads' outer iterations however
  // many there are. On a GPU, a group gives each thread every loop's
  // element at its index, so independent loops fused there run one after
  // the other on as many threads as one of them has elements: an Adam
  // step's 74 updates of GPT-2's 768-element vectors, adjacent in the
  // write-backs, made one loop on 768 threads and, with the other sizes,
  // one 270 KB kernel that took NVRTC 2.8–4.0 s, most of a cold compile.
  // There a loop joins a group only where it reads what the group makes,
  // or shares an operand of more than one element with it, which it then
  // reads once. Independent loops stay apart, each with its own blocks in a
  // combined launch (Note [Combined launches]), which saves their launches
  // as well. A shared scalar (a learning rate, a step count) saves nothing.
  bool related(const Group& g, size_t k, int li) {
    const std::unordered_set<int>& touched = touched_[k];
    for (int b : buffers_read(li)) {
      if (!touched.contains(b)) continue;
      const Buffer& buf = p_.buffers[b];
      if (buf.loop >= 0 && std::find(g.loops.begin(), g.loops.end(), buf.loop) != g.loops.end()) return true;
      if (!buf.host_scalar && buf.numel() > 1) return true;
    }
    return false;
  }

  // Loop `li` joined group `k`: what it reads and makes is the group's too.
  void touch(size_t k, int li) {
    if (touched_.size() <= k) touched_.resize(k + 1);
    touched_[k].insert(p_.loops[li].buffer);
    for (int b : buffers_read(li)) touched_[k].insert(b);
  }

  bool column(const Group& g) const { return p_.loops[g.loops.front()].column; }

  bool reads_group(const ir::Node* n, const Group& g) const {
    for (const ir::Value* v : n->inputs()) {
      auto b = p_.buffer_of.find(v);
      if (b == p_.buffer_of.end()) continue;
      const Buffer& buf = p_.buffers[b->second];
      if (buf.loop >= 0 && std::find(g.loops.begin(), g.loops.end(), buf.loop) != g.loops.end()) return true;
    }
    return false;
  }

  bool join(Group& g, int li) {
    const Loop& l = p_.loops[li];
    Group t = g;
    // A column reduction walks its loops transposed: it opens its own group
    // and takes only per-outer epilogues after it.
    if (l.reduction && l.column) return false;
    if (column(g) && (l.reduction || l.numel() != g.outer)) return false;
    // A reduction over nothing (a sum of an empty tensor) tiles its group
    // with no inner elements: no row to place another loop's elements in.
    if (g.tiled && g.inner == 0) return false;
    if (l.reduction) {
      if (l.numel() == 0 || l.rnumel() == 0 || g.outer == 0) return false;
      if (g.tiled) {
        if (l.numel() != g.outer || l.rnumel() != g.inner) return false;
      } else if (g.outer == l.numel() * l.rnumel() || g.outer == l.numel()) {
        t.outer = l.numel();
        t.inner = l.rnumel();
        t.outer_size = spelled_numel(l);
        t.inner_size = spelled_rnumel(l);
        t.tiled = true;
      } else {
        return false;
      }
    } else if (!(l.numel() == t.outer || (t.tiled && l.numel() == t.outer * t.inner))) {
      return false;
    }
    // Every read of a buffer the group writes must stay in its outer iteration.
    Expr o = Expr::var("o", t.outer);
    for (const Read& r : reads_of(p_, l, t.outer_size, t.inner_size)) {
      const Buffer& buf = p_.buffers[r.buffer];
      if (buf.loop < 0 || std::find(t.loops.begin(), t.loops.end(), buf.loop) == t.loops.end()) continue;
      Stage s = stage_of(p_.loops[buf.loop], t);
      Expr row = s == Stage::Inner ? floordiv(r.flat, t.inner_size) : r.flat;
      if (!(row == o)) return false;
    }
    // A loop writing a graph input in place (Note [In-place write-backs]):
    // the group's earlier reads of that input must be in the outer
    // iteration that overwrites them.
    if (p_.buffers[l.buffer].kind == Buffer::Input) {
      Stage s = stage_of(l, t);
      for (int other : t.loops)
        for (const Read& r : reads_of(p_, p_.loops[other], t.outer_size, t.inner_size)) {
          if (r.buffer != l.buffer) continue;
          Expr row = s == Stage::Inner ? floordiv(r.flat, t.inner_size) : r.flat;
          if (!(row == o)) return false;
        }
    }
    t.loops.push_back(li);
    g = std::move(t);
    return true;
  }

  const Program& p_;
  std::unordered_map<int, size_t> ready_;            // buffers made (or written in place) by closed steps
  std::unordered_set<int> open_writes_;              // graph inputs the open group writes in place
  std::unordered_map<int, std::vector<int>> reads_;  // loop -> the buffers it reads (buffers_read)
  std::vector<std::unordered_set<int>> touched_;     // group -> the buffers its loops read or make
  size_t barrier_ = 0;                               // the step after the last mutating extern kernel
};

// Who reads each computed buffer from outside its group.
std::vector<GroupInfo> group_infos(const Program& p, const ir::Graph& graph, const std::vector<Group>& groups,
                                   const std::vector<Schedule::Step>& steps) {
  std::unordered_map<int, int> group_of;
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (int li : groups[gi].loops) group_of[p.loops[li].buffer] = static_cast<int>(gi);
  std::vector<GroupInfo> info(groups.size());
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (int li : groups[gi].loops) {
      int b = p.loops[li].buffer;
      info[gi].produced.insert(b);
      if (p.buffers[b].kind == Buffer::Input) info[gi].external.insert(b);  // written in place
    }
  auto mark = [&](int b, int reader_group) {
    auto it = group_of.find(b);
    if (it != group_of.end() && it->second != reader_group) info[it->second].external.insert(b);
  };
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (int li : groups[gi].loops)
      for (const Read& r : reads_of(p, p.loops[li], groups[gi].outer_size, groups[gi].inner_size))
        mark(r.buffer, static_cast<int>(gi));
  for (const Schedule::Step& st : steps)
    if (st.extern_node)
      for (const ir::Value* v : st.extern_node->inputs())
        if (auto b = p.buffer_of.find(v); b != p.buffer_of.end()) mark(b->second, -1);
  if (const ir::Node* out = graph.output_node())
    for (const ir::Value* v : out->inputs())
      if (auto b = p.buffer_of.find(v); b != p.buffer_of.end()) mark(b->second, -1);
  return info;
}

}  // namespace

Fusion fuse(const Program& p, const ir::Graph& graph) {
  Fusion f;
  Scheduler(p).run(f.groups, f.steps);
  f.info = group_infos(p, graph, f.groups, f.steps);
  return f;
}

}  // namespace crucible::inductor::detail
