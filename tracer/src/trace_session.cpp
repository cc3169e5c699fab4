#include "trace_session.h"

#include <crucible/ir/meta_call.h>
#include <crucible/ir/op_classes.h>
#include <crucible/tracer/error.h>

#include <ATen/ATen.h>
#include <ATen/FunctionalStorageImpl.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/enum_tag.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

namespace crucible::tracer::detail {

// Note [Value tracking]
// The tracer sees tensors, the graph wants Values. A tensor maps to the Value
// of the op (or placeholder) that produced it:
//  * first by TensorImpl*: the common case, and the one that follows in-place
//    ops — their result IS the mutated tensor, and it is re-mapped to the
//    op's result Value so later reads depend on the mutation. Unless the
//    TensorImpl holds another storage than when it was mapped: its data was
//    replaced outside the dispatcher (Tensor::set_data, as spmd's
//    fully-sharded step points a parameter at its gathered value), and it
//    is looked up by what it holds now, as below;
//  * then by (storage, offset, dtype, sizes, strides): autograd unpacks saved
//    outputs into fresh TensorImpls sharing the storage (and .data /
//    variable_data() make such shallow copies too), which the first key misses;
//  * then, if another Value lives on the same storage, as an aten::as_strided
//    of it: an alias made outside the dispatcher (offsets are absolute in the
//    storage, so any Value on it serves as the base; the interpreter re-creates
//    the same aliasing because it runs the same kernels);
//  * else the tensor was not derived from the inputs: it is lifted to an
//    input, or becomes a constant (Note [Lifted tensors] in make_fx.h).
// The maps hold weak references to every TensorImpl and StorageImpl they key
// on: a weak reference keeps the object's memory, so no address is reused for
// another tensor while the trace runs.

namespace {

const c10::StorageImpl* storage_of(const at::Tensor& t) {
  return t.has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr;
}

std::string meta_string(const at::Tensor& t) {
  std::ostringstream os;
  os << t.scalar_type() << t.sizes();
  return os.str();
}

// Note [Fake tensors]
// A fake-mode trace runs the function on fake tensors, as AOTAutograd runs
// it on FakeTensors: TensorImpls on a meta Storage (sizes, strides and a
// dtype, no memory) that report the device they stand for, so a CUDA
// parameter's fake is_cuda(), and carry that device's autocast key. Code
// above the tracer's key therefore takes the path it takes on the real
// tensors: autocast casts them, at::dropout picks its fused CUDA kernel,
// scaled_dot_product_attention its device's kernel, and autograd checks
// each gradient against its input's device. Their other dispatch keys are
// the Meta backend's, so no device's kernel ever runs on one. Below the
// tracer's key kernels get plain meta tensors on the same Storage (views
// of them alias as the real tensors' do), their meta results come back as
// fakes on the device Note [Devices in fake mode] gives, and device
// arguments go down as the meta device.
class FakeTensorImpl final : public c10::TensorImpl {
 public:
  FakeTensorImpl(c10::Storage storage, caffe2::TypeMeta dtype, c10::Device device)
      : TensorImpl(std::move(storage), keys(device), dtype) {
    device_opt_ = device;
  }

 private:
  static c10::DispatchKeySet keys(c10::Device device) {
    const c10::DispatchKeySet dense(c10::computeDispatchKey(std::nullopt, c10::kStrided, device));
    return c10::DispatchKeySet(c10::DispatchKey::Meta) |
           c10::getAutocastRelatedKeySetFromBackend(dense.highestBackendKey());
  }
};

// A tensor with `t`'s storage and metadata and another TensorImpl, made by
// `make` (a FakeTensorImpl or a plain meta one).
template <class Make>
at::Tensor restrided(const at::Tensor& t, Make make) {
  c10::intrusive_ptr<c10::TensorImpl> impl = make(c10::Storage(t.storage()), t.dtype());
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return at::Tensor(std::move(impl));
}

// The fake of meta tensor `meta`, standing for a tensor on `device`.
at::Tensor fake_tensor(const at::Tensor& meta, c10::Device device) {
  return restrided(meta, [&](c10::Storage storage, caffe2::TypeMeta dtype) {
    return c10::make_intrusive<FakeTensorImpl>(std::move(storage), dtype, device);
  });
}

// A plain meta tensor on fake `fake`'s storage, with its metadata.
at::Tensor meta_of(const at::Tensor& fake) {
  return restrided(fake, [](c10::Storage storage, caffe2::TypeMeta dtype) {
    return c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::Meta), dtype);
  });
}

// A tensor without memory: a meta or a fake one.
bool has_no_data(const at::Tensor& t) {
  return t.defined() && t.has_storage() && t.storage().device_type() == c10::kMeta;
}

// Ops whose result's value or shape depends on tensor data, as ATen tags
// them: a graph cannot hold the control flow or shapes that follow from
// them. (Tensor::is_nonzero and friends reach _local_scalar_dense.)
const char* data_dependent_reason(const c10::OperatorHandle& op) {
  if (op.hasTag(at::Tag::data_dependent_output))
    return op.schema().name() == "aten::_local_scalar_dense"
               ? "reads a tensor element into a C++ number (Tensor::item(), a Scalar conversion, if (tensor))"
               : "reads tensor values into a C++ value (a bool, a number)";
  if (op.hasTag(at::Tag::dynamic_output_shape)) return "returns a tensor whose shape depends on tensor values";
  return nullptr;
}

