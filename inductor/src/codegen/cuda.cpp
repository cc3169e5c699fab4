// The CUDA C++ renderer: see codegen/cuda.h and Note [CUDA rendering].
#include "codegen/cuda.h"

#include "codegen/render.h"

#include <algorithm>
#include <numeric>
#include <unordered_map>

namespace crucible::inductor::detail {

// Note [CUDA rendering]
// The CUDA renderer takes the groups the scheduler made (Note [Fusion]) and
// the bodies CBody writes, exactly as the C++ renderer does; only the loops
// around the bodies differ (torch/_inductor's Triton kernels split the same
// way into pointwise, reduction and persistent-reduction templates):
//  - pointwise (a group of loops over `outer` elements): a thread per
//    element or per vector of them (Note [Vectorized pointwise kernels]),
//    grid-stride;
//  - a row group (reductions with their prologues and epilogues: a softmax
//    or layer-norm row): one block per outer index, grid-stride over o,
//    its threads striding over the inner range. A reduction folds each
//    thread's share, then combines across the block (warp shuffles, one
//    shared-memory exchange); every thread gets the result. Values of an
//    inner stage read later in the row live in a shared-memory scratch row
//    (in global memory, as a buffer of their own, when the rows do not fit
//    in kSharedBudget). A barrier ends each inner stage and each row: a
//    later stage may read any element of the row that an earlier one wrote,
//    or overwrite one it read (an in-place write-back);
//  - a column reduction (Loop::column): a block per tile of 32 kept indices,
//    each warp of the block walking every kColumnRows-th reduced index over
//    them (a warp's loads are contiguous), the warps' partials combined in
//    shared memory; the kept indices' epilogues run after.
// Index arithmetic is 32-bit when every index the kernel forms fits
// (division and remainder by a constant cost several times more in 64
// bits), 64-bit otherwise. Float sums accumulate in float, as ATen's CUDA
// reductions do (the C++ renderer sums floats in double); max and min
// propagate NaN as ATen's do; floats divide as Triton's do (Note
// [Division]).
namespace {

constexpr int kPointwiseBlock = 256;
constexpr int kWarp = 32;
constexpr int kColumnRows = 16;         // a column tile: kWarp kept indices × kColumnRows reduced
constexpr int64_t kColumnBlocks = 512;  // what a split column reduction aims at (Note [Split column reductions])
constexpr int64_t kMinSplitRows = 16;   // reduced indices a row of a split's block walks at least
constexpr int kMaxRowBlock = 512;
constexpr int kMaxThreads = 1024;  // a block's most on every CUDA device
constexpr int64_t kRowElements = 8;
constexpr int64_t kMaxPersistentSlots = 8;           // elements of a row a thread holds (Note [Persistent rows])
constexpr int64_t kMaxPartBlocks = 1024;             // a part of a combined launch (Note [Combined launches])
constexpr int64_t kSharedBudget = 48 * 1024;         // what a block gets without opting in
constexpr int64_t kIndex32Limit = int64_t{1} << 30;  // headroom for a grid stride past the end

// Bytes of an element of a scratch row, which holds values as bodies
// compute them (bf16 and f16 in float).
int64_t scratch_size_of(c10::ScalarType t) {
  return reduced_precision(t) ? 4 : static_cast<int64_t>(c10::elementSize(t));
}

// The largest element offset (+ 1) a buffer's layout reaches.
int64_t extent(const Buffer& b) {
  int64_t e = 1;
  for (size_t d = 0; d < b.sizes.size(); ++d) {
    if (b.sizes[d] == 0) return 0;
    e += (b.sizes[d] - 1) * b.strides[d];
  }
  return e;
}

// Threads for a row: about kRowElements elements each, so that a block
// has work to overlap its loads with and an SM holds several blocks.
int row_block(int64_t inner) {
  int b = 32;
  while (b < kMaxRowBlock && b * kRowElements < inner) b *= 2;
  return b;
}

// The reduction functor of the prelude, the accumulator's initial value.
std::string combiner(ReductionType t) {
  return t == ReductionType::Sum ? "CrucibleSum" : t == ReductionType::Max ? "CrucibleMax" : "CrucibleMin";
}
std::string init_of(ReductionType t, const std::string& A) {
  return t == ReductionType::Sum   ? A + "(0)"
         : t == ReductionType::Max ? "crucible_lowest<" + A + ">()"
                                   : "crucible_highest<" + A + ">()";
}
// Shuffles move no bool: bool reductions accumulate in int.
std::string acc_type(const std::string& T) { return T == "bool" ? "int" : T; }
// Bytes of an accumulator of C++ type `A` (acc_type of a ctype_of).
int64_t acc_bytes(const std::string& A) { return A == "double" || A == "int64_t" ? 8 : 4; }

// The kernel's parameters, one pointer a buffer in body.args order; fills
// the signature the runtime passes them by.
std::string parameters(const Program& p, const CBody& body, const GroupInfo& info, KernelSignature& sig) {
  std::string params;
  for (int b : body.args) {
    const bool written = info.produced.contains(b);
    sig.buffers.push_back(b);
    sig.written.push_back(written);
    const Buffer& buf = p.buffers[b];
    params += std::string(params.empty() ? "" : ", ") + (written ? "" : "const ") + storage_ctype_of(buf.dtype) +
              (buf.host_scalar ? " " : "* __restrict__ ") + buf.name;
  }
  return params;
}

// "int" when every index the kernel forms fits in 32 bits: the loop
// ranges and the layouts of the buffers it touches.
std::string index_type(const Program& p, const Group& g, const CBody& body) {
  int64_t most = g.outer * std::max<int64_t>(g.inner, 1);
  for (int b : body.args) most = std::max({most, extent(p.buffers[b]), p.buffers[b].numel()});
  return most < kIndex32Limit ? "int" : "int64_t";
}

std::string kernel(const std::string& name, int block, const std::string& params, const std::string& body) {
  return "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(block) + ") " + name + "(" + params +
         ") {\n" + body + "}\n";
}

// Note [Vectorized pointwise kernels]
// A thread of a pointwise kernel takes `width` consecutive elements (16
// bytes of its narrowest buffer: 8 of bf16, 4 of float), o = width·oh + ol:
// a load or store of element base + ol, base a multiple of the width, is
// one 16-byte access of the whole vector (two for a float vector beside
// bf16 ones), and what depends on oh alone is computed once per vector.
// Triton's pointwise kernels in torch.compile move their elements the same
// way. On an H100 it took GPT-2's GELU rows ([8192, 3072] bf16, a float
// bias) from 72 to 49 us a layer forward and from 91 to 58 us backward
// (CRUCIBLE_INDUCTOR_PROFILE); the compiler does not merge the scalar
// accesses of an unrolled loop into vector ones by itself, even with the
// pointers declared aligned. The vector accesses need 16-byte-aligned
// pointers, which the caching allocator gives but a view with a storage
// offset may not: the kernel tests its pointers once (crucible_aligned)
// and, where one is not aligned, the same loops access element by element.
// Groups of a number of elements the width does not divide, and groups
// writing a graph input in place (Note [In-place write-backs]: a hoisted
// load could move before a store), stay one element a thread.

// The widest vector of at most 16 bytes of the group's narrowest buffer
// (and at most 8 elements) whose width divides `count`; 1 for none.
int64_t vector_width(const Program& p, const Group& g, int64_t count) {
  int64_t narrowest = 16;
  for (int li : g.loops) {
    const Loop& l = p.loops[li];
    if (p.buffers[l.buffer].kind == Buffer::Input) return 1;
    narrowest = std::min<int64_t>(narrowest, c10::elementSize(p.buffers[l.buffer].dtype));
    for (const Read& r : reads_of(p, l, g.outer_size, g.inner_size))
      narrowest = std::min<int64_t>(narrowest, c10::elementSize(p.buffers[r.buffer].dtype));
  }
  int64_t width = std::min<int64_t>(16 / narrowest, 8);
  while (width > 1 && count % width != 0) width /= 2;
  return width;
}

// The statement defining crucible_aligned, which a vectorized kernel's
// vector accesses take: whether every pointer they access is 16-byte
// aligned. Empty when the kernel has none.
std::string aligned_flag(const CBody& body) {
  std::string bits;
  for (const std::string& a : body.vector_args())
    bits += std::string(bits.empty() ? "" : " | ") + "reinterpret_cast<unsigned long long>(" + a + ")";
  return bits.empty() ? "" : "  const bool crucible_aligned = ((" + bits + ") & 15) == 0;\n";
}

// A pointwise group's loop over the blocks `bid` of `nblocks` (blockIdx.x
// and gridDim.x for a kernel of its own; a range of a combined launch's
// blocks otherwise), kPointwiseBlock threads a block, each taking `units`
// of the work: vectors of Note [Vectorized pointwise kernels].
struct PointwiseText {
  std::string params, body;
  int64_t units = 0;
};
PointwiseText pointwise_text(const Program& p, const Group& g, const GroupInfo& info, KernelSignature& sig,
                             const std::string& bid, const std::string& nblocks, int64_t width) {
  const bool vector = width > 1;
  CBody body(p, g, info);
  const LoopVars vars =
      vector ? loop_vars(g.outer_size, g.inner_size, width, 0) : loop_vars(g.outer_size, g.inner_size);
  if (vector) {
    body.vectorize(width);
    body.keep_inner_values();  // an element's values stay named across the group's loops
  }
  const int element = vector ? 2 : 1;  // the level of what is computed per element
  std::string per_element;
  for (int li : g.loops) {
    const Loop& l = p.loops[li];
    Val v = body_value(body, l, vars);
    per_element += body.take(element);
    if (info.external.contains(l.buffer)) {
      per_element += body.store(l.buffer, store_offset(p, l, vars.o), v.name);
      body.stored(l.buffer);
    }
    body.set_local(l.buffer, v.name, std::max(v.level, 1));
  }
  // Vectors only where every store is one (not so when the width splits a
  // dimension of the memory order: a channels-last tensor of 3 channels).
  if (vector) {
    const std::vector<std::string>& vectors = body.vector_args();
    for (int li : g.loops) {
      const int b = p.loops[li].buffer;
      if (info.external.contains(b) && std::find(vectors.begin(), vectors.end(), p.buffers[b].name) == vectors.end())
        return pointwise_text(p, g, info, sig, bid, nblocks, 1);
    }
  }
  const std::string B = std::to_string(kPointwiseBlock), i = vector ? "oh" : "o";
  PointwiseText t;
  t.units = g.outer / width;
  t.params = parameters(p, body, info, sig);
  t.body = "  typedef " + index_type(p, g, body) + " idx_t;\n" + aligned_flag(body) + indent(body.take(0), 2);
  std::string per_thread = per_element;
  if (vector)
    per_thread = body.take(1) + "#pragma unroll\nfor (int ol = 0; ol < " + std::to_string(width) + "; ++ol) {\n" +
                 indent(per_element, 2) + "}\n" + body.take_after();
  t.body += "  for (idx_t " + i + " = static_cast<idx_t>(" + bid + ") * " + B + " + static_cast<idx_t>(threadIdx.x); " +
            i + " < " + std::to_string(t.units) + "; " + i + " += static_cast<idx_t>(" + nblocks + ") * " + B +
            ") {\n" + indent(per_thread, 4) + "  }\n";
  return t;
}

std::string render_pointwise(const Program& p, const Group& g, const GroupInfo& info, const std::string& name,
                             KernelSignature& sig) {
  const PointwiseText t = pointwise_text(p, g, info, sig, "blockIdx.x", "gridDim.x", vector_width(p, g, g.outer));
  sig.launch = {kPointwiseBlock, t.units, kPointwiseBlock, 0};
  return kernel(name, kPointwiseBlock, t.params, t.body);
}

// Note [Split column reductions]
// A column reduction has a block per tile of kWarp kept indices: a bias's
// gradient, [8192, 768] summed over its 8192 rows, makes 24 blocks, which
// leave most of an H100's 132 multiprocessors idle (GPT-2's layer-norm and
// bias gradients took 8 ms a step so, against 1.3 ms in torch.compile's).
// Such a reduction is split along its reduced range as well: each of a
// tile's `splits` blocks combines its share of the rows into a partial per
// kept index, written to a workspace; the block that finishes a tile last
// (an arrival count per tile, atomically incremented after a fence, as
// CUDA's threadFenceReduction sample does) combines the tile's partials in
// split order and runs the epilogues. The partials are combined in the
// same order whichever block is last, so the results are the same bits
// every run. The runtime makes the workspace and the zeroed counts for
// each launch, on the launch's stream (Launch::partial_bytes, ::arrivals),
// so calls on several streams, and captured CUDA graphs, each have their
// own.
int64_t column_splits(int64_t tiles, int64_t inner) {
  const int64_t most = std::max<int64_t>(1, inner / (kColumnRows * kMinSplitRows));
  return std::clamp<int64_t>(kColumnBlocks / std::max<int64_t>(tiles, 1), 1, most);
}

std::string render_column(const Program& p, const Group& g, const GroupInfo& info, const std::string& name,
                          KernelSignature& sig) {
  CBody body(p, g, info);
  const Loop& red = p.loops[g.loops.front()];
  const Buffer& rbuf = p.buffers[red.buffer];
  const std::string T = ctype_of(rbuf.dtype), A = acc_type(T), f = combiner(red.rtype);
  const std::string W = std::to_string(kWarp), R = std::to_string(kColumnRows), OUTER = std::to_string(g.outer);
  const int64_t tiles = (g.outer + kWarp - 1) / kWarp;
  const int64_t splits = column_splits(tiles, g.inner);
  const std::string S = std::to_string(splits);
  const int64_t chunk = (g.inner + splits - 1) / splits;
  Val v = body_value(body, red, g.outer_size, g.inner_size);
  // Lane x of the tile's row y: kept index ob + x, reduced indices y,
  // y + kColumnRows, ... (of the block's split); then the rows' partials are
  // combined in shared memory, in order, by the tile's first row.
  std::string per_tile = "const idx_t o = ob + static_cast<idx_t>(threadIdx.x % " + W + ");\n" + A +
                         " acc = " + init_of(red.rtype, A) + ";\nif (o < " + OUTER + ") {\n";
  const std::string r_begin = splits == 1
                                  ? "static_cast<idx_t>(threadIdx.x / " + W + ")"
                                  : "s * " + std::to_string(chunk) + " + static_cast<idx_t>(threadIdx.x / " + W + ")";
  const std::string r_end = splits == 1
                                ? std::to_string(g.inner)
                                : "((s + 1) * " + std::to_string(chunk) + " < " + std::to_string(g.inner) +
                                      " ? (s + 1) * " + std::to_string(chunk) + " : " + std::to_string(g.inner) + ")";
  per_tile += "  for (idx_t r = " + r_begin + "; r < " + r_end + "; r += " + R + ") {\n" +
              indent(body.take_inner() + "acc = " + f + "()(acc, " + A + "(" + v.name + "));\n", 4) + "  }\n}\n";
  per_tile += "partial[threadIdx.x / " + W + "][threadIdx.x % " + W + "] = acc;\n__syncthreads();\n";
  std::string value = "static_cast<" + T + ">(acc)";
  if (!red.finalize.empty()) value = substitute(red.finalize, value);
  const std::string epilogue = column_epilogue(body, p, g, info, T, value);
  const std::string rows = "for (int y = 1; y < " + R + "; ++y) acc = " + f + "()(acc, partial[y][threadIdx.x]);\n";
  if (splits == 1) {
    per_tile +=
        "if (threadIdx.x < " + W + " && o < " + OUTER + ") {\n" + indent(rows + epilogue, 2) + "}\n__syncthreads();\n";
  } else {  // Note [Split column reductions]
    per_tile += "if (threadIdx.x < " + W + ") {\n" + indent(rows, 2) + "  if (o < " + OUTER +
                ") crucible_partials[s * " + OUTER + " + o] = acc;\n  __threadfence();\n}\n__syncthreads();\n";
    per_tile += "if (threadIdx.x == 0) last = atomicAdd(&crucible_arrivals[u / " + S +
                "], 1u) == " + std::to_string(splits - 1) + "u;\n__syncthreads();\n";
    per_tile += "if (last && threadIdx.x < " + W + ") {\n  __threadfence();\n  acc = " + init_of(red.rtype, A) +
                ";\n  if (o < " + OUTER + ") {\n    for (int k = 0; k < " + S + "; ++k) acc = " + f +
                "()(acc, __ldcg(&crucible_partials[k * " + OUTER + " + o]));\n" + indent(epilogue, 4) +
                "  }\n}\n__syncthreads();\n";
  }
  const int block = kWarp * kColumnRows;
  std::string params = parameters(p, body, info, sig);
  if (splits > 1) params += ", " + A + "* __restrict__ crucible_partials, unsigned* __restrict__ crucible_arrivals";
  std::string text =
      "  typedef " + index_type(p, g, body) + " idx_t;\n  __shared__ " + A + " partial[" + R + "][" + W + " + 1];\n";
  if (splits > 1) text += "  __shared__ bool last;\n";
  text += indent(body.take(0), 2);
  if (splits == 1) {
    text += "  for (idx_t ob = static_cast<idx_t>(blockIdx.x) * " + W + "; ob < " + OUTER +
            "; ob += static_cast<idx_t>(gridDim.x) * " + W + ") {\n" + indent(per_tile, 4) + "  }\n";
    sig.launch = {block, g.outer, kWarp, 0};
  } else {
    text += "  for (idx_t u = static_cast<idx_t>(blockIdx.x); u < " + std::to_string(tiles * splits) +
            "; u += static_cast<idx_t>(gridDim.x)) {\n    const idx_t ob = (u / " + S + ") * " + W + ", s = u % " + S +
            ";\n" + indent(per_tile, 4) + "  }\n";
    sig.launch = {block, tiles * splits, 1, 0};
    sig.launch.partial_bytes = splits * g.outer * acc_bytes(A);
    sig.launch.arrivals = tiles;
  }
  return kernel(name, block, params, text);
}

// Note [Persistent rows]
// A row of at most kMaxPersistentSlots elements a thread is held in
// registers, as torch/_inductor's persistent reductions hold theirs: every
// stage walks a thread's elements r = threadIdx.x + j·B (j < K) in a fully
// unrolled loop, and a value an earlier stage computed that a later stage
// reads again (the row's loads; a softmax's scaled and masked scores) is
// kept in a K-slot register array instead of being loaded and computed
// once per stage. A softmax then reads its row once, not three times, and
// its backward once, not four. Where the row's length and the thread's K
// elements allow, a thread holds K/V vectors of V consecutive elements
// instead, r = V·rh + rl with rh = threadIdx.x + c·B, and moves them with
// 16-byte accesses (Note [Vectorized pointwise kernels]); its elements
// are then combined in that order, which is not the looped form's.
//
// Note [Online softmax]
// A looped row (too long for a thread's registers: the loss's log-softmax
// over GPT-2's 50257-word vocabulary) walks its elements from memory once
// per stage, and a softmax's max and its sum of exp(x - max) are two
// stages: two passes over the logits. When lowering marks the sum as that
// (Loop::online_max), the two stages are one (TorchInductor's
// prepare_softmax_online, from Milakov and Gimelshein's online
// normalizer): a thread keeps a running maximum m and the sum s of
// exp(x - m), multiplying s by exp(m_old - m_new) when m grows, and pairs
// from the threads combine the same way. Sums come out within rounding of
// the two-pass ones; an infinite or NaN maximum gives a NaN sum, as there.
// Persistent rows read their elements once already and keep two stages.
// A row group's kernel, a block per row (Note [CUDA rendering]): its
// stages in pieces (a piece run once per row, or a loop over the row's
// elements), then the pieces as a looped or a persistent row, then the
// kernel around them.
class RowKernel {
 public:
  RowKernel(const Program& p, const Group& g, GroupInfo& info, int block)
      : p_(p), g_(g), info_(info), block_(block), body_(p, g, info) {
    place_scratch_rows();
    slots_ = (g.inner + block - 1) / block;
    persistent_ = slots_ <= kMaxPersistentSlots;
    // A persistent row's thread holds vectors of `width` consecutive elements
    // (Note [Vectorized pointwise kernels]): r = width·rh + rl.
    width_ = persistent_ ? vector_width(p, g, std::gcd(slots_, g.inner)) : 1;
    vars_ = loop_vars(g.outer_size, g.inner_size, 0, width_ > 1 ? width_ : 0);
    if (persistent_) body_.keep_inner_values();
    if (width_ > 1) {
      body_.vectorize(width_, "rl");
      body_.set_row_element(vars_.r);
    }
  }

