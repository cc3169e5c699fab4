#include "lowering/lowering.h"

#include "lowering/lowerer.h"
#include "lowering/pointwise_table.h"

#include <crucible/ir/op_classes.h>

#include <algorithm>
#include <cctype>
#include <unordered_set>

namespace crucible::inductor::detail {

// Note [Lowering]
// Each graph node becomes one of four things (torch/_inductor/lowering.py
// and graph.py do the same with TensorBox/StorageBox):
//  - pointwise (the table of lowering/pointwise_table.cpp): a lazy
//    function from an index to an element, inlined into whatever reads it,
//    or realized into a Computed buffer written by a loop when the graph
//    returns it, an extern kernel reads it, a graph pass asks (kRealizeTag),
//    or inlining would recompute too much;
//  - a reduction (sum, mean, amax, amin, var_mean): a loop over kept ×
//    reduced indices whose operand inlines its producers (the prologue);
//    its result is always a buffer;
//  - a view (view, reshape, expand, permute, transpose, slice, select,
//    split, squeeze, unsqueeze, ...: ir::OpClass::IndexView): a change of
//    index folded into the readers' index expressions, never a copy; where
//    an extern kernel or the graph's outputs need the view as a tensor, the
//    view op itself runs on the realized base, so it aliases as it does in
//    eager;
//  - an extern kernel: everything else (mm, convolution, random and
//    mutating ops, ops of dtypes or devices the loops do not handle), run
//    through the dispatcher in graph order.
// The loops run on one device: the graph's CUDA device when it has a
// tensor on one (the CUDA renderer, Note [CUDA rendering]), else the CPU.
// A 0-dim CPU tensor that a pointwise op on the GPU reads (a learning rate
// or Adam's bias correction in a CUDA training step, as ATen's CUDA kernels
// read it) is a host scalar: its value is passed to the kernel. A node
// touching any other tensor elsewhere (a device copy, a CPU computation) is
// an extern kernel, since a kernel cannot dereference another device's memory.
// Mutations: pointwise values are computed when their loop runs, so before
// an extern kernel that writes a buffer, every pending pointwise value that
// reads that buffer is realized (eager computed it before the write);
// views are not, since in eager they alias the written buffer too.

namespace {

// Inlining bounds (torch/_inductor/config.py's realize_reads_threshold and
// realize_opcount_threshold play the same part).
constexpr int kMaxInlineOps = 48;
constexpr int kMaxRecompute = 24;

}  // namespace

Program Lowerer::run() {
  p_.device = loop_device(g_);
  for (const ir::Node* n : g_.nodes()) {
    order_[n] = order_.size();
    if (n->is_call()) kind_[n] = classify(n);
  }
  if (const ir::Node* out = g_.output_node())
    for (const ir::Value* v : out->inputs()) outputs_.insert(v);
  std::vector<const ir::Node*> nodes(g_.nodes().begin(), g_.nodes().end());
  std::vector<const ir::Node*> trailing;  // Note [Trailing write-backs]
  while (!nodes.empty() && nodes.back()->is_output()) nodes.pop_back();
  while (!nodes.empty() && is_write_back(nodes.back())) {
    trailing.insert(trailing.begin(), nodes.back());
    nodes.pop_back();
  }
  for (const ir::Node* n : nodes) lower_node(n);
  for (const ir::Node* n : write_back_order(trailing)) lower_node(n);
  if (const ir::Node* out = g_.output_node())
    for (const ir::Value* v : out->inputs()) --pending_[v];
  if (const ir::Node* out = g_.output_node())
    for (const ir::Value* v : out->inputs()) ensure_tensor(v);
  sink_waits();
  // Each loop counts its buffer's elements: spelled as that tensor's sizes
  // are (Note [Dynamic sizes]).
  for (Loop& l : p_.loops) l.size_exprs = spelled_sizes(p_.buffers[static_cast<size_t>(l.buffer)].value, l.sizes);
  return std::move(p_);
}

void Lowerer::lower_node(const ir::Node* n) {
  for (const ir::Value* v : n->inputs()) --pending_[v];
  for (const auto& r : n->results()) pending_[r.get()] = static_cast<int>(r->users().size());
  if (n->is_placeholder() || n->is_constant()) {
    if (n->result()->is_tensor() && n->result()->has_meta()) add_buffer(n->result(), Buffer::Input);
    return;
  }
  if (!n->is_call()) return;
  switch (kind_.at(n)) {
    case Kind::Pointwise:
      lower_pointwise(n);
      break;
    case Kind::Pad:
      lower_pad(n);
      break;
    case Kind::Cat:
      lower_cat(n);
      break;
    case Kind::Pool:
      lower_max_pool(n);
      break;
    case Kind::PoolBackward:
      lower_max_pool_backward(n);
      break;
    case Kind::Reduction:
      lower_reduction(n);
      break;
    case Kind::View:
      lower_view(n);
      break;
    case Kind::Extern:
      lower_extern(n);
      break;
  }
}

// A tensor the loops can read and write: on the loops' device, of a type they handle.
bool Lowerer::loop_tensor(const ir::Value* v) const {
  return v && v->is_tensor() && v->has_meta() && v->meta().device == p_.device && !ctype_of(v->meta().dtype).empty();
}

// A 0-dim CPU tensor that loops on a GPU read by value (Note [Lowering]).
bool Lowerer::host_scalar(const ir::Value* v) const {
  return p_.device.is_cuda() && v && v->is_tensor() && v->has_meta() && v->meta().device.is_cpu() &&
         v->meta().sizes.empty() && !ctype_of(v->meta().dtype).empty() && !reduced_precision(v->meta().dtype);
}

Lowerer::Kind Lowerer::classify(const ir::Node* n) const {
  for (const auto& r : n->results())
    if (!loop_tensor(r.get())) return Kind::Extern;
  if (n->is_mutating() || n->is_nondeterministic()) return Kind::Extern;
  const std::string& t = n->target();
  if (ir::is_op_class(t, ir::OpClass::IndexView)) {
    if (n->args().empty() || !n->arg(0).is_value() || !loop_tensor(n->arg(0).value())) return Kind::Extern;
    for (size_t i = 1; i < n->args().size(); ++i)
      if (!n->arg(i).is_constant()) return Kind::Extern;
    return Kind::View;
  }
  if (reduction_ok(n)) return Kind::Reduction;
  if (t == "aten::constant_pad_nd") return pad_ok(n) ? Kind::Pad : Kind::Extern;
  if (t == "aten::cat") return cat_dim(n) ? Kind::Cat : Kind::Extern;
  if (t == "aten::max_pool2d_with_indices") return window_of(n, 1, 0) ? Kind::Pool : Kind::Extern;
  if (t == "aten::max_pool2d_with_indices_backward")
    return p_.device.is_cuda() && window_of(n, 2, 7) ? Kind::PoolBackward : Kind::Extern;
  auto it = pointwise_ops().find(t);
  if (it == pointwise_ops().end() || n->num_results() != 1) return Kind::Extern;
  const PointwiseOp& op = it->second;
  for (size_t i : op.scalar_args)
    if (i >= n->args().size() || !numeric_constant(n->arg(i))) return Kind::Extern;
  std::vector<c10::ScalarType> operand_types;
  for (size_t i : op.tensor_args) {
    if (i >= n->args().size() || !n->arg(i).is_value()) return Kind::Extern;
    if (!loop_tensor(n->arg(i).value()) && !host_scalar(n->arg(i).value())) return Kind::Extern;
    bool mask = std::find(op.bool_args.begin(), op.bool_args.end(), i) != op.bool_args.end();
    c10::ScalarType dt = n->arg(i).value()->meta().dtype;
    if (mask && dt != c10::kBool) return Kind::Extern;
    if (!mask) operand_types.push_back(dt);
  }
  // Every other argument must be a constant (dtype, memory_format, ...):
  // a Value there (a SymInt, a tensor the table does not list) stays extern.
  for (size_t i = 0; i < n->args().size(); ++i) {
    bool listed = std::find(op.tensor_args.begin(), op.tensor_args.end(), i) != op.tensor_args.end() ||
                  std::find(op.unread_args.begin(), op.unread_args.end(), i) != op.unread_args.end();
    if (!listed && !n->arg(i).is_constant()) return Kind::Extern;
  }
  c10::ScalarType compute = compute_type(n, op);
  if (op.reads_index && (is_float(compute) || n->result()->meta().sizes.size() != 1)) return Kind::Extern;
  if (op.compute_in_operands) {
    for (c10::ScalarType dt : operand_types)
      if (dt != compute) return Kind::Extern;  // comparisons across dtypes promote: leave them to ATen
    for (size_t i : op.scalar_args)
      if (scalar_promotes(n->arg(i).constant(), compute)) return Kind::Extern;
  }
  if (!is_float(compute) && !op.integer_ok) return Kind::Extern;
  return Kind::Pointwise;
}

// A value lowered to a body (pointwise, a pad or a view), not yet realized.
void Lowerer::define_lazy(const ir::Value* v, Lazy l) {
  lazy_[v] = std::move(l);
  unrealized_.push_back(v);
}

// The buffers the body of lazy value `v` loads. Fixed once `v` is defined:
// its body inlines its producers' bodies as they were then, so a producer
// realized later changes nothing here. Memoized: before every mutating
// extern kernel the values still to be read are checked against what it
// writes (lower_extern), and a training step has one such write-back per
// parameter and optimizer state.
const std::vector<int>& Lowerer::buffers_read(const ir::Value* v) {
  auto [it, fresh] = reads_.try_emplace(v);
  if (fresh) {
    Loop probe;
    probe.sizes = lazy_.at(v).sizes;
    probe.fn = lazy_.at(v).fn;
    for (const Read& r : reads_of(p_, probe, probe.numel(), 1))
      if (std::find(it->second.begin(), it->second.end(), r.buffer) == it->second.end()) it->second.push_back(r.buffer);
  }
  return it->second;
}

int Lowerer::add_buffer(const ir::Value* v, Buffer::Kind kind) {
  Buffer b;
  b.kind = kind;
  b.name = "buf" + std::to_string(p_.buffers.size()) + "_" + c_name(v->name());
  b.value = v;
  b.sizes = v->meta().sizes;
  b.dtype = v->meta().dtype;
  b.strides = kind == Buffer::Computed && !dense(v->meta()) ? contiguous_strides(b.sizes) : v->meta().strides;
  b.host_scalar = host_scalar(v);
  int id = static_cast<int>(p_.buffers.size());
  p_.buffers.push_back(std::move(b));
  p_.buffer_of[v] = id;
  Lazy& l = lazy_[v];
  l.sizes = v->meta().sizes;
  l.dtype = v->meta().dtype;
  l.fn = [id](Body& body, const std::vector<Expr>& idx) { return body.load(id, idx); };
  l.ops = 0;
  l.nodes.clear();
  // A buffer is not a view any more for the readers that come: but the
  // view-ness (aliasing) of a value never changes; keep it.
  return id;
}

std::string Lowerer::c_name(const std::string& s) {
  std::string out;
  for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out;
}

// Dense and non-overlapping: strides a permutation of some row-major
// strides, so a buffer can be allocated with them.
bool Lowerer::dense(const ir::TensorMeta& m) {
  std::vector<size_t> order(m.sizes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return m.strides[a] > m.strides[b]; });
  int64_t expected = 1;
  for (size_t k = order.size(); k-- > 0;) {
    size_t d = order[k];
    if (m.sizes[d] == 1) continue;
    if (m.strides[d] != expected) return false;
    expected *= m.sizes[d];
  }
  return true;
}