// aten::index.Tensor is tagged dynamic_output_shape for its boolean masks
// (x[mask]); with integer indices (x[idx], an embedding by hand, a gather
// of rows) its shape follows from the indices' shapes. aten::_ctc_loss
// shares the tag with its overload taking the lengths as tensors; its own
// lengths are lists of ints in the call, which fix its log_alpha's shape.
bool has_static_shape(const std::string& op, const torch::jit::Stack& stack, size_t base) {
  if (op == "aten::_ctc_loss") return true;
  if (op != "aten::index.Tensor") return false;
  for (const std::optional<at::Tensor>& index : stack[base + 1].toOptionalTensorList().vec())
    if (index && index->defined() && (index->scalar_type() == at::kBool || index->scalar_type() == at::kByte))
      return false;
  return true;
}

}  // namespace

size_t TraceSession::ViewKeyHash::operator()(const ViewKey& k) const {
  size_t h =
      std::hash<const void*>()(k.storage) ^ (std::hash<int64_t>()(k.offset) * 31) ^ (static_cast<size_t>(k.dtype) << 7);
  for (int64_t s : k.sizes) h = h * 1000003 ^ std::hash<int64_t>()(s);
  for (int64_t s : k.strides) h = h * 998244353 ^ std::hash<int64_t>()(s);
  return h;
}

// Note [Nodes traced under no_grad]
// A function traced with grad mode on may turn it off for some of its ops:
// LibTorch's embedding renormalizes its weight in place under NoGradGuard
// (max_norm), an optimizer updates its parameters so. The graph has no
// grad-mode nodes (dynamo records torch._C._set_grad_enabled calls), so such
// ops, outside the autograd engine's backward, are tagged "no_grad", and the
// interpreter runs them under no_grad: a graph that is run again to be
// differentiated (a pre-grad graph, Note [Pre-grad graphs]) then does what
// the function did instead of failing on an in-place write to a leaf that
// requires grad, or recording the update in autograd's graph. A trace that
// starts with grad mode off (the training step's, AOTAutograd's inference
// path) tags nothing.
TraceSession::TraceSession(ir::Graph& graph, const TraceOptions& options)
    : graph_(graph), options_(options), grad_at_start_(at::GradMode::is_enabled()) {
  for (const NamedTensor& n : options_.source_names)
    if (n.tensor.defined()) source_names_.emplace(n.tensor.unsafeGetTensorImpl(), n.name);
  for (const auto& [name, fn] : options_.decompositions) {
    try {
      ir::resolve_operator(name);
    } catch (const ir::IrError& e) {
      throw TraceError(std::string("decomposition table: ") + e.what());
    }
    if (!fn) throw TraceError("decomposition table: the entry for " + name + " holds no function");
  }
}

const TraceSession::OpInfo& TraceSession::info(const c10::OperatorHandle& op) {
  const c10::FunctionSchema* key = &op.schema();
  auto it = ops_.find(key);
  if (it != ops_.end()) return it->second;
  OpInfo i;
  i.name = ir::operator_name(op);
  i.data_dependent = data_dependent_reason(op);
  i.hidden_writes = has_hidden_writes(i.name);
  if (auto d = options_.decompositions.find(i.name); d != options_.decompositions.end()) i.decomposition = &d->second;
  if (!i.decomposition && !options_.decompositions.empty()) find_out_of_place_decomposition(op, i);
  return ops_.emplace(key, std::move(i)).first->second;
}

// Note [Decomposing in-place ops]
// A decomposition table names functional ops (aten::addcmul), but a program
// also calls their in-place variants (Tensor::addcmul_), and writes into
// module state reach the tracer as in-place ops even under functionalization
// (Note [Functionalizing module state]). As torch._decomp does for the
// in-place variants it registers, an in-place op `f_` (first argument
// written, the only one) whose out-of-place variant `f` (same arguments, one
// result) has a decomposition is traced as that decomposition followed by
// `self.copy_(result)`: the write stays explicit, and functionalization
// handles it as any other copy_.
void TraceSession::find_out_of_place_decomposition(const c10::OperatorHandle& op, OpInfo& i) {
  const c10::FunctionSchema& schema = op.schema();
  const std::string& name = schema.name();
  if (name.size() < 2 || name.back() != '_' || schema.arguments().empty()) return;
  size_t written = 0;
  for (const c10::Argument& a : schema.arguments()) written += a.alias_info() && a.alias_info()->isWrite();
  const auto* self = schema.arguments()[0].alias_info();
  if (written != 1 || !self || !self->isWrite()) return;
  auto functional = c10::Dispatcher::singleton().findSchema({name.substr(0, name.size() - 1), schema.overload_name()});
  if (!functional || functional->schema().arguments().size() != schema.arguments().size() ||
      functional->schema().returns().size() != 1 || functional->schema().is_mutable())
    return;
  auto d = options_.decompositions.find(ir::operator_name(*functional));
  if (d == options_.decompositions.end()) return;
  i.out_of_place = *functional;
  i.out_of_place_decomposition = &d->second;
}

// Note [Devices in fake mode]
// A fake tensor reports the device it stands for (Note [Fake tensors]). A
// placeholder's is its input's; an op's results take, as ATen's device
// propagation does for the ops a graph holds: an explicit device argument;
// else the device of its first tensor argument not on the CPU (a 0-dim CPU
// operand joins a GPU op on the GPU); else the CPU (a factory given no
// device makes a CPU tensor, as in eager). The rule is exact when a graph's
// tensors share one device, with CPU scalars beside them.
c10::Device TraceSession::fake_device(const std::vector<ir::Argument>& args) const {
  for (const ir::Argument& a : args)
    if (a.is_constant() && a.constant().isDevice()) return a.constant().toDevice();
  for (const ir::Argument& a : args)
    for (const ir::Value* v : a.values())
      if (v->has_meta() && v->meta().device.type() != c10::kCPU) return v->meta().device;
  return c10::Device(c10::kCPU);
}

