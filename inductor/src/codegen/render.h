// Private: what the C++ and CUDA C++ renderers share: the stage a loop
// takes in its kernel, which buffers a kernel writes and who else reads
// them, and the ops handler that writes a loop body as C-like statements
// (both languages spell loads, arithmetic and locals alike; only the loops
// and reductions around the bodies differ, Note [CUDA rendering]).
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

/// How a loop runs inside its group: once per outer index (Scalar), over
/// the inner range (Inner), or combined over the inner range (Reduce).
enum class Stage { Scalar, Inner, Reduce };

inline Stage stage_of(const Loop& l, const Group& g) {
  if (l.reduction) return Stage::Reduce;
  return l.numel() == g.outer ? Stage::Scalar : Stage::Inner;
}

/// The buffers a group's loops write, and those someone outside the group
/// reads (the graph, an extern kernel, another group): only the latter
/// reach memory.
struct GroupInfo {
  std::unordered_set<int> produced;  // buffers the group's loops write
  std::unordered_set<int> external;  // ... that someone outside reads
};

/// A loop body as C-like statements per loop level (0: kernel-wide, 1: per
/// outer index, 2: per inner index), common subexpressions named once per
/// level. Buffers read only inside their group come from locals (values
/// made once per outer index) or scratch rows (`row_<name>`, values of an
/// inner stage).
class CBody : public Body {
 public:
  CBody(const Program& p, const Group& g, const GroupInfo& info) : p_(p), g_(g), info_(info) {}

  Val load(int b, const std::vector<Expr>& index) override {
    const Buffer& buf = p_.buffers[b];
    std::string T = ctype_of(buf.dtype);
    if (buf.host_scalar) return {arg(b), 0};  // a kernel parameter, by value
    // A value made once per outer index is read back as its local, also
    // where it reaches memory too: on a GPU other threads of the block may
    // not see that store yet.
    if (auto it = locals_.find(b); it != locals_.end() && info_.produced.contains(b)) return it->second;
    if (info_.produced.contains(b) && !info_.external.contains(b)) {
      const Loop& l = p_.loops[buf.loop];
      if (stage_of(l, g_) == Stage::Inner) {
        Expr flat = iteration_position(p_, b, index);
        Expr at = mod(flat, g_.inner);
        // The thread's own element of a persistent row: still in a register.
        if (auto it = row_locals_.find(b); it != row_locals_.end() && at.str() == row_element_) return it->second;
        return guarded(scratch(b) + "[" + at.str() + "]", level_of(at), T, /*memory=*/false);
      }
      return locals_.at(b);
    }
    // A buffer this group writes is read back no earlier than the outer
    // iteration that wrote it.
    Expr storage = dot(index, buf.strides);
    int level = std::max(level_of(storage), info_.produced.contains(b) ? 1 : 0);
    // A mask that may change within a vector makes the load one element's.
    const Val* m = mask();
    if (level == 2 && width_ > 1 && !(m && m->level == 2)) {
      if (std::optional<Expr> base = vector_base(storage)) {
        const std::string key = "vector " + (m ? m->name + " " : "") + arg(b) + "[" + base->str() + "]";
        const int vlevel = std::max({level_of(*base), info_.produced.contains(b) ? 1 : 0, m ? m->level : 0});
        auto [it, fresh] = cache_[vlevel].emplace(key, "v" + std::to_string(counter_));
        if (fresh) {
          ++counter_;
          // Masked: the whole vector or none of it, zeros then.
          vector_lines(vlevel) += vector_decl(b, it->second, m != nullptr) + (m ? "if (" + m->name + ") " : "") +
                                  "crucible_move_vector<" + std::to_string(width_) + ">(" + it->second + ", " + arg(b) +
                                  " + " + base->str() + ", crucible_aligned);\n";
        }
        return compute(from_storage(buf.dtype, it->second + "[" + lane_ + "]"), 2, T);
      }
    }
    return guarded(from_storage(buf.dtype, arg(b) + "[" + storage.str() + "]"), level, T);
  }

  /// The statement storing `value` (of the buffer's ctype_of) at element
  /// offset `at` of buffer `b`, converted to its dtype in memory.
  std::string store(int b, const Expr& at, const std::string& value) {
    if (width_ > 1 && level_of(at) == 2) {
      if (std::optional<Expr> base = vector_base(at)) {
        const std::string name = "s" + std::to_string(counter_++);
        vector_lines(std::max(level_of(*base), 1)) += vector_decl(b, name);
        after_ += "crucible_move_vector<" + std::to_string(width_) + ">(" + arg(b) + " + " + base->str() + ", " + name +
                  ", crucible_aligned);\n";
        return name + "[" + lane_ + "] = " + to_storage(p_.buffers[b].dtype, value) + ";\n";
      }
    }
    return arg(b) + "[" + at.str() + "] = " + to_storage(p_.buffers[b].dtype, value) + ";\n";
  }