  // The kernel `name`; fills `sig`'s buffers and launch.
  std::string render(const std::string& name, KernelSignature& sig) {
    for (size_t k = 0; k < g_.loops.size(); ++k) stage(k);
    if (persistent_) keep_needed_scratch_rows();
    return kernel_text(name, sig, persistent_ ? persistent_row() : looped_row());
  }

 private:
  // A store to a persistent row's scratch row, made only if a later stage
  // reads the row at another element than the thread's own.
  struct ScratchStore {
    size_t piece;
    int buffer;
    std::string line;
  };

  // Scratch rows: inner-stage values read only inside the group. Too many
  // bytes for shared memory, and they become buffers of their own.
  void place_scratch_rows() {
    for (int li : g_.loops) {
      const Loop& l = p_.loops[li];
      if (stage_of(l, g_) == Stage::Inner && !info_.external.contains(l.buffer)) {
        scratch_.push_back(l.buffer);
        bytes_ += row_bytes(l.buffer);
      }
    }
    if (bytes_ > kSharedBudget) {
      for (int b : scratch_) info_.external.insert(b);
      scratch_.clear();
      bytes_ = 0;
    }
  }

  // A scratch row's bytes in shared memory, 16-byte aligned.
  int64_t row_bytes(int b) const { return (g_.inner * scratch_size_of(p_.buffers[b].dtype) + 15) / 16 * 16; }