void TraceSession::define(ir::Value* v, const at::Tensor& t, bool alias_base) {
  if (!t.defined()) return;
  v->set_meta(ir::TensorMeta::of(t));
  by_impl_.insert_or_assign(t.unsafeGetTensorImpl(),
                            ImplEntry{c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr()), v, storage_of(t)});
  if (!t.has_storage()) return;
  const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  by_view_[ViewKey{storage, t.storage_offset(), t.scalar_type(), t.sizes().vec(), t.strides().vec()}] = v;
  if (alias_base) by_storage_.insert_or_assign(storage, StorageEntry{t.storage().getWeakStorageImpl(), v});
}

ir::Value* TraceSession::lookup(const at::Tensor& t) {
  if (auto it = by_impl_.find(t.unsafeGetTensorImpl()); it != by_impl_.end()) {
    if (it->second.storage == storage_of(t)) return it->second.value;
    by_impl_.erase(it);  // its data was replaced: Note [Value tracking]
  }
  if (!t.has_storage()) return nullptr;
  const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  ViewKey key{storage, t.storage_offset(), t.scalar_type(), t.sizes().vec(), t.strides().vec()};
  if (auto it = by_view_.find(key); it != by_view_.end()) {
    by_impl_.insert_or_assign(
        t.unsafeGetTensorImpl(),
        ImplEntry{c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr()), it->second, storage});
    return it->second;
  }
  auto s = by_storage_.find(storage);
  if (s == by_storage_.end() || s->second.value->meta().dtype != t.scalar_type()) return nullptr;
  // An alias made outside the dispatcher. See Note [Value tracking].
  static const c10::OperatorHandle as_strided = ir::resolve_operator("aten::as_strided");
  ir::Node* n = graph_.add_call(as_strided, {s->second.value, t.sizes().vec(), t.strides().vec(), t.storage_offset()});
  define(n->result(), t);
  return n->result();
}

// Note [Swapping reached tensors]
// A torch::nn module reads its tensors through members (Linear::weight) that
// share their TensorImpl with the entries of named_parameters(), and a lambda
// reads the tensors it captured: the tracer cannot hand the function other
// tensors in their place. Instead it swaps what the TensorImpl holds:
// Tensor::set_data points the caller's tensor at the traced copy (same
// sizes, strides and dtype; a fake tensor in fake mode), and the original
// storage and metadata, kept in a shallow copy, are put back when the trace
// ends (restore(), which also runs when tracing throws). Its gradient is
// detached for the trace, so a .backward() inside it starts from none and
// never accumulates into the caller's, and is restored with the data. The
// tensor keeps its identity and autograd metadata (requires_grad, leaf), so
// autograd treats it as it would in eager.
namespace {

// Tensor::set_data refuses to give a tensor the metadata of one of another
// kind (a CPU tensor a fake's, whose keys are the Meta backend's), so such
// a swap copies the TensorImpl's metadata directly, which is what set_data
// does once its checks pass.
void swap_data(const at::Tensor& t, const at::Tensor& data) {
  if (t.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(data.key_set()))
    t.set_data(data);
  else
    t.unsafeGetTensorImpl()->shallow_copy_from(data.getIntrusivePtr());
}

int64_t nbytes(const at::Tensor& t) { return static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size()); }

// `src`'s values into `dst`, of the same sizes and strides. Where elements
// share memory (an expanded tensor, stride 0), copy_ refuses to write them,
// so the memory range they span is copied as one flat run instead.
void copy_values(const at::Tensor& dst, const at::Tensor& src) {
  if (at::has_internal_overlap(dst) != at::MemOverlap::Yes) {
    dst.copy_(src.detach());
    return;
  }
  int64_t span = 1;
  for (int64_t d = 0; d < dst.dim(); ++d) span += (dst.size(d) - 1) * dst.stride(d);
  dst.as_strided({span}, {1}).copy_(src.detach().as_strided({span}, {1}));
}

// A copy of `t`'s values with the same sizes, strides and dtype.
at::Tensor copy_of(const at::Tensor& t) {
  at::Tensor copy = at::empty_strided(t.sizes(), t.strides(), t.options().requires_grad(false));
  copy_values(copy, t);
  return copy;
}

// The tensor the traced function runs on in place of `t`: a copy with the same
// sizes, strides, storage offset and dtype, a fake tensor in fake mode, so
// tracing never writes to the caller's tensors.
at::Tensor traced_copy(const at::Tensor& t, TraceMode mode) {
  auto opts = t.options().requires_grad(false);
  if (mode == TraceMode::Fake) opts = opts.device(at::kMeta);
  const int64_t storage_numel =
      t.has_storage() ? static_cast<int64_t>(t.storage().nbytes()) / static_cast<int64_t>(t.element_size()) : t.numel();
  at::Tensor c = at::empty({storage_numel}, opts).as_strided(t.sizes(), t.strides(), t.storage_offset());
  if (mode == TraceMode::Fake) return fake_tensor(c, t.device());
  copy_values(c, t);
  return c.detach();
}

}  // namespace

void mark_lifted_inputs(std::vector<TraceInput>& inputs, size_t offset, const TraceOptions& options) {
  for (size_t i : options.lifted_inputs) {
    if (offset + i >= inputs.size())
      throw TraceError("TraceOptions::lifted_inputs names input " + std::to_string(i) + " of " +
                       std::to_string(inputs.size() - offset) + " example inputs");
    TraceInput& in = inputs[offset + i];
    std::string target;
    for (const NamedTensor& n : options.source_names)
      if (n.tensor.defined() && n.tensor.is_same(in.tensor)) target = n.name;
    in.name = target.empty() ? "lifted_tensor" : target;
    in.spec = ir::InputSpec{ir::InputKind::Lifted, target, std::nullopt};
    in.reached = true;
  }
}

TraceSession::~TraceSession() {
  try {
    restore();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw; restore() only fails if set_data does
  }
}

