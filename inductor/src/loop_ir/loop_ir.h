// Private: inductor's loop-level IR. A graph lowers to buffers (what lives
// in memory) and loops (how a computed buffer's elements are made from
// loads of other buffers), plus the extern kernels between them; the
// scheduler groups loops into kernels and the C++ code generator renders
// them. Target-independent: nothing here knows about C++ or CUDA beyond the
// element type names a renderer picks. Mirrors torch/_inductor/ir.py
// (Buffer, ComputedBuffer, Pointwise, Reduction, ExternKernel) with index
// expressions from loop_ir/index.h in place of sympy.
#pragma once

#include "loop_ir/index.h"

#include <crucible/ir/graph.h>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace crucible::inductor::detail {

/// A value inside a loop body: the name a renderer gave it and the loop
/// level it depends on (0: the whole kernel, 1: the outer loop variable
/// `o`, 2: the inner variable `r`), so that invariant values are computed
/// once outside the loops that do not change them.
struct Val {
  std::string name;
  int level = 0;
};

class Body;

/// An element of a tensor as a function of its multi-index.
using PointwiseFn = std::function<Val(Body&, const std::vector<Expr>& index)>;
/// An element of a reduction's input: kept index, reduced index.
using ReduceFn = std::function<Val(Body&, const std::vector<Expr>& index, const std::vector<Expr>& rindex)>;

enum class ReductionType { Sum, Max, Min };

/// A tensor in memory. Input: a graph placeholder or constant; Extern: the
/// result of an extern kernel (an ATen call); Computed: written by a loop.
/// Layouts are logical sizes and element strides from the data pointer
/// (the storage offset lives in the pointer).
struct Buffer {
  enum Kind { Input, Extern, Computed } kind = Input;
  std::string name;
  const ir::Value* value = nullptr;  // the graph Value whose tensor this is
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype = c10::kFloat;
  int loop = -1;  // Computed: the loop that writes it
  /// A 0-dim CPU tensor read by loops on a GPU (a learning rate, Adam's
  /// bias correction): passed to the kernel by value.
  bool host_scalar = false;
  int64_t numel() const;
};

/// A loop writing buffers[buffer]: pointwise (fn over the buffer's sizes) or
/// a reduction (rfn over sizes × rsizes, combined by rtype, then finalize).
struct Loop {
  int buffer = -1;
  std::vector<int64_t> sizes;
  PointwiseFn fn;
  bool reduction = false;
  std::vector<int64_t> rsizes;
  ReductionType rtype = ReductionType::Sum;
  ReduceFn rfn;
  /// The operand's fastest-moving memory dimension is a kept one (a sum
  /// over the batch of a [B, N] gradient): the kernel then walks the
  /// reduced index outside and a block of kept indices inside, so that
  /// loads stay contiguous.
  bool column = false;
  /// The order of a pointwise loop's dimensions in memory, outermost first
  /// (empty: row-major): a buffer with permuted strides (channels-last) is
  /// written in its memory order, so that its stores, and the loads of
  /// operands laid out alike, are contiguous (loop_index).
  std::vector<int> order;
  /// A sum of exp(x - max) whose max is loop `online_max`'s, over x its
  /// operand and the same reduced range (a softmax's denominator): a
  /// renderer may compute both in one pass over x (Note [Online softmax]
  /// in codegen/cuda.cpp); -1: none.
  int online_max = -1;
  /// C++-free finalization of the accumulator, e.g. dividing by the count
  /// for a mean: text with `$` standing for the accumulator; empty: none.
  std::string finalize;
  /// The graph nodes this loop computes (inlined ones included), in graph
  /// order: what a kernel's comment lists.
  std::vector<const ir::Node*> nodes;
  /// sizes and rsizes as kernel text spells them, from the tensors they are
  /// the sizes of (Note [Dynamic sizes]); empty: each as spelled() spells
  /// it (spelled_sizes, spelled_rsizes).
  std::vector<SizeExpr> size_exprs, rsize_exprs;
  int64_t numel() const;
  int64_t rnumel() const;
};

/// One step of the lowered program, in run order.
struct Item {
  const ir::Node* extern_node = nullptr;  // set: this node runs through the dispatcher
  int loop = -1;                          // otherwise: loops[loop]
};

/// What lowering makes of a graph.
struct Program {
  /// Where the loops run: the graph's CUDA device if it has a tensor on
  /// one, else the CPU (Note [Lowering]: tensors elsewhere are left to
  /// extern kernels).
  c10::Device device = c10::kCPU;
  std::vector<Buffer> buffers;
  std::vector<Loop> loops;
  std::vector<Item> items;
  /// The buffer holding each Value that exists as a tensor at run time.
  std::unordered_map<const ir::Value*, int> buffer_of;
};

/// One load a loop body made: the buffer and the row-major (logical) flat
/// index of the element, in the loop variables.
struct Read {
  int buffer;
  Expr flat;
};

/// The ops handler loop bodies are written against (torch/_inductor's
/// `ops.*` virtualized handler): loads, computations and constants produce
/// Vals; a renderer decides what text they become. Values are
/// common-subexpression-eliminated by their text.
class Body {
 public:
  virtual ~Body() = default;
  /// Element `index` (logical, one Expr per dimension) of buffer `b`; under
  /// a mask (push_mask), that element where the mask holds and 0 elsewhere,
  /// the memory then read only where it holds.
  virtual Val load(int b, const std::vector<Expr>& index) = 0;
  /// `expr` (C-like text over operand names) of element type `ctype`,
  /// computed at `level`.
  virtual Val compute(const std::string& expr, int level, const std::string& ctype) = 0;