  // Pieces: text run once per row, and loops over its elements (a stage's
  // statements and the level-2 values they define).
  void once(std::string text) { pieces_.push_back({std::move(text), false, {}, {}, {}, {}}); }
  void over_row(std::string text) {
    pieces_.push_back({std::move(text), true, body_.take_defs(), {}, body_.take_vector_lines(), body_.take_after()});
  }

  // The pieces of loop g.loops[k] (and, for an online softmax, of the next
  // one too: k then moves past it).
  void stage(size_t& k) {
    const Loop& l = p_.loops[g_.loops[k]];
    // An in-place write-back: every thread has done its reads of the old values.
    if (p_.buffers[l.buffer].kind == Buffer::Input) once("__syncthreads();\n");
    const Val v = body_value(body_, l, vars_);
    switch (stage_of(l, g_)) {
      case Stage::Scalar:
        scalar_stage(l, v);
        break;
      case Stage::Inner:
        inner_stage(l, v);
        break;
      case Stage::Reduce:
        reduce_stage(k, v);
        break;
    }
  }

  void scalar_stage(const Loop& l, const Val& v) {
    std::string text = body_.take(1);
    if (info_.external.contains(l.buffer)) {
      text += "if (threadIdx.x == 0) " + body_.store(l.buffer, store_offset(p_, l, vars_.o), v.name);
      body_.stored(l.buffer);
    }
    body_.set_local(l.buffer, v.name);
    once(std::move(text));
  }