  /// Vector mode (Note [Vectorized pointwise kernels] in cuda_codegen.cpp):
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

  Val compute(const std::string& expr, int level, const std::string& ctype) override {
    auto& cache = cache_[level];
    if (auto it = cache.find(expr); it != cache.end()) return {it->second, level};
    std::string name = "t" + std::to_string(counter_++);
    cache.emplace(expr, name);
    lines_[level] += "const " + ctype + " " + name + " = " + expr + ";\n";
    if (level == 2) defs_.push_back({name, ctype, expr, loads_.contains(expr)});
    return {name, level};
  }

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

  // A store to `b`: loads of it cached before (an in-place write's old
  // values) must not stand for what later stages read.
  void stored(int b) {
    auto it = arg_names_.find(b);
    if (it == arg_names_.end()) return;
    // Anywhere in the text: a load may be wrapped in a conversion.
    const std::string prefix = it->second + "[";
    for (auto& cache : cache_)
      std::erase_if(cache, [&](const auto& kv) { return kv.first.find(prefix) != std::string::npos; });
  }

  std::string take(int level) {
    std::string s = std::move(lines_[level]);
    lines_[level].clear();
    if (level == 2 && !keep_inner_) cache_[2].clear();
    return s;
  }

  // Lines of levels 1 and 2 together, and both caches forgotten: a column
  // reduction computes them all inside its innermost loop.
  std::string take_inner() {
    std::string s = take(1) + take(2);
    cache_[1].clear();
    return s;
  }

  const std::string& arg(int b) {
    if (auto it = arg_names_.find(b); it != arg_names_.end()) return it->second;
    args.push_back(b);
    return arg_names_.emplace(b, p_.buffers[b].name).first->second;
  }

  std::string scratch(int b) {
    scratch_.insert(b);
    return "row_" + p_.buffers[b].name;
  }

  /// Buffer `b`'s elements are the local `name`, defined at loop `level`
  /// (1: once per outer index, as most are; 2: in a split loop's inner one).
  void set_local(int b, const std::string& name, int level = 1) { locals_[b] = {name, level}; }

  /// Buffer `b`, an inner stage of a persistent row, has the value `v` at
  /// the thread's element r (Note [Persistent rows]): reads of it there take
  /// `v`; reads elsewhere in the row still go through its scratch row.
  void set_row_local(int b, const Val& v) { row_locals_[b] = v; }

  std::vector<int> args;
  std::unordered_set<int> scratch_;

 private:
  // The element `access` reads (memory, or a scratch row), computed at
  // `level`; under a mask, read only where the mask holds and 0 elsewhere.
  Val guarded(const std::string& access, int level, const std::string& T, bool memory = true) {
    std::string expr = access;
    if (const Val* m = mask()) {
      expr = "(" + m->name + " ? " + access + " : " + T + "(0))";
      level = std::max(level, m->level);
    }
    if (memory && level == 2) loads_.insert(expr);
    return compute(expr, level, T);
  }

  // base when `at` is base + lane with base a multiple of the vector width.
  std::optional<Expr> vector_base(const Expr& at) const {
    if (mod(at, width_).str() != lane_) return std::nullopt;
    Expr base = at + Expr::var(lane_, width_) * -1;
    if (base.uses(lane_)) return std::nullopt;
    return base;
  }

  // Where a vector access's statements go: a level-2 one before the lanes.
  std::string& vector_lines(int level) { return level == 2 ? vector_lines_ : lines_[level]; }

  // A 16-byte-aligned array of a vector of buffer b's elements as stored,
  // zeroed or not.
  std::string vector_decl(int b, const std::string& name, bool zeroed = false) {
    const std::string& a = arg(b);
    if (std::find(vector_args_.begin(), vector_args_.end(), a) == vector_args_.end()) vector_args_.push_back(a);
    return "__align__(16) " + storage_ctype_of(p_.buffers[b].dtype) + " " + name + "[" + std::to_string(width_) + "]" +
           (zeroed ? " = {}" : "") + ";\n";
  }

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
/// (Note [Persistent rows] in cuda_codegen.cpp).
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

}  // namespace crucible::inductor::detail
