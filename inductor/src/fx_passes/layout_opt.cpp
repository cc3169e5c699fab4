#include "fx_passes/fx_passes.h"

#include "loop_ir/loop_ir.h"

#include <crucible/inductor/error.h>
#include <crucible/ir/aliasing.h>
#include <crucible/ir/graph.h>
#include <crucible/ir/propagate_meta.h>
#include <crucible/runtime/instruments.h>

#include <c10/core/MemoryFormat.h>

#include <algorithm>
#include <exception>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
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
// Only the layout in memory changes, not a value, nor the strides of what
// the caller gets (Note [Eager's strides at the outputs]). A graph whose
// metadata cannot be derived again is left as it was.
//
// Note [Eager's strides at the outputs]
// The rewrite changes where values live inside the graph, never what the
// caller sees. Every output but a saved value (OutputKind::SavedValue: read
// by the compiled backward alone, whose loops and extern kernels take any
// layout) reaches the caller: a model's features or logits, a loss, the
// gradients autograd hands to AccumulateGrad, an input's new value, the
// intermediate bases the runtime wrapper regenerates views from. Each keeps
// the sizes, strides and storage offset it had before the rewrite, which are
// eager's (the trace recorded them), so `out.view({4, -1})` works on a
// convolution's features as it does in eager, and a weight's gradient
// reaches .grad as eager's does, strides of size-1 dimensions included
// (AccumulateGrad keeps a gradient whose other strides are the weight's).
// torch/_inductor keeps the strides of its user_visible_outputs the same way
// (keep_output_stride). Every entry point compiles through here (compile_fx,
// aot_module with compile_fx_config, the Builder's inductor backends,
// training steps), so none of them needs a rule of its own. Where the
// rewrite changed the layout of an output's storage root (the value its
// views view, ir::storage_root), the output is read from a copy of that root
// in its old layout instead: the root permuted to its old memory order,
// cloned contiguous and permuted back, a loop of the lowered graph that
// fuses with the root's producer (the ReLU after the last convolution writes
// NCHW directly). The views between root and output are then made again on
// the copy, so an output that views another output, or an intermediate base,
// still views it. Inside the graph the values stay channels-last. An output
// whose old layout no such copy gives (a root that is not dense) leaves the
// graph without the rewrite.
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

// The graph's outputs the caller sees (Note [Eager's strides at the outputs]):
// every output position but a saved value's.
std::vector<size_t> visible_outputs(const ir::Graph& g) {
  const std::vector<ir::OutputSpec>& specs = g.signature().outputs;
  const size_t outputs = g.output_node()->args().size();
  std::vector<size_t> visible;
  for (size_t i = 0; i < outputs; ++i)
    if (i >= specs.size() || specs[i].kind != ir::OutputKind::SavedValue) visible.push_back(i);
  return visible;
}

// Equal as far as a caller can see: sizes, strides, storage offset.
bool same_layout(const ir::TensorMeta& a, const ir::TensorMeta& b) {
  return a.sizes == b.sizes && a.strides == b.strides && a.storage_offset == b.storage_offset;
}

// A call with its metadata.
ir::Value* add(ir::Graph& g, std::string_view op, std::vector<ir::Argument> args) {
  ir::Node* n = g.add_call(op, std::move(args));
  ir::infer_meta(*n);
  return n->result();
}

// `v` copied into the dense layout `old`: permuted to old's memory order
// (decreasing strides; a dimension of size 1 inside those of equal stride,
// where a contiguous copy gives it the stride it had), cloned contiguous,
// permuted back.
ir::Value* copy_in_layout(ir::Graph& g, ir::Value* v, const ir::TensorMeta& old) {
  std::vector<int64_t> order(old.sizes.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    if (old.strides[a] != old.strides[b]) return old.strides[a] > old.strides[b];
    return old.sizes[a] != 1 && old.sizes[b] == 1;
  });
  if (std::is_sorted(order.begin(), order.end())) return add(g, "aten::clone", {v, c10::MemoryFormat::Contiguous});
  std::vector<int64_t> inverse(order.size());
  for (size_t d = 0; d < order.size(); ++d) inverse[static_cast<size_t>(order[d])] = static_cast<int64_t>(d);
  ir::Value* moved = add(g, "aten::permute", {v, order});
  return add(g, "aten::permute", {add(g, "aten::clone", {moved, c10::MemoryFormat::Contiguous}), inverse});
}