void Lowerer::realize(const ir::Value* v) {
  if (p_.buffer_of.contains(v)) return;
  Lazy l = lazy_.at(v);
  int id = add_buffer(v, Buffer::Computed);
  Loop loop;
  loop.buffer = id;
  loop.sizes = l.sizes;
  loop.fn = l.fn;
  loop.nodes = l.nodes;
  loop.order = memory_order(p_.buffers[id]);
  p_.buffers[id].loop = static_cast<int>(p_.loops.size());
  p_.items.push_back({nullptr, static_cast<int>(p_.loops.size())});
  p_.loops.push_back(std::move(loop));
  lazy_[v].view = l.view;
  lazy_[v].base = l.base;
}

// The dimensions of a dense buffer by decreasing stride, those of size 1
// last (their index is always 0), or empty when that is row-major.
std::vector<int> Lowerer::memory_order(const Buffer& b) {
  std::vector<int> order, ones;
  for (size_t d = 0; d < b.sizes.size(); ++d) (b.sizes[d] == 1 ? ones : order).push_back(static_cast<int>(d));
  std::stable_sort(order.begin(), order.end(),
                   [&](int x, int y) { return b.strides[static_cast<size_t>(x)] > b.strides[static_cast<size_t>(y)]; });
  if (std::is_sorted(order.begin(), order.end())) return {};
  for (const int d : ones) order.push_back(d);  // (a range insert trips GCC 13's -Wstringop-overflow)
  return order;
}

