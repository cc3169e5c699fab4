// Private: what the C++ and CUDA C++ renderers share: the ops handler that
// writes a loop body as C-like statements (both languages spell loads,
// arithmetic and locals alike; only the loops and reductions around the
// bodies differ, Note [CUDA rendering]), and a row group's program in
// pieces, with the values one loop keeps for the next.
#pragma once

#include "schedule.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace crucible::inductor::detail {

/// A loop body as C-like statements per loop level (0: kernel-wide, 1: per
/// outer index, 2: per inner index), common subexpressions named once per
/// level. Buffers read only inside their group come from locals (values
/// made once per outer index) or scratch rows (`row_<name>`, values of an
/// inner stage).
class CBody : public Body {
 public:
  CBody(const Program& p, const Group& g, const GroupInfo& info) : p_(p), g_(g), info_(info) {}

  /// Element `index` of buffer `b`: a kernel parameter (a host scalar), a
  /// local or scratch row of the group (a value it keeps to itself), or a
  /// load of memory, one vector at a time in vector mode (vectorize).
  Val load(int b, const std::vector<Expr>& index) override;

  /// The statement storing `value` (of the buffer's ctype_of) at element
  /// offset `at` of buffer `b`, converted to its dtype in memory.
  std::string store(int b, const Expr& at, const std::string& value);

  /// Vector mode (Note [Vectorized pointwise kernels] in codegen/cuda.cpp):
  /// the innermost loop variable `lane` (`ol`, or `rl` in a row) counts
  /// `width` consecutive elements, and a load or store of element
  /// base + lane, base a multiple of `width`, becomes one access of the
  /// whole vector: a load before the innermost loop (into `v<n>`), a store
  /// after it (from `s<n>`, see take_after). Both take the kernel's
  /// `crucible_aligned`, which the renderer defines. A vector whose base
  /// depends on level-2 variables (a row's `rh`) is loaded by the statements
  /// take_vector_lines returns, which the renderer puts before its lanes.
  void vectorize(int64_t width, std::string lane = "ol") {
    width_ = width;
    lane_ = std::move(lane);
  }

  /// The statements that run after the innermost loop: vector stores.
  std::string take_after() { return std::exchange(after_, {}); }

  /// The level-2 vector loads (and store arrays) made since the last call.
  std::string take_vector_lines() { return std::exchange(vector_lines_, {}); }

  /// A persistent row's element as its loads index it (`r`, or
  /// `V*rh + rl` in a vectorized row): reads of a row local there take the
  /// thread's own value (set_row_local).
  void set_row_element(const Expr& r) { row_element_ = r.str(); }

  /// The buffers accessed as vectors, as argument names: those whose
  /// pointers crucible_aligned tests.
  const std::vector<std::string>& vector_args() const { return vector_args_; }

  /// `expr` named once at `level`: a `const ctype t<n> = expr;` line, or
  /// the name an equal expression got before.
  Val compute(const std::string& expr, int level, const std::string& ctype) override;

  /// A level-2 value: its name, C++ type and expression, and whether that
  /// is a load of memory.
  struct Def {
    std::string name, ctype, expr;
    bool load = false;
  };
  /// The level-2 values defined since the last call, in order.
  std::vector<Def> take_defs() { return std::exchange(defs_, {}); }

  /// Level-2 values stay named after take(2), for kernels that keep them
  /// from one inner loop to the next (Note [Persistent rows]).
  void keep_inner_values() { keep_inner_ = true; }

  /// A store to `b`: loads of it cached before (an in-place write's old
  /// values) must not stand for what later stages read.
  void stored(int b);

  /// The lines of `level` written since the last take, and (level 2,
  /// unless keep_inner_values) its names forgotten.
  std::string take(int level);

  /// Lines of levels 1 and 2 together, and both caches forgotten: a column
  /// reduction computes them all inside its innermost loop.
  std::string take_inner();

  /// The name buffer `b` has in the kernel, which takes it as an argument
  /// from now on (args).
  const std::string& arg(int b);

  /// The scratch row (`row_<name>`) holding buffer `b`'s inner stage,
  /// which the kernel then declares (scratch_).
  std::string scratch(int b);

