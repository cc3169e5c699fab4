// The C++/OpenMP renderer: see codegen/cpp.h.
#include "codegen/cpp.h"

#include "codegen/render.h"

#include <algorithm>
#include <unordered_set>

namespace crucible::inductor::detail {

namespace {

// A size in kernel text: its spelling over the size symbols, else its
// digits (Note [Dynamic sizes] in dynamic_sizes.cpp).
std::string size_text(int64_t v) { return spelled(v).str(); }

// A kernel's first line and the size symbols it reads from `s`, the
// run-time sizes the plan passes (Note [Dynamic sizes]); every kernel of a
// graph takes them all, so that its text does not depend on which it uses.
std::string kernel_head(const std::string& name) {
  std::string out = "extern \"C\" void " + name + "(void* const* b, const int64_t* s) {\n";
  const SizeTable* table = SizeScope::current();
  const size_t n = table ? table->symbol_values.size() : 0;
  if (n == 0) out += "  (void)s;\n";
  for (size_t i = 0; i < n; ++i)
    out += "  [[maybe_unused]] const int64_t s" + std::to_string(i) + " = s[" + std::to_string(i) + "];\n";
  return out;
}

// extent / k for a k that divides it (a split loop's outer trip count),
// spelled: the symbolic quotient where k's spelling divides the extent's,
// else the quotient's own spelling.
std::string quotient_text(const SizeExpr& extent, int64_t k) {
  const std::optional<SizeExpr> q = exact_div(extent, spelled(k));
  return q ? q->str() : size_text(extent.value() / k);
}

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
// ATen's own loops split no finer: at::internal::GRAIN_SIZE, the grain
// size of TensorIterator's loops (ATen/TensorIterator.h, a heavy header
// for one constant; tests/inductor/test_lowering.cpp checks the two agree).
constexpr int64_t kParallel = 32768;

// The OpenMP clause of a fixed thread count (InductorOptions::threads);
// none for 0, which leaves the count to the caller's OpenMP setting.
std::string num_threads_clause(int threads) {
  return threads > 0 ? " num_threads(" + std::to_string(threads) + ")" : "";
}

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
  Val v = body_value(body, red, g.outer_size, g.inner_size);
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
  const std::string epilogue = column_epilogue(body, p, g, info, T, value);
  const std::string B = std::to_string(kBlock), O = g.outer_size.str();
  std::string out = kernel_head(name) + indent(signature(p, body, info, sig) + body.take(0), 2);
  out += "#pragma omp parallel for schedule(static) if(" + (g.outer_size * g.inner_size).str() +
         " >= " + std::to_string(kParallel) + ")" + num_threads_clause(threads) + "\n";
  out += "  for (int64_t ob = 0; ob < " + O + "; ob += " + B + ") {\n";
  out += "    const int64_t oe = ob + " + B + " < " + O + " ? ob + " + B + " : " + O + ";\n";
  out += "    " + A + " acc[" + B + "];\n    for (int64_t i = 0; i < " + B + "; ++i) acc[i] = " + c.init + ";\n";
  out += indent(nan_decl, 4);
  out += "    for (int64_t r = 0; r < " + g.inner_size.str() + "; ++r) {\n#pragma omp simd\n";
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
// into a fixed number of contiguous chunks, which the threads share; a
// chunk folds each row's part of it as the single loop folds a row, into a
// partial per (row, chunk), and each row's partials are combined in chunk
// order. The chunks depend on the sizes alone, never on the thread count,
// so every run gives the same bits whatever the threads (Note [Threads on
// a shared machine] changes them between calls, and data-parallel ranks
// must apply the same update). A chunk that holds whole rows folds them
// whole: with more rows than chunks this is the row-parallel loop. A
// group of such reductions (the scheduler fuses every reduction of the
// same rows: a var_mean's mean and variance) runs them one after another,
// each split, with the values of each row between them (a mean's
// division, a loss's scaling) computed once a row. Groups with stages over
// the reduced range keep the one loop, and so do rows indexed through
// divisions (an NCHW tensor's sum over N, H and W), which Note [Split
// loops] walks as nested affine loops.
constexpr int64_t kMaxSplitRows = 64;  // rows from which the row-parallel loop gives every thread work
// The chunks of a split reduction: one per kChunkElements elements (few
// enough that a chunk's set-up and its row's fold are noise), at most
// kMaxChunks (the threads that can share one reduction).
constexpr int64_t kChunkElements = 8192, kMaxChunks = 64;

bool affine(const Program& p, const Group& g, const GroupInfo& info, const LoopVars& v, const std::string& var);

bool split_reduction(const Program& p, const Group& g, const GroupInfo& info) {
  if (!g.tiled || g.outer >= kMaxSplitRows || g.inner < kParallel || p.loops[g.loops.front()].column) return false;
  if (std::any_of(g.loops.begin(), g.loops.end(), [&](int li) { return stage_of(p.loops[li], g) == Stage::Inner; }))
    return false;
  return g.outer == 1 || affine(p, g, info, loop_vars(g.outer_size, g.inner_size), "r");
}

std::string render_split_reduction(const Program& p, const Group& g, const GroupInfo& info, const std::string& name,
                                   int threads, KernelSignature& sig) {
  CBody body(p, g, info);
  const Expr o = Expr::var("o", g.outer);
  // The chunk count is computed in the kernel, from the sizes it runs at.
  const std::string OUTER = g.outer_size.str(), INNER = g.inner_size.str(), N = (g.outer_size * g.inner_size).str(),
                    CHUNKS = "chunks", PARTS = g.outer_size.factor_str() + " * chunks";
  const std::string omp_threads = num_threads_clause(threads);
  // A per-row array of `T` named `array`.
  auto rows = [&](const std::string& T, const std::string& array) {
    return "const std::unique_ptr<" + T + "[]> " + array + "(new " + T + "[" + OUTER + "]);\n";
  };
  const std::string per_chunk = "(" + N + ") / " + std::to_string(kChunkElements);
  std::string text = "const int64_t chunks = " + per_chunk + " < 1 ? 1 : " + per_chunk + " > " +
                     std::to_string(kMaxChunks) + " ? " + std::to_string(kMaxChunks) + " : " + per_chunk + ";\n";
  int counter = 0;
  for (int li : g.loops) {
    const Loop& l = p.loops[li];
    const Buffer& buf = p.buffers[l.buffer];
    const std::string T = ctype_of(buf.dtype), red = "red_" + buf.name;
    Val v = body_value(body, l, g.outer_size, g.inner_size);
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
    // A row's partials folded in chunk order (a NaN a chunk saw is in its
    // flag, not its partial); a chunk that holds none of the row left the
    // initial value, which folds to nothing.
    const bool nan = l.rtype != ReductionType::Sum;
    const std::string at = "[o * " + CHUNKS + " + k]";
    const std::string fold = !nan ? acc + " += " + part + at + ";\n"
                                  : acc + " = " + part + at + " " + (l.rtype == ReductionType::Max ? ">" : "<") + " " +
                                        acc + " ? " + part + at + " : " + acc + ";\n" + acc + "_nan |= " + part +
                                        "_nan" + at + ";\n";
    text += "const std::unique_ptr<" + A + "[]> " + part + "(new " + A + "[" + PARTS + "]);\n";
    text += "for (int64_t i = 0; i < " + PARTS + "; ++i) " + part + "[i] = " + c.init + ";\n";
    if (nan) text += "const std::unique_ptr<int[]> " + part + "_nan(new int[" + PARTS + "]());\n";
    text += "#pragma omp parallel for schedule(static)" + omp_threads + "\n";
    text += "for (int64_t k = 0; k < " + CHUNKS + "; ++k) {\n";
    text += "  const int64_t lo = (" + N + ") * k / " + CHUNKS + ", hi = (" + N + ") * (k + 1) / " + CHUNKS + ";\n";
    text += "  for (int64_t o = lo / " + INNER + "; o < " + OUTER + " && o * " + INNER + " < hi; ++o) {\n";
    text += "    const int64_t r_lo = lo > o * " + INNER + " ? lo - o * " + INNER + " : 0;\n";
    text += "    const int64_t r_hi = hi < (o + 1) * " + INNER + " ? hi - o * " + INNER + " : " + INNER + ";\n";
    text += "    " + A + " " + acc + " = " + c.init + ";\n" + indent(c.extra_decl, 4) + indent(c.pragma, 4);
    text += "    for (int64_t r = r_lo; r < r_hi; ++r) {\n" + indent(inner + c.combine, 6) + "    }\n";
    text +=
        "    " + part + at + " = " + acc + ";\n" + (nan ? "    " + part + "_nan" + at + " = " + acc + "_nan;\n" : "");
    text += "  }\n}\n";
    std::string value = c.result.empty() ? "static_cast<" + T + ">(" + acc + ")" : c.result;
    if (!l.finalize.empty()) value = substitute(l.finalize, value);
    std::string per_row = A + " " + acc + " = " + c.init + ";\n" + c.extra_decl + "for (int64_t k = 0; k < " + CHUNKS +
                          "; ++k) {\n" + indent(fold, 2) + "}\n" + red + "[o] = " + value + ";\n";
    if (info.external.contains(l.buffer)) per_row += body.store(l.buffer, store_offset(p, l, o), red + "[o]");
    text += rows(T, red) + "for (int64_t o = 0; o < " + OUTER + "; ++o) {\n" + indent(per_row, 2) + "}\n";
    body.set_local(l.buffer, red + "[o]");
  }
  std::string out = kernel_head(name) + indent(signature(p, body, info, sig) + body.take(0), 2);
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
    if (!in_registers && !buf.host_scalar) offsets.push_back(dot(index, spelled_strides(buf)));
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
      body.offsets.push_back(store_offset(p, l, v.o * v.inner_size + v.r));
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
  // lowering/pad_and_cat.cpp) is affine over the innermost of them.
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
    if (!red || red->rnumel() != g.inner || affine(p, g, info, loop_vars(g.outer_size, g.inner_size), "r")) return {};
    for (int64_t k : candidates(red->rsizes))
      if (affine(p, g, info, loop_vars(g.outer_size, g.inner_size, 0, k), "rl")) return {0, k};
    return {};
  }
  if (first.numel() != g.outer || affine(p, g, info, loop_vars(g.outer_size, g.inner_size), "o")) return {};
  std::vector<int64_t> dims;
  for (size_t k = 0; k < first.sizes.size(); ++k)
    dims.push_back(first.sizes[first.order.empty() ? k : static_cast<size_t>(first.order[k])]);
  for (int64_t k : candidates(dims)) {
    if (g.outer * g.inner >= kParallel && g.outer / k < kMinRows) continue;
    if (affine(p, g, info, loop_vars(g.outer_size, g.inner_size, k, 0), "ol")) return {k, 0};
  }
  return {};
}

}  // namespace