at::Tensor TraceSession::add_input(const TraceInput& in) {
  ir::Value* v = graph_.add_placeholder(in.name, ir::TensorMeta::of(in.tensor), in.spec);
  if (in.reached) {
    reach(in.tensor, v, in.spec.kind, /*lifted_here=*/false);
    return in.tensor;
  }
  at::Tensor copy = traced_copy(in.tensor, options_.mode);
  define(v, copy);
  ir::TensorMeta meta = v->meta();
  meta.requires_grad = in.tensor.requires_grad();  // the caller's, not the copy's
  v->set_meta(std::move(meta));
  return copy;
}

void TraceSession::reach(const at::Tensor& t, ir::Value* v, ir::InputKind kind, bool lifted_here) {
  // See Note [Swapping reached tensors].
  Reached r{t, t.variable_data(), t.grad(), v, kind, lifted_here, std::nullopt, {}};
  if (lifted_here && !has_no_data(t) && nbytes(t) <= options_.max_constant_bytes) r.pristine = copy_of(t);
  reached_.push_back(std::move(r));
  if (t.grad().defined()) t.mutable_grad() = at::Tensor();
  swap_data(t, traced_copy(t, options_.mode));
  define(v, t);  // the copy's metadata; the tensor keeps its requires_grad
}

ir::Value* TraceSession::lift(const at::Tensor& t, const std::string& user) {
  // See Note [Lifted tensors].
  if (restored_)
    throw TraceError(user + " reads a tensor " + meta_string(t) +
                     " the trace has not seen, after the trace ended; this is a bug in the tracer's caller");
  auto name = source_names_.find(t.unsafeGetTensorImpl());
  const std::string target = name == source_names_.end() ? std::string() : name->second;
  ir::Value* v = graph_.add_placeholder(target.empty() ? "lifted_tensor" : target, ir::TensorMeta::of(t),
                                        ir::InputSpec{ir::InputKind::Lifted, target, std::nullopt});
  reach(t, v, ir::InputKind::Lifted, /*lifted_here=*/true);
  return v;
}

ir::Value* TraceSession::constant_of(const at::Tensor& t, const std::string& user) {
  if (has_no_data(t))
    throw TraceError(user + " reads a " + (t.is_meta() ? "meta" : "fake") + " tensor " + meta_string(t) +
                     " that is not derived from the traced inputs (a fake tensor kept from another trace, or "
                     "a meta tensor); a graph cannot capture its value: pass it as an input");
  const int64_t bytes = nbytes(t);
  if (bytes > options_.max_constant_bytes)
    throw TraceError(user + " reads a tensor " + meta_string(t) + " (" + std::to_string(bytes) +
                     " bytes) that would become a constant larger than TraceOptions::max_constant_bytes (" +
                     std::to_string(options_.max_constant_bytes) +
                     "): freezing bakes every tensor read from outside; trace without freeze to lift it to an "
                     "input, or raise the limit");
  at::Tensor copy = copy_of(t);
  ir::Value* v = graph_.add_constant(copy);
  // Not a base for aliases: the copy does not share the original's storage.
  define(v, t, /*alias_base=*/false);
  v->set_meta(ir::TensorMeta::of(copy));
  return v;
}

ir::Value* TraceSession::value_of(const at::Tensor& t, const std::string& user) {
  if (ir::Value* v = lookup(t)) return v;
  return options_.freeze ? constant_of(t, user) : lift(t, user);
}

