#include "codecache/cpp_builder.h"
#include "codegen/render.h"
#include "schedule.h"

#include <algorithm>
#include <cctype>
#include <unordered_map>
#include <unordered_set>

namespace crucible::inductor::detail {

std::string indent(const std::string& text, int spaces) {
  std::string pad(spaces, ' '), out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) out += pad + text.substr(start, end - start);
    out += "\n";
    start = end + 1;
  }
  return out;
}

std::string substitute(const std::string& finalize, const std::string& acc) {
  std::string out;
  for (char c : finalize) out += c == '$' ? acc : std::string(1, c);
  return out;
}

namespace {
// Whether `text` names `name` as a whole identifier.
bool mentions(const std::string& text, const std::string& name) {
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t at = text.find(name); at != std::string::npos; at = text.find(name, at + 1)) {
    const size_t after = at + name.size();
    if ((at == 0 || !word(text[at - 1])) && (after == text.size() || !word(text[after]))) return true;
  }
  return false;
}
}  // namespace

std::vector<std::vector<bool>> read_later(const std::vector<RowPiece>& pieces) {
  std::vector<std::vector<bool>> kept(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    kept[i].resize(pieces[i].defs.size());
    for (size_t d = 0; d < pieces[i].defs.size(); ++d)
      for (size_t k = i + 1; k < pieces.size() && !kept[i][d]; ++k)
        kept[i][d] = pieces[k].over_row && mentions(pieces[k].text, pieces[i].defs[d].name);
  }
  return kept;
}

std::vector<CBody::Def> kept_defs(const std::vector<RowPiece>& pieces, const std::vector<std::vector<bool>>& kept) {
  std::vector<CBody::Def> defs;
  for (size_t i = 0; i < pieces.size(); ++i)
    for (size_t d = 0; d < pieces[i].defs.size(); ++d)
      if (kept[i][d]) defs.push_back(pieces[i].defs[d]);
  return defs;
}

std::string with_kept_values(const std::vector<RowPiece>& pieces, const std::vector<std::vector<bool>>& kept, size_t k,
                             const std::function<KeptSlot(const CBody::Def&)>& slot) {
  std::string text;
  for (size_t i = 0; i < k; ++i)
    for (size_t d = 0; d < pieces[i].defs.size(); ++d) {
      const CBody::Def& def = pieces[i].defs[d];
      if (kept[i][d] && mentions(pieces[k].text, def.name))
        text += "const " + def.ctype + " " + def.name + " = " + slot(def).read + ";\n";
    }
  text += pieces[k].text;
  for (size_t d = 0; d < pieces[k].defs.size(); ++d) {
    const CBody::Def& def = pieces[k].defs[d];
    if (!kept[k][d]) continue;
    const std::string write = slot(def).write;
    if (!write.empty()) text += write + " = " + def.name + ";\n";
  }
  return text;
}

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
  explicit Scheduler(Program& p) : p_(p) {}

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
        t.tiled = true;
      } else {
        return false;
      }
    } else if (!(l.numel() == t.outer || (t.tiled && l.numel() == t.outer * t.inner))) {
      return false;
    }
    // Every read of a buffer the group writes must stay in its outer iteration.
    Expr o = Expr::var("o", t.outer);
    for (const Read& r : reads_of(p_, l, t.outer, t.inner)) {
      const Buffer& buf = p_.buffers[r.buffer];
      if (buf.loop < 0 || std::find(t.loops.begin(), t.loops.end(), buf.loop) == t.loops.end()) continue;
      Stage s = stage_of(p_.loops[buf.loop], t);
      Expr row = s == Stage::Inner ? floordiv(r.flat, t.inner) : r.flat;
      if (!(row == o)) return false;
    }
    // A loop writing a graph input in place (Note [In-place write-backs]):
    // the group's earlier reads of that input must be in the outer
    // iteration that overwrites them.
    if (p_.buffers[l.buffer].kind == Buffer::Input) {
      Stage s = stage_of(l, t);
      for (int other : t.loops)
        for (const Read& r : reads_of(p_, p_.loops[other], t.outer, t.inner)) {
          if (r.buffer != l.buffer) continue;
          Expr row = s == Stage::Inner ? floordiv(r.flat, t.inner) : r.flat;
          if (!(row == o)) return false;
        }
    }
    t.loops.push_back(li);
    g = std::move(t);
    return true;
  }

  Program& p_;
  std::unordered_map<int, size_t> ready_;            // buffers made (or written in place) by closed steps
  std::unordered_set<int> open_writes_;              // graph inputs the open group writes in place
  std::unordered_map<int, std::vector<int>> reads_;  // loop -> the buffers it reads (buffers_read)
  std::vector<std::unordered_set<int>> touched_;     // group -> the buffers its loops read or make
  size_t barrier_ = 0;                               // the step after the last mutating extern kernel
};

// ---- C++ rendering ----------------------------------------------------------

std::string literal_int(int64_t v) { return std::to_string(v); }

// How a reduction combines: the accumulator's initial value, the statement
// that folds `v` in, the OpenMP clause that lets the loop vectorize, and the
// result. Max and min fold with a select (vectorizable as maxps/minps) and
// remember a NaN separately, so that a NaN anywhere gives NaN as in ATen.
struct Combine {
  std::string init, combine, pragma, extra_decl, result;
};