  /// Loads until the matching pop_mask read memory only where `cond` (C
  /// text over the loop variables, needing loop level `level`) holds, and
  /// the masks pushed before it (Note [Masked loads] in
  /// lowering/pad_and_cat.cpp).
  void push_mask(const std::string& cond, int level) {
    masks_.push_back({masks_.empty() ? cond : masks_.back().name + " && " + cond,
                      masks_.empty() ? level : std::max(level, masks_.back().level)});
  }
  void pop_mask() { masks_.pop_back(); }

 protected:
  /// The conjunction of the masks in force (its text parenthesized as
  /// pushed) and the level it needs; nullptr when none is.
  const Val* mask() const { return masks_.empty() ? nullptr : &masks_.back(); }

 private:
  std::vector<Val> masks_;
};

/// The C++ type loop bodies compute a dtype's elements in: f32, f64, i64,
/// i32, bool as themselves, bf16 and f16 in float (Note [Reduced-precision
/// loops]); empty for a dtype the loops do not handle.
std::string ctype_of(c10::ScalarType t);

/// bf16 or f16: stored in 16 bits, computed in float.
bool reduced_precision(c10::ScalarType t);

/// The C++ type of a dtype's elements in memory: ctype_of's, except for a
/// reduced-precision dtype, kept as its 16-bit pattern (uint16_t).
std::string storage_ctype_of(c10::ScalarType t);

/// `stored`, an element of dtype `t` as it is in memory, as loop bodies
/// compute it (bf16 and f16 widened to float; others unchanged).
std::string from_storage(c10::ScalarType t, const std::string& stored);

/// `value` (of ctype_of(t)) as an element of dtype `t` in memory: rounded
/// to nearest even for bf16 and f16, as ATen's conversions round.
std::string to_storage(c10::ScalarType t, const std::string& value);

/// `value` (of ctype_of(t)) rounded to dtype `t`'s precision and kept in
/// ctype_of(t): what an explicit conversion to bf16 or f16 computes.
std::string round_to(c10::ScalarType t, const std::string& value);

/// Buffer `b`'s strides as kernel text spells them: its tensor's spelled
/// layout (Note [Dynamic sizes]) where the buffer has that tensor's
/// strides, the row-major strides of its spelled sizes where it is laid out
/// row-major, else each stride as spelled() spells it.
std::vector<SizeExpr> spelled_strides(const Buffer& b);

/// The loop level an index expression needs: 2 if it uses an innermost
/// variable (`r`, `rh`, `rl`, `ol`), 1 if `o` or `oh`, else 0.
int level_of(const Expr& e);

/// Where element `index` of buffer `b` comes in the iteration of the loop
/// that writes it: the flat position its loop counts it at (its storage
/// offset for a loop in memory order, Loop::order; else row-major). What a
/// read of `b` is compared with when loops are fused.
Expr iteration_position(const Program& p, int b, const std::vector<Expr>& index);

/// The multi-index of element `flat` of a pointwise loop, counting in the
/// loop's memory order (Loop::order), else row-major.
std::vector<Expr> loop_index(const Loop& loop, const Expr& flat);

/// Where a loop stores its element at `flat`: the offset in its buffer of
/// loop_index(loop, flat).
Expr store_offset(const Program& p, const Loop& loop, const Expr& flat);

/// The device the loops of `graph` run on: its first CUDA tensor's device,
/// else the CPU.
c10::Device loop_device(const ir::Graph& graph);

/// The loop variables a kernel counts with: `o` over `outer` elements and
/// `r` over `inner`. Either may be split into two nested loops (Note [Split
/// loops] in codegen/cpp.cpp): o = K·oh + ol, r = K·rh + rl, the inner one
/// (ol, rl) over K elements, so that offsets become affine in it.
struct LoopVars {
  int64_t outer = 1, inner = 1;
  SizeExpr inner_size = 1;  // inner, spelled
  Expr o, r;
};

/// `o` and `r` over `outer` and `inner` (spelled sizes; their values are
/// the ranges); a split (> 0, a divisor of the range) makes the variable
/// two.
LoopVars loop_vars(const SizeExpr& outer, const SizeExpr& inner, int64_t osplit = 0, int64_t rsplit = 0);

/// The value of `loop`'s element at the loop variables `o` and `r` of `v`:
/// for a reduction, its combined operand at kept index o and reduced index
/// r; for a pointwise loop of outer·inner elements, the element at flat
/// index o·inner + r; for one of `outer` elements, the element at o.
Val body_value(Body& b, const Loop& loop, const LoopVars& v);
/// body_value with unsplit variables over `outer` and `inner`.
Val body_value(Body& b, const Loop& loop, const SizeExpr& outer, const SizeExpr& inner);

/// The loads `loop` makes when rendered with the outer variable `o` over
/// `outer` and the inner `r` over `inner` (the flat index is o·inner + r for
/// a loop of outer·inner elements, o for one of `outer` elements).
std::vector<Read> reads_of(const Program& p, const Loop& loop, const SizeExpr& outer, const SizeExpr& inner);

/// loop.sizes and loop.rsizes as kernel text spells them (Loop::size_exprs).
std::vector<SizeExpr> spelled_sizes(const Loop& loop);
std::vector<SizeExpr> spelled_rsizes(const Loop& loop);
/// Their products: the loop's elements and reduced elements, spelled.
SizeExpr spelled_numel(const Loop& loop);
SizeExpr spelled_rnumel(const Loop& loop);

/// The IR as text: each buffer, each loop's body in the ops above, each
/// extern kernel, in run order.
std::string to_text(const Program& p);

}  // namespace crucible::inductor::detail