bool TraceSession::is_reached(const at::Tensor& t) const {
  for (const Reached& r : reached_)
    if (r.tensor.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return true;
  return false;
}

std::vector<bool> TraceSession::reached_placeholders() const {
  std::vector<bool> reached(graph_.placeholders().size(), false);
  const std::vector<ir::Value*> placeholders = graph_.placeholders();
  for (const Reached& r : reached_)
    for (size_t i = 0; i < placeholders.size(); ++i)
      if (placeholders[i] == r.value) reached[i] = true;
  return reached;
}

std::vector<TraceOutput> TraceSession::gradients(bool parameters) const {
  std::vector<TraceOutput> grads;
  const std::vector<ir::Value*> placeholders = graph_.placeholders();
  for (size_t i = 0; i < placeholders.size(); ++i) {
    for (const Reached& r : reached_) {
      if (r.value != placeholders[i]) continue;
      const bool wanted = r.kind == ir::InputKind::Lifted || (parameters && r.kind == ir::InputKind::Parameter);
      if (at::Tensor g = r.tensor.grad(); wanted && g.defined())
        grads.push_back({g, ir::OutputSpec{ir::OutputKind::Gradient, i}});
    }
  }
  return grads;
}

void TraceSession::restore() {
  if (restored_) return;
  restored_ = true;
  // See Note [Swapping reached tensors].
  for (auto r = reached_.rbegin(); r != reached_.rend(); ++r) {
    swap_data(r->tensor, r->data);
    if (r->grad.defined() || r->tensor.grad().defined()) r->tensor.mutable_grad() = r->grad;
    r->data.reset();
    r->grad.reset();
  }
}

std::vector<LiftedTensor> TraceSession::settle_lifted(std::vector<InputMutation>& input_mutations) {
  // Only weak references from here on: a temporary of the function dies.
  for (Reached& r : reached_) {
    if (!r.lifted_here) continue;
    r.weak.emplace(r.tensor.getIntrusivePtr());
    r.tensor.reset();
  }
  std::vector<LiftedTensor> lifted;
  for (size_t k = reached_.size(); k-- > 0;) {
    const Reached& r = reached_[k];
    if (!r.lifted_here) continue;
    const std::vector<ir::Value*> placeholders = graph_.placeholders();
    const size_t index =
        static_cast<size_t>(std::find(placeholders.begin(), placeholders.end(), r.value) - placeholders.begin());
    if (!r.weak->expired()) {
      lifted.insert(lifted.begin(), LiftedTensor{index, at::Tensor(r.weak->lock())});
      continue;
    }
    to_constant(r, index, input_mutations);
    for (LiftedTensor& l : lifted) --l.input_index;  // those after it moved up
  }
  return lifted;
}

// A tensor the function made itself outside the dispatcher (Note [Lifted
// tensors]): its placeholder becomes a constant holding its first value.
void TraceSession::to_constant(const Reached& r, size_t index, std::vector<InputMutation>& input_mutations) {
  ir::Value* v = r.value;
  if (!r.pristine.defined())
    throw TraceError("the traced function made a tensor " + std::string(c10::toString(v->meta().dtype)) +
                     c10::str(c10::IntArrayRef(v->meta().sizes)) +
                     " outside the dispatcher (at::from_blob) "
                     "that is larger than TraceOptions::max_constant_bytes (" +
                     std::to_string(options_.max_constant_bytes) +
                     ") or a meta tensor, so it cannot become a constant of the graph; make it outside the "
                     "traced function and pass it in, or raise the limit");
  // Outputs describing the placeholder (its new value, its gradient) go: the
  // tensor they would be written to no longer exists.
  std::vector<ir::Value*> outs;
  std::vector<ir::OutputSpec> specs;
  for (size_t o = 0; o < graph_.outputs().size(); ++o) {
    ir::OutputSpec spec = graph_.signature().outputs[o];
    if (spec.input_index && *spec.input_index == index) continue;
    if (spec.input_index && *spec.input_index > index) --*spec.input_index;
    outs.push_back(graph_.outputs()[o]);
    specs.push_back(spec);
  }
  graph_.set_output(outs);
  graph_.signature().outputs = specs;
  // A written or returned constant is cloned first: the graph must not
  // change, or hand out, the tensor it holds.
  bool clone = false;
  for (const ir::Node* user : v->users()) clone |= user->is_output() || (user->is_call() && user->is_mutating());
  ir::Node* first = nullptr;
  for (ir::Node* n : graph_.nodes())
    if (!n->is_placeholder()) {
      first = n;
      break;
    }
  ir::Value* c = nullptr;
  {
    std::optional<ir::Graph::InsertGuard> at_top;
    if (first) at_top.emplace(graph_, first);
    c = graph_.add_constant(r.pristine);
    c->set_meta(ir::TensorMeta::of(r.pristine));
    if (clone) {
      static const c10::OperatorHandle clone_op = ir::resolve_operator("aten::clone");
      ir::Node* n = graph_.add_call(clone_op, {c, c10::IValue()});
      n->result()->set_meta(c->meta());
      c = n->result();
    }
  }
  v->replace_all_uses_with(c);
  graph_.erase(v->node());
  input_mutations.erase(input_mutations.begin() + static_cast<std::ptrdiff_t>(index));
}

ir::Argument TraceSession::argument(const c10::IValue& iv, const c10::Argument& formal, const std::string& user) {
  if (iv.isTensor()) {
    const at::Tensor& t = iv.toTensor();
    // An undefined tensor passed for a Tensor? argument means None.
    if (!t.defined()) return formal.type()->kind() == c10::TypeKind::OptionalType ? c10::IValue() : iv;
    return value_of(t, user);
  }
  if (iv.isTensorList()) {
    ir::Argument::ValueList vs;
    // A vector, not the c10::List: its proxies make references dangle.
    for (const at::Tensor& t : iv.toTensorVector()) {
      if (!t.defined()) throw TraceError(user + ": argument '" + formal.name() + "' holds an undefined tensor");
      vs.push_back(value_of(t, user));
    }
    return vs;
  }
  if (iv.isList()) {
    auto list_type = formal.type()->cast<c10::ListType>();
    auto opt = list_type ? list_type->getElementType()->cast<c10::OptionalType>() : nullptr;
    if (opt && opt->getElementType()->kind() == c10::TypeKind::TensorType) {
      ir::Argument::ValueList vs;
      for (const c10::IValue& e : iv.toListRef()) {
        const bool present = e.isTensor() && e.toTensor().defined();
        vs.push_back(present ? value_of(e.toTensor(), user) : nullptr);
      }
      return vs;
    }
  }
  return iv;
}

// Note [Fake mode]
// In fake mode the inputs are fake tensors (Note [Fake tensors]) and ops run
// on their Meta kernels, which compute output metadata only. Where LibTorch
// has no Meta kernel for an op in C++ (the dispatcher throws
// NotImplementedError; aten::relu, for one), a meta function of the ir
// library computes it (convolution, batch norm: Note [Meta functions] in
// ir/meta_functions.cpp), or else the op runs once on zero-filled CPU
// stand-ins of its meta inputs, which is exact for every op a graph can hold
// that has a CPU kernel: see Note [CPU stand-ins] in ir/meta_call.cpp.
void TraceSession::run(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack& stack, size_t base,
                       const std::vector<ir::Argument>& args) {
  const auto after = ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::Fake);
  if (options_.mode != TraceMode::Fake) {
    op.redispatchBoxed(after, &stack);
    return;
  }
  // Fakes go down as plain meta tensors, one per fake (Note [Fake tensors]).
  std::vector<std::pair<at::Tensor, at::Tensor>> twins;  // fake, meta
  auto down = [&](const at::Tensor& t) -> at::Tensor {
    if (!has_no_data(t) || t.is_meta()) return t;
    for (const auto& [fake, meta] : twins)
      if (fake.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return meta;
    return twins.emplace_back(t, meta_of(t)).second;
  };
  const auto& formals = op.schema().arguments();
  bool factory = true;
  for (size_t a = 0; a < formals.size(); ++a) {
    c10::IValue& iv = stack[base + a];
    if (iv.isDevice()) iv = c10::Device(c10::kMeta);
    factory &= !iv.isTensor() && !iv.isTensorList() && !iv.isOptionalTensorList();
  }
  // A factory given no device (at::zeros({n})) makes a meta tensor too.
  if (factory)
    for (size_t a = 0; a < formals.size(); ++a)
      if (formals[a].name() == "device" && stack[base + a].isNone()) stack[base + a] = c10::Device(c10::kMeta);
  ir::map_tensors(stack, base, down);
  run_on_meta(op, after, stack, base);

  // In-place changes of metadata (resize_, as_strided_, t_) reach the fakes.
  for (const auto& [fake, meta] : twins) {
    c10::TensorImpl* impl = fake.unsafeGetTensorImpl();
    if (!fake.storage().is_alias_of(meta.storage())) impl->set_storage_keep_dtype(meta.storage());
    if (fake.sizes() != meta.sizes() || fake.strides() != meta.strides() ||
        fake.storage_offset() != meta.storage_offset())
      impl->set_sizes_and_strides(meta.sizes(), meta.strides(), meta.storage_offset());
  }
  // Results come back as fakes on their device; an in-place op's result is
  // the fake it wrote.
  const c10::Device device = fake_device(args);
  auto up = [&](const at::Tensor& r) -> at::Tensor {
    if (!r.defined() || !r.is_meta()) return r;
    for (const auto& [fake, meta] : twins)
      if (meta.unsafeGetTensorImpl() == r.unsafeGetTensorImpl()) return fake;
    return fake_tensor(r, device);
  };
  ir::map_tensors(stack, base, up);
}

void TraceSession::run_on_meta(const c10::OperatorHandle& op, c10::DispatchKeySet after, torch::jit::Stack& stack,
                               size_t base) {
  std::vector<c10::IValue> args(stack.begin() + static_cast<std::ptrdiff_t>(base), stack.end());
  try {
    op.redispatchBoxed(after, &stack);
  } catch (const c10::NotImplementedError&) {
    stack.resize(base);
    for (c10::IValue& a : args) stack.push_back(std::move(a));
    ir::MetaPath path;
    try {
      path = ir::call_without_meta_kernel(op, stack);
    } catch (const c10::Error& e) {
      throw TraceError("fake mode: " + ir::operator_name(op) +
                       " has no Meta kernel and failed on zero-filled CPU stand-ins (" + e.what_without_backtrace() +
                       "); trace in TraceMode::Real instead");
    }
    if (path == ir::MetaPath::StandIns) {
      const std::string name = ir::operator_name(op);
      if (std::find(stand_ins_.begin(), stand_ins_.end(), name) == stand_ins_.end()) stand_ins_.push_back(name);
    }
  }
}

// Functionalize kernels first run a mutating op on meta copies of its
// arguments, made outside the dispatcher, to raise eager's shape errors; such
// calls read meta tensors the trace never saw and are not part of the program.
// They run in any mode, so an in-place op without a Meta kernel in C++
// (logical_and_, which clamp's backward calls) goes the fake mode's way.
bool TraceSession::is_shape_check(const torch::jit::Stack& stack, size_t base) {
  for (size_t a = base; a < stack.size(); ++a) {
    if (!stack[a].isTensor()) continue;
    const at::Tensor& t = stack[a].toTensor();
    if (t.defined() && t.is_meta() && !lookup(t)) return true;
  }
  return false;
}

// Note [Memory written outside the dispatcher]
// at::tensor(values) (and torch::tensor of a std::vector) fills a new
// aten::empty tensor through data_ptr(), a write no dispatcher key sees: a
// graph replaying the recorded empty would compute with uninitialized
// memory. (torch::tensor of an initializer list fills each element with
// fill_, which is traced.) Under functionalization, or on meta tensors, that
// tensor has no memory and data_ptr() throws (see trace() in make_fx.cpp); a
// real-mode trace without functionalization has the memory, so the tracer
// remembers each empty's storage until a traced op writes it (a fill_, an
// out= op, a copy_ into it, through any view): an op that reads it before
// then reads values the graph does not have, and the trace stops with an
// error instead of recording a wrong graph.
namespace {

// Whether `op` writes its argument `a` without reading it: an out= argument,
// or the self of an op that fills it (torch::tensor fills element by element).
bool overwrites(const c10::OperatorHandle& op, size_t a) {
  const c10::FunctionSchema& schema = op.schema();
  if (schema.arguments()[a].is_out()) return true;
  return a == 0 && ir::is_op_class(schema.name(), ir::OpClass::OverwritesSelf);
}

}  // namespace

void TraceSession::check_uninitialized_reads(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                                             size_t base) {
  const auto& formals = op.schema().arguments();
  for (size_t a = 0; a < formals.size(); ++a) {
    const c10::IValue& iv = stack[base + a];
    if (!iv.isTensor() || !iv.toTensor().defined() || !iv.toTensor().has_storage()) continue;
    auto it = uninitialized_.find(iv.toTensor().storage().unsafeGetStorageImpl());
    if (it == uninitialized_.end()) continue;
    if (it->second.storage.expired()) {  // freed; the address is another storage's now
      uninitialized_.erase(it);
      continue;
    }
    const c10::AliasInfo* alias = formals[a].alias_info();
    if (alias && alias->isWrite() && overwrites(op, a)) {
      uninitialized_.erase(it);  // a traced op defines it
    } else if (op.schema().name() == "aten::set_") {
      // Not a read: set_ points the tensor at other memory, here a Storage
      // the graph has no value for.
      throw NeedsFunctionalizationError(
          ir::operator_name(op) + " points %" + it->second.node->result()->name() +
          " at a Storage, which a graph cannot hold (ATen's cuDNN RNN does so with its flattened "
          "weights in a trace that is not functionalized, such as the pre-grad passes' forward "
          "trace); trace the function functionalized, or run it without those passes");
    } else if (!alias || alias->isWrite()) {
      throw TraceError(ir::operator_name(op) + " reads %" + it->second.node->result()->name() +
                       ", a tensor made by aten::empty that no traced op has written: its values were written "
                       "outside the dispatcher (at::tensor from C++ values, a write through data_ptr()) or are "
                       "uninitialized, and a graph cannot hold them; make the tensor outside the traced function "
                       "(it is then read at every call) or build it with torch::tensor, whose writes are traced");
    }  // else a view of it: still unwritten
  }
}

// Note [equal of one tensor]
// LibTorch's multi_head_attention_forward (nn::MultiheadAttention, so every
// nn::Transformer layer) tells self-attention apart by
// torch::equal(query, key), where Python compares identities; the tensors are
// one and the same there. at::equal of a tensor and itself is true unless it
// holds a NaN (NaN != NaN), a value the trace cannot see; the trace takes it
// as true, the identity test the caller means, and records nothing. (In
// multi-head attention both branches compute the same values, NaN or not.)
// at::equal of two different tensors of other sizes is false without a
// look at their values (a decoder's queries and a memory of another length);
// of the same sizes, see Note [Guarded equal].
bool TraceSession::is_equal_of_one_tensor(const torch::jit::Stack& stack, size_t base) {
  const at::Tensor& a = stack[base].toTensor();
  const at::Tensor& b = stack[base + 1].toTensor();
  if (a.unsafeGetTensorImpl() == b.unsafeGetTensorImpl()) return true;
  ir::Value* v = lookup(a);
  return v && v == lookup(b);
}

// Note [Guarded equal]
// at::equal of two tensors of the same sizes reads their values: a decoder's
// cross-attention asks whether its queries are the memory (Note [equal of
// one tensor]), and a target as long as the memory leaves only the values
// to tell. A real-mode trace knows them: it takes the branch at::equal
// gives now, as make_fx in real mode does, and records
// crucible::assert_equal(a, b, answer), which checks at every call that
// at::equal still answers the same and otherwise throws, naming the guard,
// instead of computing the other branch's program with this one's graph.
// The check reads both tensors once (and, on a GPU, waits for them: a
// CUDA graph is not captured around it). A fake-mode trace has no values:
// the call stays a data-dependent error there.
void TraceSession::trace_guarded_equal(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack& stack,
                                       size_t base) {
  const auto& formals = op.schema().arguments();
  ir::Argument a = argument(stack[base], formals[0], "aten::equal");
  ir::Argument b = argument(stack[base + 1], formals[1], "aten::equal");
  c10::impl::ExcludeDispatchKeyGuard no_trace(c10::DispatchKey::Fake);
  op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::Fake), &stack);
  const bool answer = stack[base].toBool();
  ir::Node* guard = graph_.add_call("crucible::assert_equal", {std::move(a), std::move(b), answer});
  if (torch::autograd::get_current_graph_task_id() != -1)
    guard->add_tag("backward");
  else if (grad_at_start_ && !at::GradMode::is_enabled())
    guard->add_tag("no_grad");  // Note [Nodes traced under no_grad]
}