Combine combine_of(ReductionType t, const std::string& A, const std::string& acc, const std::string& v) {
  Combine c;
  if (t == ReductionType::Sum) {
    c.init = A + "(0)";
    c.combine = acc + " += " + v + ";\n";
    c.pragma = "#pragma omp simd reduction(+ : " + acc + ")\n";
    return c;
  }
  bool max = t == ReductionType::Max;
  std::string nan = acc + "_nan";
  c.init = std::string(max ? "-" : "") + "std::numeric_limits<" + A + ">::infinity()";
  c.combine = acc + " = " + v + (max ? " > " : " < ") + acc + " ? " + v + " : " + acc + ";\n" + nan + " |= " + v +
              " != " + v + ";\n";
  c.pragma =
      "#pragma omp simd reduction(" + std::string(max ? "max" : "min") + " : " + acc + ") reduction(| : " + nan + ")\n";
  c.extra_decl = "int " + nan + " = 0;\n";
  c.result = "(" + nan + " ? std::numeric_limits<" + A + ">::quiet_NaN() : static_cast<" + A + ">(" + acc + "))";
  return c;
}

std::string signature(const Program& p, const CBody& body, const GroupInfo& info, KernelSignature& sig) {
  std::string decls;
  for (int b : body.args) {
    const Buffer& buf = p.buffers[b];
    bool written = info.produced.contains(b);
    std::string T = storage_ctype_of(buf.dtype);
    size_t i = sig.buffers.size();
    sig.buffers.push_back(b);
    sig.written.push_back(written);
    decls += std::string(written ? "" : "const ") + T + "* __restrict " + buf.name + " = static_cast<" +
             (written ? "" : "const ") + T + "*>(b[" + std::to_string(i) + "]);\n";
  }
  return decls;
}

// The work (elements times reduced elements) from which a kernel runs in
// parallel: below it, starting the threads costs more than they save.
constexpr int64_t kParallel = 32768;

// A column reduction (Loop::column) and its per-outer epilogues: blocks of
// kBlock outer indices per thread; the reduced index walks outside, the
// block inside (contiguous loads, one accumulator per outer index), then
// the epilogues run over the block.
std::string render_column_group(const Program& p, const Group& g, const GroupInfo& info, const std::string& name,
                                int threads, KernelSignature& sig) {
  constexpr int64_t kBlock = 64;
  CBody body(p, g, info);
  const Loop& red = p.loops[g.loops.front()];
  const Buffer& rbuf = p.buffers[red.buffer];
  const std::string T = ctype_of(rbuf.dtype);
  const std::string A = T == "float" && red.rtype == ReductionType::Sum ? "double" : T;
  Val v = body_value(body, red, g.outer, g.inner);
  std::string inner = body.take_inner();
  Combine c = combine_of(red.rtype, A, "acc[o - ob]", v.name);
  // Per-index accumulators: the NaN flag of max/min becomes an array too.
  std::string nan_decl, combine = c.combine, result = c.result;
  if (red.rtype != ReductionType::Sum) {
    nan_decl = "int acc_nan[" + std::to_string(kBlock) + "] = {};\n";
    auto replace_all = [](std::string s, const std::string& from, const std::string& to) {
      for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
        s.replace(at, from.size(), to);
      return s;
    };
    combine = replace_all(combine, "acc[o - ob]_nan", "acc_nan[o - ob]");
    result = replace_all(result, "acc[o - ob]_nan", "acc_nan[o - ob]");
  }
  std::string value = result.empty() ? "static_cast<" + T + ">(acc[o - ob])" : result;
  if (!red.finalize.empty()) value = substitute(red.finalize, value);
  std::string epilogue = "const " + T + " red_" + rbuf.name + " = " + value + ";\n";
  Expr o = Expr::var("o", g.outer);
  if (info.external.contains(red.buffer))
    epilogue += body.store(red.buffer, store_offset(p, red, o), "red_" + rbuf.name);
  body.set_local(red.buffer, "red_" + rbuf.name);
  for (size_t k = 1; k < g.loops.size(); ++k) {
    const Loop& l = p.loops[g.loops[k]];
    Val e = body_value(body, l, g.outer, g.inner);
    epilogue += body.take_inner();
    if (info.external.contains(l.buffer)) epilogue += body.store(l.buffer, store_offset(p, l, o), e.name);
    body.set_local(l.buffer, e.name);
  }
  const std::string B = std::to_string(kBlock), O = std::to_string(g.outer);
  std::string out =
      "extern \"C\" void " + name + "(void* const* b) {\n" + indent(signature(p, body, info, sig) + body.take(0), 2);
  out += "#pragma omp parallel for schedule(static) if(" + std::to_string(g.outer * g.inner) +
         " >= " + std::to_string(kParallel) + ")" +
         (threads > 0 ? " num_threads(" + std::to_string(threads) + ")" : std::string()) + "\n";
  out += "  for (int64_t ob = 0; ob < " + O + "; ob += " + B + ") {\n";
  out += "    const int64_t oe = ob + " + B + " < " + O + " ? ob + " + B + " : " + O + ";\n";
  out += "    " + A + " acc[" + B + "];\n    for (int64_t i = 0; i < " + B + "; ++i) acc[i] = " + c.init + ";\n";
  out += indent(nan_decl, 4);
  out += "    for (int64_t r = 0; r < " + std::to_string(g.inner) + "; ++r) {\n#pragma omp simd\n";
  out += "      for (int64_t o = ob; o < oe; ++o) {\n" + indent(inner + combine, 8) + "      }\n    }\n";
  out += "    for (int64_t o = ob; o < oe; ++o) {\n" + indent(epilogue, 6) + "    }\n  }\n}\n";
  return out;
}

