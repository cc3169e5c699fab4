#include "rewrites.h"

#include "loop_ir.h"

#include <crucible/ir/graph.h>
#include <crucible/ir/propagate_meta.h>

#include <c10/core/MemoryFormat.h>

#include <exception>
#include <unordered_map>
#include <vector>

namespace crucible::inductor::detail {

// Note [Channels-last convolutions]
// cuDNN's fastest convolutions on tensor cores read and write NHWC
// (channels-last) tensors; given NCHW ones, it picks slower kernels.
// ResNet-18's contiguous step spent most of its 15 ms on the H100 in
// cuDNN's convolution and batch-norm kernels; with channels-last weights
// and images it takes 9.6 ms. As torch/_inductor/graph.py's layout
// optimization does (decide_layout_opt), a GPU graph with 2-D convolutions
// has every 4-D operand of a convolution or convolution_backward that is not
// channels-last copied to channels-last first (aten::clone with
// memory_format, a loop of the lowered graph, fused with its producer). The
// convolutions then return channels-last results, and what reads them —
// batch norm, ReLU, pooling, the residual adds, their gradients — keeps that
// layout in ATen's kernels and in the generated loops (which count in their
// result's memory order, Loop::order), so only the graph's inputs (images,
// weights) are copied: a copy whose operand turns out channels-last once the
// metadata is derived again (ir::propagate_meta, with the meta functions of
// channels-last convolutions and cuDNN's batch norm) is dropped. Views of
// 4-D values become reshapes (a flatten of channels-last activations
// copies; the graph is functional, so nothing writes through the view).
// Only the layout in memory changes, not a value. A graph whose metadata
// cannot be derived again is left as it was.
namespace {

bool is_conv(const ir::Node* n) {
  return n->is_call() && (n->target() == "aten::convolution" || n->target() == "aten::convolution_backward");
}

bool four_d_float(const ir::Value* v) {
  return v->is_tensor() && v->has_meta() && v->meta().sizes.size() == 4 && c10::isFloatingType(v->meta().dtype);
}

bool channels_last(const ir::TensorMeta& m) {
  const std::vector<int64_t>& s = m.sizes;
  const int64_t c = s[1], h = s[2], w = s[3];
  const int64_t want[4] = {h * w * c, 1, w * c, c};
  for (size_t d = 0; d < 4; ++d)
    if (s[d] > 1 && m.strides[d] != want[d]) return false;
  return true;
}

// The 2-D convolutions and their backwards: what the rewrite starts from.
std::vector<ir::Node*> convolutions(const ir::Graph& g) {
  std::vector<ir::Node*> convs;
  for (ir::Node* n : g.nodes())
    if (is_conv(n) && n->arg(0).is_value() && four_d_float(n->arg(0).value())) convs.push_back(n);
  return convs;
}

void rewrite(ir::Graph& g) {
  const std::vector<ir::Node*> convs = convolutions(g);
  std::unordered_map<ir::Value*, ir::Value*> copies;
  for (ir::Node* n : convs) {
    const size_t operands = n->target() == "aten::convolution" ? 2 : 3;
    for (size_t i = 0; i < operands; ++i) {
      if (!n->arg(i).is_value()) continue;
      ir::Value* v = n->arg(i).value();
      if (!four_d_float(v) || channels_last(v->meta())) continue;
      auto it = copies.find(v);
      if (it == copies.end()) {
        ir::Graph::InsertGuard at(g, n);
        ir::Node* copy = g.add_call("aten::clone", {v, c10::MemoryFormat::ChannelsLast});
        ir::infer_meta(*copy);
        it = copies.emplace(v, copy->result()).first;
      }
      n->set_arg(i, it->second);
    }
  }
  std::vector<ir::Node*> views;
  for (ir::Node* n : g.nodes())
    if (n->is_call() && (n->target() == "aten::view" || n->target() == "aten::_unsafe_view") && n->arg(0).is_value() &&
        four_d_float(n->arg(0).value()))
      views.push_back(n);
  for (ir::Node* n : views) {
    ir::Graph::InsertGuard at(g, n);
    ir::Node* reshape = g.add_call("aten::reshape", {n->arg(0), n->arg(1)});
    n->result()->replace_all_uses_with(reshape->result());
    g.erase(n);
  }
  ir::propagate_meta(g);
  for (auto& [v, copy] : copies)
    if (channels_last(v->meta())) {
      copy->replace_all_uses_with(v);
      g.erase(copy->node());
    }
}

}  // namespace

void channels_last_convolutions(ir::Graph& g) {
  // Copied only where there is something to rewrite: a warm compile of a
  // large graph without convolutions should not pay for a copy of it.
  if (!loop_device(g).is_cuda() || convolutions(g).empty()) return;
  ir::Graph work = g.clone();
  try {
    rewrite(work);
  } catch (const std::exception&) {
    return;  // metadata it cannot derive: the graph keeps its layout
  }
  g = std::move(work);
}

}  // namespace crucible::inductor::detail