  void inner_stage(const Loop& l, const Val& v) {
    const Expr& r = vars_.r;
    std::string inner_lines = body_.take(2);
    once(body_.take(1));
    std::string scratch_store;
    if (info_.external.contains(l.buffer)) {
      inner_lines += body_.store(l.buffer, store_offset(p_, l, vars_.o * g_.inner + r), v.name);
      body_.stored(l.buffer);
    } else if (persistent_) {
      // Kept only if a later stage reads the row at another element.
      scratch_store = "row_" + p_.buffers[l.buffer].name + "[" + r.str() + "] = " + v.name + ";\n";
      body_.set_row_local(l.buffer, v);
    } else {
      inner_lines += body_.scratch(l.buffer) + "[r] = " + v.name + ";\n";
    }
    over_row(std::move(inner_lines));
    if (!scratch_store.empty()) scratch_stores_.push_back({pieces_.size() - 1, l.buffer, std::move(scratch_store)});
    once("__syncthreads();\n");
  }

  void reduce_stage(size_t& k, const Val& v) {
    const int li = g_.loops[k];
    const Loop& l = p_.loops[li];
    const Buffer& buf = p_.buffers[l.buffer];
    const std::string T = ctype_of(buf.dtype);
    std::string inner_lines = body_.take(2);
    const bool online = !persistent_ && l.rtype == ReductionType::Max && k + 1 < g_.loops.size() &&
                        p_.loops[g_.loops[k + 1]].online_max == li &&
                        stage_of(p_.loops[g_.loops[k + 1]], g_) == Stage::Reduce;
    if (online) return online_softmax(l, p_.loops[g_.loops[++k]], v, std::move(inner_lines));
    const std::string A = acc_type(T), acc = "acc" + std::to_string(acc_counter_++), f = combiner(l.rtype);
    once(body_.take(1) + A + " " + acc + " = " + init_of(l.rtype, A) + ";\n");
    over_row(inner_lines + acc + " = " + f + "()(" + acc + ", " + A + "(" + v.name + "));\n");
    std::string value = "static_cast<" + T + ">(" + acc + ")";
    if (!l.finalize.empty()) value = substitute(l.finalize, value);
    const std::string red = "red_" + buf.name;
    std::string text = acc + " = crucible_block_reduce(" + acc + ", " + f + "());\n";
    text += "const " + T + " " + red + " = " + value + ";\n";
    if (info_.external.contains(l.buffer))
      text += "if (threadIdx.x == 0) " + body_.store(l.buffer, store_offset(p_, l, vars_.o), red);
    body_.set_local(l.buffer, red);
    once(std::move(text));
  }