// Note [Split reductions]
// Reductions of a few long rows (a loss's sum, a norm: outer size 1; a
// per-sample sum over a small batch) leave the outer loop too little to
// share among threads: one thread walked a whole [8192, 1024] sum (2.4x
// eager's time on this 2-core machine), and 4 rows kept 4 of 16 threads
// busy. Their work is split across the reduced range instead, as ATen's
// parallel reductions split theirs: the rows' elements, in order, are cut
// into one contiguous chunk a thread; a thread folds each row's part of
// its chunk as the single loop folds a row, into a partial per (row,
// thread), and each row's partials are combined in thread order, so a run
// gives the same bits as any other with the same thread count. A thread
// whose chunk holds whole rows folds them whole: with more rows than
// threads this is the row-parallel loop. A group of such reductions (the
// scheduler fuses every reduction of the same rows: a var_mean's mean and
// variance) runs them one after another, each split, with the values of
// each row between them (a mean's division, a loss's scaling) computed
// once a row. Groups with stages over the reduced range keep the one
// loop, and so do rows indexed through divisions (an NCHW tensor's sum over
// N, H and W), which Note [Split loops] walks as nested affine loops.
constexpr int64_t kMaxSplitRows = 64;  // rows from which the row-parallel loop gives every thread work

bool affine(const Program& p, const Group& g, const GroupInfo& info, const LoopVars& v, const std::string& var);

bool split_reduction(const Program& p, const Group& g, const GroupInfo& info) {
  if (!g.tiled || g.outer >= kMaxSplitRows || g.inner < kParallel || p.loops[g.loops.front()].column) return false;
  if (std::any_of(g.loops.begin(), g.loops.end(), [&](int li) { return stage_of(p.loops[li], g) == Stage::Inner; }))
    return false;
  return g.outer == 1 || affine(p, g, info, loop_vars(g.outer, g.inner), "r");
}

std::string render_split_reduction(const Program& p, const Group& g, const GroupInfo& info, const std::string& name,
                                   int threads, KernelSignature& sig) {
  CBody body(p, g, info);
  const Expr o = Expr::var("o", g.outer);
  const std::string OUTER = std::to_string(g.outer), INNER = std::to_string(g.inner),
                    N = std::to_string(g.outer * g.inner);
  // A per-row array of `T` named `array`.
  auto rows = [&](const std::string& T, const std::string& array) {
    return "const std::unique_ptr<" + T + "[]> " + array + "(new " + T + "[" + OUTER + "]);\n";
  };
  std::string text;
  int counter = 0;
  for (int li : g.loops) {
    const Loop& l = p.loops[li];
    const Buffer& buf = p.buffers[l.buffer];
    const std::string T = ctype_of(buf.dtype), red = "red_" + buf.name;
    Val v = body_value(body, l, g.outer, g.inner);
    if (!l.reduction) {  // once a row
      std::string lines = body.take_inner();
      if (info.external.contains(l.buffer)) lines += body.store(l.buffer, store_offset(p, l, o), v.name);
      text += rows(T, red) + "for (int64_t o = 0; o < " + OUTER + "; ++o) {\n" +
              indent(lines + red + "[o] = " + v.name + ";\n", 2) + "}\n";
      body.set_local(l.buffer, red + "[o]");
      continue;
    }
    const std::string inner = body.take_inner();
    const std::string A = T == "float" && l.rtype == ReductionType::Sum ? "double" : T;
    const std::string acc = "acc" + std::to_string(counter), part = "part" + std::to_string(counter++);
    const Combine c = combine_of(l.rtype, A, acc, v.name);
    // A row's partials folded in thread order (a NaN a thread saw is in its
    // flag, not its partial); a thread that saw none of the row left the
    // initial value, which folds to nothing.
    const bool nan = l.rtype != ReductionType::Sum;
    const std::string at = "[o * crucible_threads + t]";
    const std::string fold = !nan ? acc + " += " + part + at + ";\n"
                                  : acc + " = " + part + at + " " + (l.rtype == ReductionType::Max ? ">" : "<") + " " +
                                        acc + " ? " + part + at + " : " + acc + ";\n" + acc + "_nan |= " + part +
                                        "_nan" + at + ";\n";
    text += "const std::unique_ptr<" + A + "[]> " + part + "(new " + A + "[" + OUTER + " * crucible_threads]);\n";
    text += "for (int64_t i = 0; i < " + OUTER + " * crucible_threads; ++i) " + part + "[i] = " + c.init + ";\n";
    if (nan) text += "const std::unique_ptr<int[]> " + part + "_nan(new int[" + OUTER + " * crucible_threads]());\n";
    text += "int " + part + "_used = 1;\n#pragma omp parallel num_threads(crucible_threads)\n{\n";
    text += "  const int t = omp_get_thread_num(), n = omp_get_num_threads();\n";
    text += "  const int64_t lo = " + N + " * t / n, hi = " + N + " * (t + 1) / n;\n";
    text += "  for (int64_t o = lo / " + INNER + "; o < " + OUTER + " && o * " + INNER + " < hi; ++o) {\n";
    text += "    const int64_t r_lo = lo > o * " + INNER + " ? lo - o * " + INNER + " : 0;\n";
    text += "    const int64_t r_hi = hi < (o + 1) * " + INNER + " ? hi - o * " + INNER + " : " + INNER + ";\n";
    text += "    " + A + " " + acc + " = " + c.init + ";\n" + indent(c.extra_decl, 4) + indent(c.pragma, 4);
    text += "    for (int64_t r = r_lo; r < r_hi; ++r) {\n" + indent(inner + c.combine, 6) + "    }\n";
    text +=
        "    " + part + at + " = " + acc + ";\n" + (nan ? "    " + part + "_nan" + at + " = " + acc + "_nan;\n" : "");
    text += "  }\n#pragma omp single\n  " + part + "_used = n;\n}\n";
    std::string value = c.result.empty() ? "static_cast<" + T + ">(" + acc + ")" : c.result;
    if (!l.finalize.empty()) value = substitute(l.finalize, value);
    std::string per_row = A + " " + acc + " = " + c.init + ";\n" + c.extra_decl + "for (int t = 0; t < " + part +
                          "_used; ++t) {\n" + indent(fold, 2) + "}\n" + red + "[o] = " + value + ";\n";
    if (info.external.contains(l.buffer)) per_row += body.store(l.buffer, store_offset(p, l, o), red + "[o]");
    text += rows(T, red) + "for (int64_t o = 0; o < " + OUTER + "; ++o) {\n" + indent(per_row, 2) + "}\n";
    body.set_local(l.buffer, red + "[o]");
  }
  std::string out =
      "extern \"C\" void " + name + "(void* const* b) {\n" + indent(signature(p, body, info, sig) + body.take(0), 2);
  out += "  const int crucible_threads = " +
         (threads > 0 ? std::to_string(threads) : std::string("omp_get_max_threads()")) + ";\n";
  return out + indent(text, 2) + "}\n";
}

