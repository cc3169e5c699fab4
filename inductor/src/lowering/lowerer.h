// Private to lowering/: the Lowerer, which walks a graph once and builds its
// Program (Note [Lowering] in lowering/lowering.cpp). The class is one, its
// members are defined by op family, one file each: lowering.cpp holds the
// walk, the classification and realization; pointwise.cpp, pad_and_cat.cpp,
// pooling.cpp, reductions.cpp and views.cpp the families the loops compute;
// extern_kernels.cpp and write_backs.cpp what runs through the dispatcher
// and what writes the graph's inputs.
#pragma once

#include "loop_ir/loop_ir.h"

#include <crucible/ir/graph.h>
#include <crucible/ir/tensor_meta.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace crucible::inductor::detail {

class Lowerer {
 public:
  explicit Lowerer(const ir::Graph& g) : g_(g) {}

  /// Lowers the graph: every node in order, then the trailing write-backs
  /// in the order that lets them write in place, then the outputs; waits
  /// sunk to their first reader.
  Program run();

 private:
  // What lowering makes of a node (Note [Lowering]).
  enum class Kind { Pointwise, Pad, Cat, Pool, PoolBackward, Reduction, View, Extern };

  // max_pool2d's window over the last two dims: kernel, stride, padding.
  struct Window {
    int64_t kh = 0, kw = 0, sh = 0, sw = 0, ph = 0, pw = 0;
  };

  // A value lowered to a body, not (or not yet) a buffer: what its readers
  // inline.
  struct Lazy {
    std::vector<int64_t> sizes;
    c10::ScalarType dtype = c10::kFloat;
    PointwiseFn fn;
    int ops = 0;        // ops a reader inlines with it (the recomputation bound)
    bool view = false;  // a view of `base`: aliases it
    const ir::Value* base = nullptr;
    std::vector<const ir::Node*> nodes;
  };

  // `d` wrapped into [0, rank) as ATen wraps a negative dimension.
  static int64_t wrap_dim(int64_t d, size_t rank) {
    int64_t r = std::max<int64_t>(static_cast<int64_t>(rank), 1);
    return d < 0 ? d + r : d;
  }

  // The walk, classification, buffers and realization (lowering.cpp).
  void lower_node(const ir::Node* n);
  bool loop_tensor(const ir::Value* v) const;
  bool host_scalar(const ir::Value* v) const;
  Kind classify(const ir::Node* n) const;
  void define_lazy(const ir::Value* v, Lazy l);
  const std::vector<int>& buffers_read(const ir::Value* v);
  int add_buffer(const ir::Value* v, Buffer::Kind kind);
  static std::string c_name(const std::string& s);
  static bool dense(const ir::TensorMeta& m);
  void realize(const ir::Value* v);
  static std::vector<int> memory_order(const Buffer& b);
  void ensure_tensor(const ir::Value* v);
  bool needs_tensor(const ir::Value* v) const;
  void realize_if_costly(const ir::Value* out);
  int full_loads(const Lazy& l) const;

  // Pointwise ops, from the table (pointwise.cpp).
  static std::vector<Expr> broadcast(const std::vector<int64_t>& from, const std::vector<Expr>& index);
  void lower_pointwise(const ir::Node* n);
  bool selects_one(const ir::Node* n) const;
  static bool counts(const ir::Value* v);

  // constant_pad_nd and cat, read under masks (pad_and_cat.cpp).
  bool pad_ok(const ir::Node* n) const;
  std::optional<int64_t> cat_dim(const ir::Node* n) const;
  void lower_pad(const ir::Node* n);
  void lower_cat(const ir::Node* n);

  // Max pooling and its backward (pooling.cpp).
  std::optional<Window> window_of(const ir::Node* n, size_t first, size_t indices) const;
  void lower_max_pool(const ir::Node* n);
  void lower_max_pool_backward(const ir::Node* n);

  // Reductions (reductions.cpp).
  bool reduction_ok(const ir::Node* n) const;
  std::vector<int64_t> reduced_dims(const ir::Node* n, size_t rank) const;
  int softmax_max_loop(const ir::Node* sum) const;
  void lower_reduction(const ir::Node* n);

  // Views, folded into index expressions (views.cpp).
  void lower_view(const ir::Node* n);
  const ir::Value* root(const ir::Value* v) const;

  // Extern kernels, and the waits moved down to their readers
  // (extern_kernels.cpp).
  void lower_extern(const ir::Node* n);
  static bool is_wait(const ir::Node* n);
  void sink_waits();

  // Writes into the graph's inputs (write_backs.cpp).
  static bool is_write_back(const ir::Node* n);
  std::vector<const ir::Node*> write_back_order(const std::vector<const ir::Node*>& copies) const;
  bool write_in_place(const ir::Node* n);

  const ir::Graph& g_;
  Program p_;
  std::unordered_map<const ir::Node*, Kind> kind_;
  std::unordered_map<const ir::Node*, size_t> order_;
  std::unordered_map<const ir::Value*, Lazy> lazy_;
  // Lazy values that may still be read, in definition order: what lower_extern
  // checks before a write (those realized or read by every user drop out).
  std::vector<const ir::Value*> unrealized_;
  std::unordered_map<const ir::Value*, std::vector<int>> reads_;  // buffers_read
  std::unordered_map<const ir::Value*, int> pending_;
  std::unordered_map<int, size_t> waited_;  // a wait's result buffer -> where its collective was issued
  std::unordered_set<const ir::Value*> outputs_;
};

}  // namespace crucible::inductor::detail