  // Note [Online softmax]: the maximum `max` and the next loop's sum `sum`
  // of exponentials in one pass.
  void online_softmax(const Loop& max, const Loop& sum, const Val& v, std::string inner_lines) {
    const std::string A = acc_type(ctype_of(p_.buffers[max.buffer].dtype));
    const std::string m = "acc" + std::to_string(acc_counter_++), s = "acc" + std::to_string(acc_counter_++);
    once(body_.take(1) + A + " " + m + " = crucible_lowest<" + A + ">(), " + s + " = " + A + "(0);\n");
    over_row(inner_lines + "crucible_online_add(" + m + ", " + s + ", " + A + "(" + v.name + "));\n");
    std::string text = "crucible_block_reduce_online(" + m + ", " + s + ");\n";
    auto result = [&](const Loop& r, std::string value) {
      const Buffer& rb = p_.buffers[r.buffer];
      const std::string RT = ctype_of(rb.dtype), red = "red_" + rb.name;
      value = "static_cast<" + RT + ">(" + value + ")";
      if (!r.finalize.empty()) value = substitute(r.finalize, value);
      text += "const " + RT + " " + red + " = " + value + ";\n";
      if (info_.external.contains(r.buffer))
        text += "if (threadIdx.x == 0) " + body_.store(r.buffer, store_offset(p_, r, vars_.o), red);
      body_.set_local(r.buffer, red);
    };
    result(max, m);
    // A maximum that is infinite or NaN makes every exp(x - max) of the
    // two-pass sum NaN, or one of them: so is this one.
    result(sum, "(" + m + " - " + m + " == " + A + "(0) ? " + s + " : std::numeric_limits<" + A + ">::quiet_NaN())");
    once(std::move(text));
  }