// Note [Split loops]
// A kernel counts its elements with one variable per loop (o over the
// outer range, r over the inner one), so an operand that is broadcast or
// reduced over some dimensions but not the next is indexed by quotients
// and remainders of it: a channel's scale in an NCHW pointwise loop at
// ((o / 784) % 16), a batch norm's sum over N, H and W at
// 12544·(r / 784) + r % 784. That is integer divisions in every load and a
// loop the compiler does not vectorize. Such a loop is walked as two
// nested ones instead, o = K·oh + ol (r = K·rh + rl), K the product of
// some trailing dimensions or a divisor of the innermost one: the offsets
// become affine in the inner variable (contiguous, or constant, as it
// counts), and what depends on oh alone is computed once per K elements.
// K is the largest such that makes every load and store of the kernel
// affine (products first, then divisors); when the single variable already
// is, or no K makes it so, the loop stays whole. A pointwise kernel keeps
// enough outer iterations to share among threads.

// The offsets in memory of a group's loads, as CBody makes them: not those
// of values the group makes and keeps in locals or scratch rows.
class OffsetBody : public Body {
 public:
  OffsetBody(const Program& p, const Group& g, const GroupInfo& info) : p_(p), g_(g), info_(info) {}
  Val load(int b, const std::vector<Expr>& index) override {
    const Buffer& buf = p_.buffers[b];
    const bool in_registers =
        info_.produced.contains(b) && (!info_.external.contains(b) || stage_of(p_.loops[buf.loop], g_) != Stage::Inner);
    if (!in_registers && !buf.host_scalar) offsets.push_back(dot(index, buf.strides));
    return {"x", 0};
  }
  Val compute(const std::string&, int, const std::string&) override { return {"x", 0}; }
  std::vector<Expr> offsets;

 private:
  const Program& p_;
  const Group& g_;
  const GroupInfo& info_;
};

// Every load and store of `g` steps by a constant as the variable `var` of
// `v` counts.
bool affine(const Program& p, const Group& g, const GroupInfo& info, const LoopVars& v, const std::string& var) {
  OffsetBody body(p, g, info);
  for (int li : g.loops) {
    const Loop& l = p.loops[li];
    body_value(body, l, v);
    if (l.reduction || l.numel() == g.outer)
      body.offsets.push_back(store_offset(p, l, v.o));
    else
      body.offsets.push_back(store_offset(p, l, v.o * g.inner + v.r));
  }
  return std::all_of(body.offsets.begin(), body.offsets.end(), [&](const Expr& e) { return e.affine_in(var); });
}

struct Split {
  int64_t outer = 0, inner = 0;  // 0: not split
};

Split split_loops(const Program& p, const Group& g, const GroupInfo& info) {
  constexpr int64_t kMinInner = 16;  // a few vectors' worth per inner loop
  constexpr int64_t kMinRows = 64;   // outer iterations for the threads to share
  const Loop& first = p.loops[g.loops.front()];
  // Writing a graph input in place, a kernel keeps its loads and stores in
  // their order (Note [In-place write-backs]); hoisting a load out of the
  // inner loop could move it before a store.
  for (int li : g.loops)
    if (p.buffers[p.loops[li].buffer].kind == Buffer::Input) return {};
  // Candidate inner sizes: products of the trailing dimensions the split
  // variable counts, largest first.
  // ... then the divisors of the innermost dimension, largest first: a
  // dimension that merges several of an operand's (a reshape merging heads,
  // [B, H, T, D] -> [B, T, H·D]; inputs of a cat, Note [Masked loads] in
  // lowering.cpp) is affine over the innermost of them.
  auto candidates = [](const std::vector<int64_t>& dims) {
    std::vector<int64_t> out;
    int64_t k = 1;
    for (size_t d = dims.size(); d-- > 1;) {
      k *= dims[d];
      if (k >= kMinInner) out.insert(out.begin(), k);
    }
    constexpr size_t kMaxDivisors = 16;  // each candidate costs a look at the kernel's loads
    std::vector<int64_t> divisors;
    const int64_t n = dims.empty() ? 0 : dims.back();
    for (int64_t f = 2; f * f <= n; ++f)
      if (n % f == 0) {
        if (f >= kMinInner) divisors.push_back(f);
        if (n / f >= kMinInner && n / f != f) divisors.push_back(n / f);
      }
    std::sort(divisors.rbegin(), divisors.rend());
    if (divisors.size() > kMaxDivisors) divisors.resize(kMaxDivisors);
    out.insert(out.end(), divisors.begin(), divisors.end());
    return out;
  };
  if (g.tiled) {
    const Loop* red = nullptr;
    for (int li : g.loops)
      if (p.loops[li].reduction && !red) red = &p.loops[li];
    if (!red || red->rnumel() != g.inner || affine(p, g, info, loop_vars(g.outer, g.inner), "r")) return {};
    for (int64_t k : candidates(red->rsizes))
      if (affine(p, g, info, loop_vars(g.outer, g.inner, 0, k), "rl")) return {0, k};
    return {};
  }
  if (first.numel() != g.outer || affine(p, g, info, loop_vars(g.outer, g.inner), "o")) return {};
  std::vector<int64_t> dims;
  for (size_t k = 0; k < first.sizes.size(); ++k)
    dims.push_back(first.sizes[first.order.empty() ? k : static_cast<size_t>(first.order[k])]);
  for (int64_t k : candidates(dims)) {
    if (g.outer * g.inner >= kParallel && g.outer / k < kMinRows) continue;
    if (affine(p, g, info, loop_vars(g.outer, g.inner, k, 0), "ol")) return {k, 0};
  }
  return {};
}