// Note [Kept row values]
// A row group's stages each walk the row, and without more, each computes
// again what it reads of an earlier stage's values: a softmax's third loop
// loads x and takes exp(x - max) a second time. In a row of at most
// kMaxKeptRow elements, a value that a later loop reads again is kept in a
// per-thread row instead (as the CUDA kernels keep theirs in registers,
// Note [Persistent rows] in codegen/cuda.cpp), read back from L1 where it
// would have been recomputed. A value that is a load of memory is loaded
// again under its name instead, which costs what reading a copy would. Loads of memory are not kept: a later loop
// loads them again, which costs what reading a kept copy would.
std::string render_cpp_group(const Program& p, const Group& g, const GroupInfo& info, const std::string& name,
                             int threads, KernelSignature& sig) {
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
  const LoopVars vars = loop_vars(g.outer_size, g.inner_size, split.outer, split.inner);
  const Expr& o = vars.o;
  const Expr& r = vars.r;
  const std::string omp_threads = num_threads_clause(threads);
  // The loop (or nest) over the inner range, `pragma` on its innermost loop.
  auto inner_loop = [&](const std::string& pragma, const std::string& lines) {
    if (split.inner == 0)
      return pragma + "for (int64_t r = 0; r < " + g.inner_size.str() + "; ++r) {\n" + indent(lines, 2) + "}\n";
    return "for (int64_t rh = 0; rh < " + quotient_text(g.inner_size, split.inner) + "; ++rh) {\n" +
           indent(pragma + "for (int64_t rl = 0; rl < " + size_text(split.inner) + "; ++rl) {\n" + indent(lines, 2) +
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
        Expr at = store_offset(p, l, o * vars.inner_size + r);
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
  std::string out = kernel_head(name) + indent(decls + body.take(0), 2);
  const std::string parallel_if =
      " if(" + (g.outer_size * g.inner_size).str() + " >= " + std::to_string(kParallel) + ")";
  if (!g.tiled && split.outer) {
    out += "#pragma omp parallel for schedule(static)" + parallel_if + omp_threads + "\n";
    out += "  for (int64_t oh = 0; oh < " + quotient_text(g.outer_size, split.outer) + "; ++oh) {\n" +
           indent(per_outer, 4);
    out += "#pragma omp simd\n    for (int64_t ol = 0; ol < " + size_text(split.outer) + "; ++ol) {\n" +
           indent(per_inner, 6) + "    }\n  }\n";
  } else if (!g.tiled) {
    out += "#pragma omp parallel for simd schedule(static)" + parallel_if + omp_threads + "\n";
    out += "  for (int64_t o = 0; o < " + g.outer_size.str() + "; ++o) {\n" + indent(per_outer, 4) + "  }\n";
  } else {
    out += "#pragma omp parallel" + parallel_if + omp_threads + "\n  {\n";
    // A per-thread row of `inner` elements of C++ type T, named `name` (an
    // array, not a std::vector: a std::vector<bool> has no data()).
    auto row = [&](const std::string& T, const std::string& name) {
      return "    const std::unique_ptr<" + T + "[]> " + name + "_storage(new " + T + "[" + g.inner_size.str() +
             "]);\n    " + T + "* __restrict " + name + " = " + name + "_storage.get();\n";
    };
    for (int b : body.scratch_) out += row(ctype_of(p.buffers[b].dtype), "row_" + p.buffers[b].name);
    for (const CBody::Def& d : kept_rows) out += row(d.ctype, "keep_" + d.name);  // Note [Kept row values]
    out += "#pragma omp for schedule(static)\n";
    out += "    for (int64_t o = 0; o < " + g.outer_size.str() + "; ++o) {\n" + indent(per_outer, 6) + "    }\n  }\n";
  }
  out += "}\n";
  return out;
}

}  // namespace crucible::inductor::detail