  // A persistent row's scratch rows hold only what is read at another
  // element than the thread's own.
  void keep_needed_scratch_rows() {
    for (const ScratchStore& st : scratch_stores_)
      if (body_.scratch_.contains(st.buffer)) pieces_[st.piece].text += st.line;
    std::erase_if(scratch_, [&](int b) { return !body_.scratch_.contains(b); });
    bytes_ = 0;
    for (int b : scratch_) bytes_ += row_bytes(b);
  }

  // A looped row: each loop strides over the row's elements.
  std::string looped_row() const {
    const std::string B = std::to_string(block_), INNER = std::to_string(g_.inner);
    std::string per_outer;
    for (const RowPiece& piece : pieces_)
      per_outer += piece.over_row ? "for (idx_t r = static_cast<idx_t>(threadIdx.x); r < " + INNER + "; r += " + B +
                                        ") {\n" + indent(piece.text, 2) + "}\n"
                                  : piece.text;
    return per_outer;
  }

  // A persistent row: each loop unrolled over the thread's elements (or
  // its vectors of them), what a later loop reads again kept in register
  // arrays.
  std::string persistent_row() const {
    const std::string B = std::to_string(block_), INNER = std::to_string(g_.inner), K = std::to_string(slots_);
    std::string per_outer;
    const std::vector<std::vector<bool>> kept = read_later(pieces_);
    for (const CBody::Def& d : kept_defs(pieces_, kept)) per_outer += d.ctype + " " + d.name + "_row[" + K + "];\n";
    const bool ragged = slots_ * block_ != g_.inner;
    for (size_t k = 0; k < pieces_.size(); ++k) {
      if (!pieces_[k].over_row) {
        per_outer += pieces_[k].text;
        continue;
      }
      const std::string element = with_kept_values(pieces_, kept, k, [](const CBody::Def& d) {
        return KeptSlot{d.name + "_row[j]", d.name + "_row[j]"};
      });
      if (width_ == 1) {
        per_outer += "#pragma unroll\nfor (int j = 0; j < " + K +
                     "; ++j) {\n  const idx_t r = static_cast<idx_t>(threadIdx.x) + " + B + " * j;\n" +
                     (ragged ? "  if (r < " + INNER + ") {\n" + indent(element, 4) + "  }\n" : indent(element, 2)) +
                     "}\n";
        continue;
      }
      // Vector c of the thread's slots / width: its loads, its lanes, its stores.
      const std::string W = std::to_string(width_);
      const std::string lanes = pieces_[k].before_lanes + "#pragma unroll\nfor (int rl = 0; rl < " + W +
                                "; ++rl) {\n  const int j = c * " + W + " + rl;\n" + indent(element, 2) + "}\n" +
                                pieces_[k].after_lanes;
      per_outer += "#pragma unroll\nfor (int c = 0; c < " + std::to_string(slots_ / width_) +
                   "; ++c) {\n  const idx_t rh = static_cast<idx_t>(threadIdx.x) + " + B + " * c;\n" +
                   (ragged ? "  if (rh < " + std::to_string(g_.inner / width_) + ") {\n" + indent(lanes, 4) + "  }\n"
                           : indent(lanes, 2)) +
                   "}\n";
    }
    return per_outer;
  }