// Note [Kept row values]
// A row group's stages each walk the row, and without more, each computes
// again what it reads of an earlier stage's values: a softmax's third loop
// loads x and takes exp(x - max) a second time. In a row of at most
// kMaxKeptRow elements, a value that a later loop reads again is kept in a
// per-thread row instead (as the CUDA kernels keep theirs in registers,
// Note [Persistent rows] in cuda_codegen.cpp), read back from L1 where it
// would have been recomputed. A value that is a load of memory is loaded
// again under its name instead, which costs what reading a copy would. Loads of memory are not kept: a later loop
// loads them again, which costs what reading a kept copy would.
std::string render_group(const Program& p, const Group& g, const GroupInfo& info, const std::string& name, int threads,
                         KernelSignature& sig) {
  if (p.loops[g.loops.front()].column) return render_column_group(p, g, info, name, threads, sig);
  if (split_reduction(p, g, info)) return render_split_reduction(p, g, info, name, threads, sig);
  constexpr int64_t kMaxKeptRow = 4096;
  CBody body(p, g, info);
  const bool keep = g.tiled && g.inner <= kMaxKeptRow;
  if (keep) body.keep_inner_values();
  std::vector<RowPiece> pieces;  // the outer loop's body
  std::string per_inner;         // a split pointwise kernel: the body of its inner loop
  auto once = [&](std::string text) { pieces.push_back({std::move(text), false, {}, {}, {}, {}}); };
  auto over_row = [&](std::string pragma, std::string text) {
    pieces.push_back({std::move(text), true, body.take_defs(), std::move(pragma), {}, {}});
  };
  int acc_counter = 0;
  const Split split = split_loops(p, g, info);
  const LoopVars vars = loop_vars(g.outer, g.inner, split.outer, split.inner);
  const Expr& o = vars.o;
  const Expr& r = vars.r;
  const std::string omp_threads = threads > 0 ? " num_threads(" + std::to_string(threads) + ")" : "";
  // The loop (or nest) over the inner range, `pragma` on its innermost loop.
  auto inner_loop = [&](const std::string& pragma, const std::string& lines) {
    if (split.inner == 0)
      return pragma + "for (int64_t r = 0; r < " + literal_int(g.inner) + "; ++r) {\n" + indent(lines, 2) + "}\n";
    return "for (int64_t rh = 0; rh < " + literal_int(g.inner / split.inner) + "; ++rh) {\n" +
           indent(pragma + "for (int64_t rl = 0; rl < " + literal_int(split.inner) + "; ++rl) {\n" + indent(lines, 2) +
                      "}\n",
                  2) +
           "}\n";
  };
  for (int li : g.loops) {
    const Loop& l = p.loops[li];
    const Buffer& buf = p.buffers[l.buffer];
    const std::string T = ctype_of(buf.dtype);
    bool external = info.external.contains(l.buffer);
    Stage stage = stage_of(l, g);
    Val v = body_value(body, l, vars);
    if (stage == Stage::Scalar) {
      // Split, lines that depend on ol go to the inner loop; those of oh
      // alone before it (they never read what the inner loop computes).
      std::string text = body.take(1);
      std::string lines = body.take(2);
      body.take_defs();  // level-2 values here are per outer index (split): never kept
      if (external) {
        Expr at = store_offset(p, l, o);
        lines += body.store(l.buffer, at, v.name);
        body.stored(l.buffer);
      }
      (split.outer ? per_inner : text) += lines;
      once(std::move(text));
      body.set_local(l.buffer, v.name, std::max(v.level, 1));
    } else if (stage == Stage::Inner) {
      std::string inner_lines = body.take(2);
      once(body.take(1));
      if (external) {
        Expr at = store_offset(p, l, o * g.inner + r);
        inner_lines += body.store(l.buffer, at, v.name);
        body.stored(l.buffer);
      } else {
        inner_lines += body.scratch(l.buffer) + "[" + r.str() + "] = " + v.name + ";\n";
      }
      over_row("#pragma omp simd\n", std::move(inner_lines));
    } else {
      std::string inner_lines = body.take(2);
      std::string acc = "acc" + std::to_string(acc_counter++);
      std::string A = T == "float" && l.rtype == ReductionType::Sum ? "double" : T;
      Combine c = combine_of(l.rtype, A, acc, v.name);
      once(body.take(1) + A + " " + acc + " = " + c.init + ";\n" + c.extra_decl);
      over_row(c.pragma, inner_lines + c.combine);
      std::string value = c.result.empty() ? "static_cast<" + T + ">(" + acc + ")" : c.result;
      if (!l.finalize.empty()) value = substitute(l.finalize, value);
      std::string red = "red_" + buf.name;
      std::string text = "const " + T + " " + red + " = " + value + ";\n";
      if (external) {
        Expr at = store_offset(p, l, o);
        text += body.store(l.buffer, at, red);
      }
      once(std::move(text));
      body.set_local(l.buffer, red);
    }
  }
  // Assembled: each row loop with the kept values it reads and keeps.
  const std::vector<std::vector<bool>> kept = read_later(pieces);
  std::vector<CBody::Def> kept_rows = kept_defs(pieces, kept);
  std::erase_if(kept_rows, [](const CBody::Def& d) { return d.load; });  // loaded again, not kept
  const std::string at_r = "[" + r.str() + "]";
  std::string per_outer;
  for (size_t k = 0; k < pieces.size(); ++k)
    per_outer += !pieces[k].over_row
                     ? pieces[k].text
                     : inner_loop(pieces[k].pragma, with_kept_values(pieces, kept, k, [&](const CBody::Def& d) {
                                    if (d.load) return KeptSlot{d.expr, ""};  // loaded again
                                    return KeptSlot{"keep_" + d.name + at_r, "keep_" + d.name + at_r};
                                  }));
  std::string decls = signature(p, body, info, sig);
  std::string out = "extern \"C\" void " + name + "(void* const* b) {\n" + indent(decls + body.take(0), 2);
  const int64_t work = g.outer * g.inner;
  const std::string parallel_if = " if(" + literal_int(work) + " >= " + literal_int(kParallel) + ")";
  if (!g.tiled && split.outer) {
    out += "#pragma omp parallel for schedule(static)" + parallel_if + omp_threads + "\n";
    out += "  for (int64_t oh = 0; oh < " + literal_int(g.outer / split.outer) + "; ++oh) {\n" + indent(per_outer, 4);
    out += "#pragma omp simd\n    for (int64_t ol = 0; ol < " + literal_int(split.outer) + "; ++ol) {\n" +
           indent(per_inner, 6) + "    }\n  }\n";
  } else if (!g.tiled) {
    out += "#pragma omp parallel for simd schedule(static)" + parallel_if + omp_threads + "\n";
    out += "  for (int64_t o = 0; o < " + literal_int(g.outer) + "; ++o) {\n" + indent(per_outer, 4) + "  }\n";
  } else {
    out += "#pragma omp parallel" + parallel_if + omp_threads + "\n  {\n";
    // A per-thread row of `inner` elements of C++ type T, named `name` (an
    // array, not a std::vector: a std::vector<bool> has no data()).
    auto row = [&](const std::string& T, const std::string& name) {
      return "    const std::unique_ptr<" + T + "[]> " + name + "_storage(new " + T + "[" + literal_int(g.inner) +
             "]);\n    " + T + "* __restrict " + name + " = " + name + "_storage.get();\n";
    };
    for (int b : body.scratch_) out += row(ctype_of(p.buffers[b].dtype), "row_" + p.buffers[b].name);
    for (const CBody::Def& d : kept_rows) out += row(d.ctype, "keep_" + d.name);  // Note [Kept row values]
    out += "#pragma omp for schedule(static)\n";
    out += "    for (int64_t o = 0; o < " + literal_int(g.outer) + "; ++o) {\n" + indent(per_outer, 6) + "    }\n  }\n";
  }
  out += "}\n";
  return out;
}