  /// Buffer `b`'s elements are the local `name`, defined at loop `level`
  /// (1: once per outer index, as most are; 2: in a split loop's inner one).
  void set_local(int b, const std::string& name, int level = 1) { locals_[b] = {name, level}; }

  /// Buffer `b`, an inner stage of a persistent row, has the value `v` at
  /// the thread's element r (Note [Persistent rows]): reads of it there take
  /// `v`; reads elsewhere in the row still go through its scratch row.
  void set_row_local(int b, const Val& v) { row_locals_[b] = v; }

  std::vector<int> args;             // the buffers the kernel takes, in order
  std::unordered_set<int> scratch_;  // the buffers it keeps in scratch rows

 private:
  // The element `access` reads (memory, or a scratch row), computed at
  // `level`; under a mask, read only where the mask holds and 0 elsewhere.
  Val guarded(const std::string& access, int level, const std::string& T, bool memory = true);

  // base when `at` is base + lane with base a multiple of the vector width.
  std::optional<Expr> vector_base(const Expr& at) const;

  // Where a vector access's statements go: a level-2 one before the lanes.
  std::string& vector_lines(int level) { return level == 2 ? vector_lines_ : lines_[level]; }

  // A 16-byte-aligned array of a vector of buffer b's elements as stored,
  // zeroed or not.
  std::string vector_decl(int b, const std::string& name, bool zeroed = false);

  const Program& p_;
  const Group& g_;
  const GroupInfo& info_;
  std::unordered_map<int, Val> locals_;
  std::unordered_map<int, Val> row_locals_;
  std::unordered_map<std::string, std::string> cache_[3];
  std::unordered_map<int, std::string> arg_names_;
  std::string lines_[3];
  std::vector<Def> defs_;
  std::unordered_set<std::string> loads_;  // level-2 expressions that load memory
  bool keep_inner_ = false;
  int counter_ = 0;
  int64_t width_ = 1;
  std::string lane_ = "ol";
  std::string row_element_ = "r";
  std::string after_, vector_lines_;
  std::vector<std::string> vector_args_;
};

/// A row group's program in pieces: text run once per row, or a loop over
/// the row's elements (a stage's statements and the level-2 values they
/// define), for renderers that keep values from one loop to the next
/// (Note [Persistent rows] in codegen/cuda.cpp).
struct RowPiece {
  std::string text;
  bool over_row = false;
  std::vector<CBody::Def> defs;
  std::string pragma;  // the C++ renderer's pragma for the loop
  // A vectorized row (CBody::vectorize): statements before a vector's
  // lanes (its loads) and after them (its stores).
  std::string before_lanes, after_lanes;
};

/// For each piece, for each value it defines: whether a later loop reads it.
std::vector<std::vector<bool>> read_later(const std::vector<RowPiece>& pieces);

/// The values `kept` marks, in the order the pieces define them.
std::vector<CBody::Def> kept_defs(const std::vector<RowPiece>& pieces, const std::vector<std::vector<bool>>& kept);

/// Where a renderer keeps a value between loops: read back as `read`, and
/// stored by `write` (empty: not stored; `read` computes it again).
struct KeptSlot {
  std::string read, write;
};

/// Piece k's statements with the kept values of earlier loops it reads
/// taken back first (`const T t = read;`) and its own kept values stored
/// after (`write = t;`).
std::string with_kept_values(const std::vector<RowPiece>& pieces, const std::vector<std::vector<bool>>& kept, size_t k,
                             const std::function<KeptSlot(const CBody::Def&)>& slot);

/// `text` with every line indented by `spaces`.
std::string indent(const std::string& text, int spaces);

/// A reduction's finalization with `$` replaced by the accumulator `acc`.
std::string substitute(const std::string& finalize, const std::string& acc);

/// A column reduction's epilogue at outer index `o` (a variable the lines
/// read): the reduced value `value`, of C type `T`, named red_<buffer> and
/// stored where it leaves the group, then the group's other loops computed
/// from it and stored likewise. The C++ and CUDA column kernels share it.
std::string column_epilogue(CBody& body, const Program& p, const Group& g, const GroupInfo& info, const std::string& T,
                            const std::string& value);

}  // namespace crucible::inductor::detail