  // The kernel around a row's text: its parameters, the scratch rows in
  // shared memory, the kernel-wide values, and a grid-stride loop over the
  // rows.
  std::string kernel_text(const std::string& name, KernelSignature& sig, std::string per_outer) {
    const std::string params = parameters(p_, body_, info_, sig);
    std::string text = "  typedef " + index_type(p_, g_, body_) + " idx_t;\n" + aligned_flag(body_);
    if (!scratch_.empty()) {
      text += "  extern __shared__ __align__(16) unsigned char crucible_smem[];\n";
      int64_t offset = 0;
      for (int b : scratch_) {
        const Buffer& buf = p_.buffers[b];
        const std::string T = ctype_of(buf.dtype);
        text += "  " + T + "* __restrict__ row_" + buf.name + " = reinterpret_cast<" + T + "*>(crucible_smem + " +
                std::to_string(offset) + ");\n";
        offset += row_bytes(b);
      }
    }
    text += indent(body_.take(0), 2);
    // The next row reuses the scratch rows and the reductions' shared memory.
    const std::string sync = "__syncthreads();\n";
    if (per_outer.size() < sync.size() || per_outer.compare(per_outer.size() - sync.size(), sync.size(), sync) != 0)
      per_outer += sync;
    text += "  for (idx_t o = static_cast<idx_t>(blockIdx.x); o < " + std::to_string(g_.outer) +
            "; o += static_cast<idx_t>(gridDim.x)) {\n" + indent(per_outer, 4) + "  }\n";
    sig.launch = {block_, g_.outer, 1, static_cast<int>(bytes_)};
    return kernel(name, block_, params, text);
  }