// Note [Vectorizable exp and erf]
// libm's expf and erff are calls the vectorizer cannot widen (glibc offers
// vector variants only under -ffast-math), and softmax, log_softmax and
// GELU's forward and backward spend most of their time in them; ATen uses
// SLEEF's vector versions. The generated code therefore carries its own
// float exp (Cody-Waite range reduction, Cephes' degree-6 polynomial, the
// scale built from the exponent bits: within 1 ulp of libm over the whole
// float range, inf and 0 where libm gives them, NaN kept) and float erf
// (the rational minimax approximation on [-4, 4] that Eigen and XLA use for
// float, a few ulp), free of branches and of selects GCC cannot if-convert,
// so that with -fno-trapping-math `omp simd` loops vectorize them (5-7x
// libm's scalar calls on this machine). Doubles keep libm.
constexpr const char* kVectorMath = R"(static inline float crucible_exp(float x) {
  // Clamped where exp over- or underflows anyway (89 -> inf, -104 -> 0
  // through the scale below); a NaN passes the clamp and the last term.
  const float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
  const float z = xc * 1.44269504088896341f;
  const int32_t ki = static_cast<int32_t>(z + (z < 0.0f ? -0.5f : 0.5f));
  const float k = static_cast<float>(ki);
  float r = xc - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  // 2^k as two factors, so that k = 128 and k = -150 stay representable.
  const int32_t k1 = ki >> 1;
  const int32_t b1 = (k1 + 127) << 23, b2 = (ki - k1 + 127) << 23;
  float s1, s2;
  __builtin_memcpy(&s1, &b1, 4);
  __builtin_memcpy(&s2, &b2, 4);
  return y * s1 * s2 + (xc - xc);
}
static inline double crucible_exp(double x) { return std::exp(x); }
static inline float crucible_erf(float x) {
  const float xc = x < -4.0f ? -4.0f : (x > 4.0f ? 4.0f : x);
  const float x2 = xc * xc;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 + -2.10102402082508e-06f;
  p = p * x2 + -5.69250639462346e-05f;
  p = p * x2 + -7.34990630326855e-04f;
  p = p * x2 + -2.95459980854025e-03f;
  p = p * x2 + -1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * x2 + -2.13374055278905e-04f;
  q = q * x2 + -1.68282697438203e-03f;
  q = q * x2 + -7.37332916720468e-03f;
  q = q * x2 + -1.42647390514189e-02f;
  return xc * p / q;
}
static inline double crucible_erf(double x) { return std::erf(x); }
// Note [Division] (cuda_codegen.cpp): IEEE here, as ATen's CPU kernels.
static inline float crucible_div(float a, float b) { return a / b; }
static inline double crucible_div(double a, double b) { return a / b; }
)";

// Note [Reduced-precision loops]'s conversions, where a translation unit
// names them: bf16 as its bit pattern (widened exactly, rounded to nearest
// even, a NaN kept a quiet NaN, as c10::BFloat16 converts; branch-free, so
// loops vectorize), f16 through the compiler's _Float16 (IEEE binary16).
constexpr const char* kBf16 = R"(static inline float crucible_bf16_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
static inline uint16_t crucible_float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(f != f ? 0x7fc0u : rounded);
}
)";
constexpr const char* kF16 = R"(static inline float crucible_f16_to_float(uint16_t h) {
  _Float16 x;
  std::memcpy(&x, &h, sizeof x);
  return static_cast<float>(x);
}
static inline uint16_t crucible_float_to_f16(float f) {
  const _Float16 x = static_cast<_Float16>(f);
  uint16_t h;
  std::memcpy(&h, &x, sizeof h);
  return h;
}
)";

}  // namespace

