#include "fx_passes/fx_passes.h"

#include "lowering/lowering.h"

#include <crucible/ir/graph.h>
#include <crucible/ir/propagate_meta.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

namespace crucible::inductor::detail {

// Note [Narrow max-pool indices]
// A training step keeps max_pool2d_with_indices's int64 indices from the
// forward to the backward, where max_pool2d_with_indices_backward reads
// them: eight bytes per pooled element, twice the pooled values' bytes in
// float32 and four times in bfloat16 (ResNet-18's stem at batch 64: 98 MiB).
// An index names a position of one input plane (ih * W + iw), so it fits
// 32 bits wherever a plane has fewer than 2^31 elements. The forward then
// writes an int32 copy beside the int64 indices, which die there (the copy
// is tagged kRealizeTag: inlined, the cast would be recomputed from the
// int64 indices in the backward and keep them alive), and the backward
// widens it again just before its first reader (a pointwise producer,
// inlined into the backward's loads where the lowering takes the
// backward). TorchInductor goes further and
// keeps an int8 offset within the window
// (_low_memory_max_pool2d_with_offsets); an int32 copy needs no new index
// arithmetic and no 8-bit loads. Only indices that nothing but backward
// nodes (the "backward" tag: a training step's graph) read in the same
// graph are narrowed; an AOT forward, which returns them to its backward,
// is left as it is.
namespace {

constexpr int64_t kInt32Elements = std::numeric_limits<int32_t>::max();

// The backward readers of `indices`, in graph order; empty when anything
// else reads them.
std::vector<ir::Node*> backward_readers(const ir::Value* indices) {
  std::vector<ir::Node*> readers;
  for (ir::Node* user : indices->users()) {
    if (!user->is_call() || user->target() != "aten::max_pool2d_with_indices_backward" || !user->has_tag("backward"))
      return {};
    for (size_t a = 0; a < user->args().size(); ++a)
      if (a != 7 && user->arg(a).is_value() && user->arg(a).value() == indices) return {};
    readers.push_back(user);
  }
  return readers;
}

ir::Value* cast(ir::Graph& g, ir::Value* v, c10::ScalarType dtype) {
  ir::Node* n = g.add_call("aten::_to_copy", {v, dtype});
  ir::infer_meta(*n);
  return n->result();
}

}  // namespace

void narrow_max_pool_indices(ir::Graph& g) {
  std::vector<ir::Node*> pools;
  for (ir::Node* n : g.nodes())
    if (n->is_call() && n->target() == "aten::max_pool2d_with_indices" && n->num_results() == 2) pools.push_back(n);
  const std::vector<ir::Value*> outputs = g.outputs();
  for (ir::Node* pool : pools) {
    ir::Value* indices = pool->result(1);
    if (!indices->has_meta() || indices->meta().dtype != c10::kLong || !pool->arg(0).is_value() ||
        !pool->arg(0).value()->has_meta())
      continue;
    if (std::find(outputs.begin(), outputs.end(), indices) != outputs.end()) continue;
    const std::vector<int64_t>& x = pool->arg(0).value()->meta().sizes;
    if (x.size() < 2 || x[x.size() - 2] * x.back() > kInt32Elements) continue;
    std::vector<ir::Node*> readers = backward_readers(indices);
    if (readers.empty()) continue;
    ir::Value* narrow = nullptr;
    {
      const ir::Graph::InsertGuard after(g, pool, ir::Graph::InsertGuard::Where::After);
      narrow = cast(g, indices, c10::kInt);
      narrow->node()->add_tag(std::string(kRealizeTag));  // the int64 indices die here
    }
    ir::Node* first = nullptr;  // the first reader in graph order
    for (ir::Node* n : g.nodes())
      if (std::find(readers.begin(), readers.end(), n) != readers.end()) {
        first = n;
        break;
      }
    ir::Value* wide = nullptr;
    {
      const ir::Graph::InsertGuard before(g, first);
      wide = cast(g, narrow, c10::kLong);
      wide->node()->add_tag("backward");
    }
    for (ir::Node* reader : readers) reader->set_arg(7, wide);
  }
}

}  // namespace crucible::inductor::detail