// `v` as a tensor at run time: a view runs its view op on the (realized)
// base; anything else lazy is realized.
void Lowerer::ensure_tensor(const ir::Value* v) {
  if (p_.buffer_of.contains(v)) return;
  auto it = lazy_.find(v);
  if (it == lazy_.end()) return;  // a non-tensor: extern results cover it
  const ir::Node* n = v->node();
  if (n->is_call() && kind_.at(n) == Kind::View) {
    ensure_tensor(n->arg(0).value());
    p_.items.push_back({n, -1});
    for (const auto& r : n->results()) {
      // The view's tensor exists now; readers keep the index map (cheaper
      // than reading through the tensor, and the same elements).
      PointwiseFn keep = lazy_.at(r.get()).fn;
      add_buffer(r.get(), Buffer::Extern);
      lazy_[r.get()].fn = keep;
      lazy_[r.get()].view = true;
    }
    return;
  }
  realize(v);
}

bool Lowerer::needs_tensor(const ir::Value* v) const {
  if (outputs_.contains(v)) return true;
  for (const ir::Node* u : v->users()) {
    // A write-back may take v in place (Note [In-place write-backs]);
    // if it does not, it realizes v when it is lowered.
    if (is_write_back(u) && u->arg(1).is_value() && u->arg(1).value() == v) continue;
    if (u->is_output() || (u->is_call() && kind_.at(u) == Kind::Extern)) return true;
  }
  return false;
}