// The most kernels one combined launch takes (its parameters stay far
// below CUDA's limit on a kernel's parameter bytes).
constexpr size_t kMaxCombined = 24;

// Note [Identical kernels]
// A transformer's layers fuse into the same kernels over other buffers:
// GPT-2 small's training step (core decompositions) renders 320 CUDA
// kernels of 38 distinct bodies. As TorchInductor names a kernel by its
// source and defines each source once (the wrapper's src_to_kernel), a
// kernel whose text equals an earlier one's up to its name and its
// buffers' names is not rendered again: its signature takes the earlier
// kernel's name, and the source keeps only its comment, saying whose code
// it runs. Buffers are passed by position, and the text spells out every
// size, stride, dtype and constant, so equal text is the same computation
// on the arguments given. NVRTC and the C++ compiler then see each body
// once.
//
// `text` with the kernel's names (its own and its variants', Note
// [Autotuning] in cuda_codegen.cpp) and every buffer name of `p` in it
// replaced by a position (buffers numbered in order of first appearance),
// so that two kernels compare equal exactly when they differ only there.
// Buffer names are "buf<index>_<value>" (lowering.cpp), and derived
// identifiers (red_<buffer>, row_<buffer>) contain them whole: a
// left-to-right scan that replaces the full name found at each "buf<digits>_"
// consumes each name once.
std::string canonical_kernel_text(const Program& p, const std::string& text, const std::vector<std::string>& names) {
  std::string out;
  out.reserve(text.size());
  std::unordered_map<size_t, size_t> position;
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  auto name_at = [&](size_t i) -> size_t {  // which of `names` starts at i, as a whole identifier
    if (i > 0 && ident(text[i - 1])) return names.size();
    for (size_t k = 0; k < names.size(); ++k) {
      const std::string& name = names[k];
      if (text.compare(i, name.size(), name) == 0 && (i + name.size() == text.size() || !ident(text[i + name.size()])))
        return k;
    }
    return names.size();
  };
  for (size_t i = 0; i < text.size();) {
    if (const size_t k = name_at(i); k < names.size()) {
      out += "\x01K" + std::to_string(k) + "\x01";
      i += names[k].size();
      continue;
    }
    if (text.compare(i, 3, "buf") == 0) {
      size_t j = i + 3, index = 0;
      while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j])))
        index = index * 10 + (text[j++] - '0');
      if (j > i + 3 && j < text.size() && text[j] == '_' && index < p.buffers.size() &&
          text.compare(i, p.buffers[index].name.size(), p.buffers[index].name) == 0) {
        out += "\x01B" + std::to_string(position.emplace(index, position.size()).first->second) + "\x01";
        i += p.buffers[index].name.size();
        continue;
      }
    }
    out += text[i++];
  }
  return out;
}