  const Program& p_;
  const Group& g_;
  GroupInfo& info_;
  const int block_;
  CBody body_;
  std::vector<int> scratch_;  // buffers in shared-memory scratch rows
  int64_t bytes_ = 0;         // their bytes
  int64_t slots_ = 0;         // elements of the row a thread takes
  bool persistent_ = false;   // slots_ held in registers (Note [Persistent rows])
  int64_t width_ = 1;         // a persistent row's vector width
  LoopVars vars_;
  std::vector<RowPiece> pieces_;
  std::vector<ScratchStore> scratch_stores_;
  int acc_counter_ = 0;
};

std::string render_rows(const Program& p, const Group& g, GroupInfo& info, const std::string& name,
                        KernelSignature& sig, int block) {
  return RowKernel(p, g, info, block).render(name, sig);
}

}  // namespace

// Note [Autotuning]
// Which launch suits a row kernel depends on the row and on the device in
// ways a formula misses. On an H100 GPT-2's attention softmax (rows of
// 1024) ran 5% faster with a block for every row than with the grid capped
// at a few waves, whose blocks each walk many rows, while the log-softmax
// over the vocabulary (rows of 50257) ran 11% slower with 1024 threads a
// row than with 512, and the loss's backward over the same rows 12%
// faster. So a row kernel is rendered twice, with row_block's threads and
// with twice as many (each thread holding half as many elements of a
// persistent row), and each is offered with a capped and an exact grid;
// the runtime times them on the first call and keeps the fastest
// (runtime/autotune.cpp), as torch/_inductor's CachingAutotuner benchmarks
// a reduction's Triton configs at their first launch. A kernel that writes a
// graph input in place is not tuned: a second run would read what the
// first wrote.
std::string render_cuda_group(const Program& p, const Group& g, GroupInfo& info, const std::string& name,
                              KernelSignature& sig) {
  if (!g.tiled) return render_pointwise(p, g, info, name, sig);
  if (p.loops[g.loops.front()].column) return render_column(p, g, info, name, sig);
  const int block = row_block(g.inner);
  std::string text = render_rows(p, g, info, name, sig, block);
  for (int li : g.loops)
    if (p.buffers[p.loops[li].buffer].kind == Buffer::Input) return text;
  auto offer = [&](const std::string& kernel_name, Launch launch) {
    sig.configs.push_back({kernel_name, launch});
    launch.exact = true;
    sig.configs.push_back({kernel_name, launch});
  };
  offer(name, sig.launch);
  if (2 * block <= kMaxThreads && block < g.inner) {
    KernelSignature wide;
    const std::string wide_name = name + "_b" + std::to_string(2 * block);
    std::string wide_text = render_rows(p, g, info, wide_name, wide, 2 * block);
    // The same parameters, so that one argument list launches either.
    if (wide.buffers == sig.buffers && wide.written == sig.written) {
      text += "\n" + wide_text;
      offer(wide_name, wide.launch);
    }
  }
  return text;
}

// Note [Combined launches]
// A training step ends with one small pointwise kernel per parameter (its
// update, its optimizer state written in place), independent of each
// other; launched one by one, their launches, not their bytes, set the
// pace. The scheduler hands runs of such kernels here: each becomes a
// __device__ function over a range of the blocks, and one kernel gives each
// its range (enough blocks for its elements, at most kMaxPartBlocks; the
// loops stride over the rest). A run holds only kernels that neither read
// nor write what another of the run writes, so running them at once is
// running them in order.
std::string render_cuda_combined(const Program& p, const std::vector<const Group*>& groups,
                                 const std::vector<GroupInfo*>& infos, const std::string& name, KernelSignature& sig) {
  std::string parts, dispatch, params;
  std::unordered_map<int, size_t> position;  // buffer -> its index in sig
  int64_t first = 0;
  for (size_t k = 0; k < groups.size(); ++k) {
    KernelSignature part;
    const std::string part_name = name + "_part" + std::to_string(k);
    const PointwiseText t = pointwise_text(p, *groups[k], *infos[k], part, "crucible_bid", "crucible_nblocks",
                                           vector_width(p, *groups[k], groups[k]->outer));
    parts += "__device__ __forceinline__ void " + part_name + "(" + t.params + (t.params.empty() ? "" : ", ") +
             "int crucible_bid, int crucible_nblocks) {\n" + t.body + "}\n\n";
    std::string args;
    for (size_t i = 0; i < part.buffers.size(); ++i) {
      const int b = part.buffers[i];
      args += p.buffers[b].name + ", ";
      auto [it, fresh] = position.emplace(b, sig.buffers.size());
      if (fresh) {
        sig.buffers.push_back(b);
        sig.written.push_back(part.written[i]);
      } else {
        sig.written[it->second] = sig.written[it->second] || part.written[i];
      }
    }
    const int64_t blocks = std::clamp<int64_t>((t.units + kPointwiseBlock - 1) / kPointwiseBlock, 1, kMaxPartBlocks);
    dispatch += "  if (b < " + std::to_string(first + blocks) + ") {\n    " + part_name + "(" + args + "b - " +
                std::to_string(first) + ", " + std::to_string(blocks) + ");\n    return;\n  }\n";
    first += blocks;
  }
  for (size_t i = 0; i < sig.buffers.size(); ++i) {
    const Buffer& buf = p.buffers[sig.buffers[i]];
    params += std::string(i ? ", " : "") + (sig.written[i] ? "" : "const ") + storage_ctype_of(buf.dtype) +
              (buf.host_scalar ? " " : "* __restrict__ ") + buf.name;
  }
  sig.launch = {kPointwiseBlock, first, 1, 0, true};
  return parts + kernel(name, kPointwiseBlock, params, "  const int b = static_cast<int>(blockIdx.x);\n" + dispatch);
}

}  // namespace crucible::inductor::detail