namespace {

// The guard's kernel (Note [Guarded equal]).
void assert_equal(const at::Tensor& self, const at::Tensor& other, bool expected) {
  if (at::equal(self, other) == expected) return;
  throw TraceError(std::string("crucible::assert_equal: at::equal of two tensors of sizes ") + c10::str(self.sizes()) +
                   " was " + (expected ? "true" : "false") + " when the function was traced and is " +
                   (expected ? "false" : "true") +
                   " now (Note [Guarded equal]): the compiled graph holds only the branch the trace took "
                   "(in multi-head attention, self- or cross-attention). Compile the function again with inputs "
                   "that take this branch, or make the decision outside the compiled function");
}

}  // namespace

void TraceSession::on_op(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack& stack) {
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t base = stack.size() - nargs;
  const OpInfo& i = info(op);
  if (i.name == "aten::equal") {
    // See Note [equal of one tensor]; other sizes are ATen's own check,
    // after those of device and dtype, which throw.
    const at::Tensor &a = stack[base].toTensor(), &b = stack[base + 1].toTensor();
    const bool unequal = a.device() == b.device() && a.scalar_type() == b.scalar_type() && a.sizes() != b.sizes();
    if (unequal || is_equal_of_one_tensor(stack, base)) {
      stack.resize(base);
      stack.emplace_back(!unequal);
      return;
    }
    if (options_.mode == TraceMode::Real) return trace_guarded_equal(op, ks, stack, base);
  }
  // A Storage argument is kept in the graph as a constant (cuDNN's RNN
  // points a tensor at its flattened weights' Storage, functionalized on a
  // GPU), but a functional tensor's Storage (taken by .storage() inside a
  // functionalized trace) holds no memory, nor does a meta tensor's in
  // fake mode: set_ onto it would point the tensor at nothing, and the next
  // kernel crash or the graph hold a Storage without data.
  for (size_t a = 0; a < nargs; ++a) {
    if (!stack[base + a].isStorage()) continue;
    const c10::Storage& storage = stack[base + a].toStorage();
    if (dynamic_cast<const at::functionalization::FunctionalStorageImpl*>(storage.unsafeGetStorageImpl()))
      throw TraceError(i.name + " points a tensor at the Storage of a tensor inside a functionalized trace, which " +
                       "holds no memory of its own (a Storage is memory, not a value a graph computes); make the " +
                       "tensor with tensor ops instead (a view, as_strided, a copy)");
    if (storage.device_type() == c10::kMeta)
      throw TraceError(i.name + " points a tensor at the Storage of a fake or meta tensor, which holds no data " +
                       "(a fake-mode trace; cuDNN's RNN does so with its flattened weights); make the tensor with " +
                       "tensor ops instead (a view, as_strided, a copy), or trace in real mode (TraceMode::Auto " +
                       "does by itself)");
  }
  if (i.data_dependent && !has_static_shape(i.name, stack, base)) {
    // Which tensor it reads, as the graph names it (a module buffer keeps
    // its own name: BatchNorm's cumulative average reads num_batches_tracked).
    std::string of;
    if (nargs > 0 && stack[base].isTensor())
      if (const ir::Value* v = lookup(stack[base].toTensor())) {
        // Through in-place ops to the tensor they wrote (x += 1; x.item()):
        // ops whose first argument is written (not out= variants).
        auto writes_self = [](const ir::Node* n) {
          if (!n->is_call() || n->args().empty() || !n->arg(0).is_value()) return false;
          const c10::AliasInfo* alias = n->schema().arguments().front().alias_info();
          return alias && alias->isWrite();
        };
        while (writes_self(v->node())) v = v->node()->arg(0).value();
        of = " (of %" + v->name() + ")";
      }
    throw DataDependentError(
        i.name + of + " " + i.data_dependent +
        ": data-dependent control flow and shapes cannot be captured in a graph. Compute the value "
        "outside the traced function and pass it in, or keep the decision in tensors "
        "(at::where instead of if, masks instead of nonzero)");
  }
  if (i.hidden_writes && options_.functionalize && trace_functional_variant(op, stack, base)) return;
  if (i.out_of_place_decomposition) {
    // See Note [Decomposing in-place ops].
    std::vector<c10::IValue> local(stack.begin() + static_cast<std::ptrdiff_t>(base), stack.end());
    at::Tensor self = local[0].toTensor();
    stack.resize(base);
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      c10::impl::ExcludeDispatchKeyGuard no_functionalize(c10::DispatchKey::Functionalize);
      (*i.out_of_place_decomposition)(*i.out_of_place, local);
      if (local.size() != 1 || !local[0].isTensor())
        throw TraceError("the decomposition of " + ir::operator_name(*i.out_of_place) + " (for " + i.name +
                         ") did not leave one tensor on the stack");
      self.copy_(local[0].toTensor());
    }
    stack.emplace_back(self);
    return;
  }
  if (i.decomposition) {
    std::vector<c10::IValue> local(stack.begin() + static_cast<std::ptrdiff_t>(base), stack.end());
    stack.resize(base);
    {
      // Its ATen calls are traced (the Fake key stays on), below autograd.
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      c10::impl::ExcludeDispatchKeyGuard no_functionalize(c10::DispatchKey::Functionalize);
      (*i.decomposition)(op, local);
    }
    if (local.size() != schema.returns().size())
      throw TraceError("the decomposition of " + i.name + " left " + std::to_string(local.size()) +
                       " values on the stack; the schema returns " + std::to_string(schema.returns().size()));
    for (auto& r : local) stack.push_back(std::move(r));
    return;
  }

  c10::impl::ExcludeDispatchKeyGuard no_trace(c10::DispatchKey::Fake);
  if (options_.functionalize && is_shape_check(stack, base)) {
    run_on_meta(op, ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::Fake), stack, base);
    return;
  }
  std::vector<ir::Argument> args;
  args.reserve(nargs);
  for (size_t a = 0; a < nargs; ++a) args.push_back(argument(stack[base + a], schema.arguments()[a], i.name));
  if (!uninitialized_.empty()) check_uninitialized_reads(op, stack, base);

  run(op, ks, stack, base, args);

  std::optional<size_t> list_size;
  const size_t nret = schema.returns().size();
  for (size_t r = 0; r < nret; ++r) {
    const c10::IValue& iv = stack[base + r];
    if (!iv.isTensorList()) continue;
    const size_t n = iv.toTensorList().size();
    if (list_size && *list_size != n)
      throw TraceError(i.name + " returns Tensor[] lists of different lengths, which the graph cannot hold");
    list_size = n;
  }
  ir::Node* node = graph_.add_call(op, std::move(args), list_size);
  // See Note [Memory written outside the dispatcher].
  if (options_.mode == TraceMode::Real && !options_.functionalize &&
      (i.name == "aten::empty.memory_format" || i.name == "aten::empty_strided") && stack[base].isTensor())
    uninitialized_.insert_or_assign(stack[base].toTensor().storage().unsafeGetStorageImpl(),
                                    Uninitialized{stack[base].toTensor().storage().getWeakStorageImpl(), node});
  // The autograd engine sets its graph task while it runs backward nodes.
  if (torch::autograd::get_current_graph_task_id() != -1)
    node->add_tag("backward");
  else if (grad_at_start_ && !at::GradMode::is_enabled())
    node->add_tag("no_grad");  // Note [Nodes traced under no_grad]
  size_t k = 0;
  for (size_t r = 0; r < nret; ++r) {
    const c10::IValue& iv = stack[base + r];
    if (iv.isTensor()) {
      define(node->result(k++), iv.toTensor());
    } else if (iv.isTensorList()) {
      for (const at::Tensor& t : iv.toTensorVector()) define(node->result(k++), t);
    } else {
      ++k;
    }
  }
}

}  // namespace crucible::tracer::detail

// Note [Guarded equal]'s guard.
TORCH_LIBRARY_FRAGMENT(crucible, m) { m.def("assert_equal(Tensor self, Tensor other, bool expected) -> ()"); }
TORCH_LIBRARY_IMPL(crucible, CompositeExplicitAutograd, m) {
  m.impl("assert_equal", &crucible::tracer::detail::assert_equal);
}
// Meta tensors hold no values to compare (a fake-mode run of a graph that has the guard).
TORCH_LIBRARY_IMPL(crucible, Meta, m) {
  m.impl("assert_equal", [](const at::Tensor&, const at::Tensor&, bool) {});
}