Schedule compile_schedule(const ir::Graph& graph, int threads) {
  Schedule s;
  s.program = lower(graph);
  Program& p = s.program;
  Scheduler(p).run(s.groups, s.steps);

  // Who reads each computed buffer from outside its group.
  std::unordered_map<int, int> group_of;
  for (size_t gi = 0; gi < s.groups.size(); ++gi)
    for (int li : s.groups[gi].loops) group_of[p.loops[li].buffer] = static_cast<int>(gi);
  std::vector<GroupInfo> info(s.groups.size());
  for (size_t gi = 0; gi < s.groups.size(); ++gi)
    for (int li : s.groups[gi].loops) {
      int b = p.loops[li].buffer;
      info[gi].produced.insert(b);
      if (p.buffers[b].kind == Buffer::Input) info[gi].external.insert(b);  // written in place
    }
  auto mark = [&](int b, int reader_group) {
    auto it = group_of.find(b);
    if (it != group_of.end() && it->second != reader_group) info[it->second].external.insert(b);
  };
  for (size_t gi = 0; gi < s.groups.size(); ++gi)
    for (int li : s.groups[gi].loops)
      for (const Read& r : reads_of(p, p.loops[li], s.groups[gi].outer, s.groups[gi].inner))
        mark(r.buffer, static_cast<int>(gi));
  for (const Schedule::Step& st : s.steps)
    if (st.extern_node)
      for (const ir::Value* v : st.extern_node->inputs())
        if (auto b = p.buffer_of.find(v); b != p.buffer_of.end()) mark(b->second, -1);
  if (const ir::Node* out = graph.output_node())
    for (const ir::Value* v : out->inputs())
      if (auto b = p.buffer_of.find(v); b != p.buffer_of.end()) mark(b->second, -1);

  // What each group's comment says it fuses.
  auto fuses = [&](size_t gi) {
    std::vector<const ir::Node*> nodes;
    for (int li : s.groups[gi].loops)
      for (const ir::Node* n : p.loops[li].nodes)
        if (std::find(nodes.begin(), nodes.end(), n) == nodes.end()) nodes.push_back(n);
    std::string text;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (i == 16) {
        text += " ... (" + std::to_string(nodes.size() - 16) + " more)";
        break;
      }
      text += std::string(i ? " " : "") + "%" + nodes[i]->result()->name() + " (" + nodes[i]->target() + ")";
    }
    return text;
  };
  auto shape = [&](const Group& g) {
    return g.tiled ? "outer " + std::to_string(g.outer) + " × inner " + std::to_string(g.inner)
                   : std::to_string(g.outer) + " elements";
  };
  // Note [Identical kernels]: canonical text -> the kernel defined with it.
  // Its names (the kernel's and its variants'), in order.
  std::unordered_map<std::string, std::vector<std::string>> defined;
  auto emit = [&](KernelSignature sig, const std::string& comment, const std::string& body) {
    std::vector<std::string> names = {sig.name};
    for (const KernelConfig& c : sig.configs)
      if (std::find(names.begin(), names.end(), c.name) == names.end()) names.push_back(c.name);
    const std::string canonical = canonical_kernel_text(p, body, names);
    if (!sig.configs.empty()) sig.tuning_key = cache_key(canonical);
    auto [it, fresh] = defined.try_emplace(canonical, names);
    if (fresh) {
      s.source += std::string(p.device.is_cuda() ? kCudaUnitBreak : "") + comment + body + "\n";
    } else {
      // The same text defines the same variants, in the same order.
      const std::vector<std::string>& first = it->second;
      s.source += comment + "//   runs " + first.front() + "'s code (Note [Identical kernels])\n";
      sig.name = first.front();
      for (KernelConfig& c : sig.configs)
        c.name = first[static_cast<size_t>(std::find(names.begin(), names.end(), c.name) - names.begin())];
    }
    s.kernels.push_back(std::move(sig));
  };
  auto render = [&](size_t gi) {
    KernelSignature sig;
    sig.name = "kernel_" + std::to_string(gi);
    sig.fuses = fuses(gi);
    const Group& g = s.groups[gi];
    std::string body = p.device.is_cuda() ? render_cuda_group(p, g, info[gi], sig.name, sig)
                                          : render_group(p, g, info[gi], sig.name, threads, sig);
    // A group of no elements (an empty batch) computes nothing, and its
    // loop-invariant loads, hoisted before its loops, would read buffers
    // that hold no elements: its kernel does nothing.
    if (g.outer == 0 && !p.device.is_cuda()) body = "extern \"C\" void " + sig.name + "(void* const*) {}\n";
    const std::string comment = "// " + sig.name + " (" + shape(g) + ") fuses: " + sig.fuses + "\n";
    emit(std::move(sig), comment, body);
  };
  if (!p.device.is_cuda()) {
    for (size_t gi = 0; gi < s.groups.size(); ++gi) render(gi);
  } else {
    // Note [Combined launches]: consecutive pointwise kernels that do not
    // depend on each other (an optimizer's per-parameter updates) are
    // launched as one, each taking its own range of blocks.
    std::vector<Schedule::Step> steps;
    std::vector<size_t> run;
    std::unordered_set<int> run_reads, run_writes;
    auto flush = [&] {
      if (run.size() == 1) render(run.front());
      if (run.size() > 1) {
        KernelSignature sig;
        sig.name = "combined_" + std::to_string(run.front());
        std::string comment = "// " + sig.name + " launches kernel_" + std::to_string(run.front()) + " to kernel_" +
                              std::to_string(run.back()) + " as one:\n";
        std::vector<const Group*> groups;
        std::vector<GroupInfo*> infos;
        for (size_t gi : run) {
          groups.push_back(&s.groups[gi]);
          infos.push_back(&info[gi]);
          comment += "//   kernel_" + std::to_string(gi) + " (" + shape(s.groups[gi]) + "): " + fuses(gi) + "\n";
          sig.fuses += std::string(sig.fuses.empty() ? "" : " | ") + fuses(gi);
        }
        const std::string body = render_cuda_combined(p, groups, infos, sig.name, sig);
        emit(std::move(sig), comment, body);
      }
      if (!run.empty()) steps.push_back({nullptr, static_cast<int>(s.kernels.size()) - 1});
      run.clear();
      run_reads.clear();
      run_writes.clear();
    };
    for (const Schedule::Step& st : s.steps) {
      if (st.extern_node) {
        flush();
        steps.push_back(st);
        continue;
      }
      const size_t gi = static_cast<size_t>(st.kernel);
      const Group& g = s.groups[gi];
      std::unordered_set<int> reads, writes(info[gi].produced.begin(), info[gi].produced.end());
      for (int li : g.loops)
        for (const Read& r : reads_of(p, p.loops[li], g.outer, g.inner)) reads.insert(r.buffer);
      bool independent = !g.tiled && run.size() < kMaxCombined;
      for (int b : reads) independent = independent && !run_writes.contains(b);
      for (int b : writes) independent = independent && !run_writes.contains(b) && !run_reads.contains(b);
      if (!independent) flush();
      run.push_back(gi);
      run_reads.insert(reads.begin(), reads.end());
      run_writes.insert(writes.begin(), writes.end());
      if (g.tiled) flush();
    }
    flush();
    s.steps = std::move(steps);
  }
  const bool bf16 = s.source.find("crucible_bf16_") != std::string::npos;
  const bool f16 = s.source.find("crucible_f16_") != std::string::npos;
  if (!s.source.empty() && p.device.is_cuda())
    s.source =
        "// Generated by crucible inductor: one CUDA kernel per fused group over raw\n"
        "// pointers (no ATen), compiled with NVRTC.\n" +
        std::string(cuda_prelude()) + (bf16 || f16 ? cuda_reduced_precision_prelude() : "") + "\n" + s.source;
  else if (!s.source.empty())
    s.source =
        "// Generated by crucible inductor: one function per fused kernel over raw\n"
        "// pointers (no ATen); b[i] is the i-th buffer of the kernel's signature.\n"
        "#include <omp.h>\n\n"
        "#include <cmath>\n#include <cstdint>\n#include <cstring>\n#include <limits>\n#include <memory>\n\n" +
        std::string(kVectorMath) + (bf16 ? kBf16 : "") + (f16 ? kF16 : "") + "\n" + s.source;
  return s;
}

}  // namespace crucible::inductor::detail