// `v`, a view of `root` (or root itself), made again on `copy`: each view
// between them called on the one before it. `made` maps what was made
// already (views shared by several outputs are made once).
ir::Value* view_again(ir::Graph& g, ir::Value* v, const ir::Value* root, ir::Value* copy,
                      std::unordered_map<const ir::Value*, ir::Value*>& made) {
  if (v == root) return copy;
  if (auto it = made.find(v); it != made.end()) return it->second;
  const ir::Node* n = v->node();
  if (n->is_mutating())
    throw InductorError("layout rewrite: output %" + v->name() + " is written in place by " + n->target());
  ir::Value* base = ir::aliased_argument(*v);
  ir::Value* base_again = view_again(g, base, root, copy, made);
  std::vector<ir::Argument> args = n->args();
  for (ir::Argument& a : args)
    if (a.is_value() && a.value() == base) a = base_again;
  std::optional<size_t> list_size;
  const auto& returns = n->schema().returns();
  for (const auto& r : returns)
    if (r.type()->kind() == c10::TypeKind::ListType) list_size = n->num_results() - (returns.size() - 1);
  ir::Node* view = g.add_call(n->op(), std::move(args), list_size);
  ir::infer_meta(*view);
  for (size_t r = 0; r < n->num_results(); ++r) made[n->result(r)] = view->result(r);
  return view->result(v->index());
}

// Every tensor's metadata before the rewrite, and each output's.
struct OldLayouts {
  std::unordered_map<const ir::Value*, ir::TensorMeta> values;
  std::vector<std::optional<ir::TensorMeta>> outputs;
};

OldLayouts old_layouts(const ir::Graph& g) {
  OldLayouts old;
  for (const ir::Node* n : g.nodes())
    for (const auto& r : n->results())
      if (r->is_tensor() && r->has_meta()) old.values.emplace(r.get(), r->meta());
  for (const ir::Value* v : g.outputs()) old.outputs.push_back(v->has_meta() ? std::optional(v->meta()) : std::nullopt);
  return old;
}

// See Note [Eager's strides at the outputs]. Throws InductorError where an
// output cannot get its old layout back.
void keep_output_layouts(ir::Graph& g, const OldLayouts& old) {
  std::unordered_map<const ir::Value*, ir::Value*> copies, made;
  const std::vector<size_t> visible = visible_outputs(g);
  const std::vector<ir::Value*> before = g.outputs();
  for (size_t i : visible) {
    ir::Value* out = before[i];
    ir::Value* root = ir::storage_root(out);
    auto was = old.values.find(root);
    if (was == old.values.end() || !root->has_meta() || same_layout(was->second, root->meta())) continue;
    auto copy = copies.find(root);
    if (copy == copies.end()) copy = copies.emplace(root, copy_in_layout(g, root, was->second)).first;
    g.output_node()->set_arg(i, view_again(g, out, root, copy->second, made));
  }
  const std::vector<ir::Value*> outputs = g.outputs();
  for (size_t i : visible)
    if (old.outputs[i] && !ir::meta_equivalent(*old.outputs[i], outputs[i]->meta()))
      throw InductorError("layout rewrite: output " + std::to_string(i) + " (%" + outputs[i]->name() +
                          ") cannot keep its layout " + ir::to_string(*old.outputs[i]));
}

void rewrite(ir::Graph& g) {
  const OldLayouts old = old_layouts(g);
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
        it = copies.emplace(v, add(g, "aten::clone", {v, c10::MemoryFormat::ChannelsLast})).first;
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
  keep_output_layouts(g, old);
}

}  // namespace

void channels_last_convolutions(ir::Graph& g, bool force) {
  // Copied only where there is something to rewrite: a warm compile of a
  // large graph without convolutions should not pay for a copy of it.
  if (!(force || loop_device(g).is_cuda()) || convolutions(g).empty()) return;
  ir::Graph work = g.clone();
  try {
    rewrite(work);
  } catch (const std::exception&) {
    return;  // metadata it cannot derive, an output it cannot keep: the graph keeps its layout
  }
  g = std::move(work);
  runtime::default_counters().add("inductor", "channels_last_rewrites");
}

}  // namespace crucible::inductor::detail