// Realizes a new pointwise value where inlining it would not pay: a
// tensor something needs, a value a graph pass asked for (kRealizeTag),
// too many ops, or too much recomputation or re-reading across its
// readers. A write-back of the value is not a reader that recomputes it:
// taken in place, its loop joins the other readers' kernel and shares
// their loads (an optimizer's new momentum, read by the parameter's
// update and written back; Note [In-place write-backs]).
void Lowerer::realize_if_costly(const ir::Value* out) {
  size_t readers = 0;
  for (const ir::Node* u : out->users())
    readers += !(is_write_back(u) && u->arg(1).is_value() && u->arg(1).value() == out);
  const Lazy& made = lazy_.at(out);
  if (needs_tensor(out) || out->node()->has_tag(kRealizeTag) || made.ops > kMaxInlineOps ||
      (readers > 1 && (made.ops * static_cast<int>(readers - 1) > kMaxRecompute || full_loads(made) > 1)))
    realize(out);
}

// The buffers its inlined body reads as many elements of as it has (not
// broadcast): inlined into several readers, each of them reads all of
// these again, where a realized value costs one write and one read per
// reader. What a read spans, not its buffer's size, tells: a causal mask
// sliced to [T, T] from a [1024, 1024] buffer is broadcast over batch and
// heads whatever T is, so the choice does not change with T (Note
// [Dynamic sizes]).
int Lowerer::full_loads(const Lazy& l) const {
  Loop probe;
  probe.sizes = l.sizes;
  probe.fn = l.fn;
  std::unordered_set<int> seen;
  for (const Read& r : reads_of(p_, probe, probe.numel(), 1))
    if (r.flat.hi() - r.flat.lo() + 1 >= probe.numel()) seen.insert(r.buffer);
  return static_cast<int>(seen.size());
}

Program lower(const ir::Graph& graph) { return Lowerer(graph).run(); }

}  // namespace crucible::inductor::detail
