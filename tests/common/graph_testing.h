// Helpers for tests that inspect an ir::Graph.
#pragma once

#include <crucible/ir/graph.h>
#include <crucible/ir/tensor_meta.h>

#include <c10/core/Device.h>

#include <cstddef>
#include <string>

namespace crucible::testing {

/// Number of call nodes whose target is `op`.
inline size_t count_calls(const ir::Graph& g, const std::string& op) {
  size_t n = 0;
  for (const ir::Node* node : g.nodes()) n += node->is_call() && node->target() == op;
  return n;
}

/// Every tensor Value's metadata moved to `device` (placeholders and
/// results alike): what lowering sees of the graph traced on that device,
/// made without one (a graph traced on the CPU, its CUDA code compiled by
/// NVRTC where no GPU is).
inline void relabel_device(ir::Graph& g, const c10::Device& device) {
  for (ir::Node* n : g.nodes())
    for (const auto& r : n->results())
      if (r->is_tensor() && r->has_meta()) {
        ir::TensorMeta m = r->meta();
        m.device = device;
        r->set_meta(m);
      }
}

}  // namespace crucible::testing
