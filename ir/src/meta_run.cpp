#include "meta_run.h"

#include <crucible/ir/error.h>
#include <crucible/ir/meta_call.h>

#include "alias_annotations.h"
#include "describe.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/List.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <unordered_map>

namespace crucible::ir::detail {

// Note [Deriving metadata]
// A graph runs on meta tensors as the interpreter runs it on real ones:
// placeholders and tensor constants become meta tensors with their recorded
// sizes, strides, storage offset and dtype (over a storage just large enough),
// and each call runs its Meta kernel (or CPU stand-ins, Note [CPU stand-ins])
// on what the calls before it produced, so views share storage with their
// bases and in-place ops change their inputs, exactly as at run time. Non-tensor
// results (aten::sym_size's int) flow to the calls that read them.
// Meta tensors live on the meta device, so the runner keeps each tensor's
// device beside it, and device arguments reach the kernels as the meta
// device. A result gets, as FakeTensor gives it:
//  * the device of the argument the schema says it aliases (`Tensor(a!)
//    self -> Tensor(a!)`: copy_ into a CPU tensor from a GPU one);
//  * else the op's `device` argument where it has one and it is set (factory
//    functions, _to_copy);
//  * else the first device among the tensor arguments that is not the CPU,
//    else the CPU (a 0-dim CPU tensor may meet GPU tensors in one op).
// Kernels that give a GPU tensor other strides or dtypes than a CPU one
// (none among the zoo's ops) would need a GPU to derive.

namespace {

struct Slot {
  c10::IValue value;
  c10::Device device = c10::Device(c10::kCPU);  // tensors only
};

at::Tensor meta_tensor(const TensorMeta& m) {
  int64_t extent = m.numel() == 0 ? 0 : 1;
  if (extent)
    for (size_t d = 0; d < m.sizes.size(); ++d) extent += (m.sizes[d] - 1) * m.strides[d];
  return at::empty({m.storage_offset + extent}, at::TensorOptions().dtype(m.dtype).device(c10::kMeta))
      .as_strided(m.sizes, m.strides, m.storage_offset);
}

class MetaRunner {
 public:
  void define(const Value* v, const TensorMeta& meta) { slots_[v] = Slot{meta_tensor(meta), meta.device}; }
  void define_constant(const Node& n) {
    const c10::IValue& c = n.constant_value();
    if (c.isTensor())
      define(n.result(), TensorMeta::of(c.toTensor()));
    else
      slots_[n.result()] = Slot{c};
  }

  DerivedMetas call(const Node& n) {
    const auto& schema = n.schema();
    const auto& formals = schema.arguments();
    torch::jit::Stack stack;
    stack.reserve(formals.size());
    for (size_t i = 0; i < formals.size(); ++i) {
      const Argument& a = n.arg(i);
      if (a.is_value()) {
        stack.push_back(slot(n, a.value()).value);
      } else if (a.is_value_list()) {
        stack.push_back(list(n, formals[i], a.value_list()));
      } else if (a.constant().isDevice()) {
        stack.emplace_back(c10::Device(c10::kMeta));  // see Note [Deriving metadata]
      } else {
        stack.push_back(a.constant());
      }
    }
    try {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      call_on_meta(n.op(), stack);
    } catch (const c10::Error& e) {
      throw IrError("deriving metadata: node " + describe(&n) + " fails on meta tensors of its inputs' metadata (" +
                    inputs_text(n) + "): " + e.what_without_backtrace());
    }
    const auto& rets = schema.returns();
    if (stack.size() != rets.size())
      throw IrError("deriving metadata: node " + describe(&n) + " returned " + std::to_string(stack.size()) +
                    " values, its schema declares " + std::to_string(rets.size()));
    DerivedMetas derived;
    derived.reserve(n.num_results());
    size_t next = 0;
    for (size_t r = 0; r < rets.size(); ++r) {
      const c10::Device device = result_device(n, r);
      auto take = [&](c10::IValue v) {
        if (next >= n.num_results())
          throw IrError("deriving metadata: node " + describe(&n) + " returned more tensors than it has results");
        std::optional<TensorMeta> meta;
        if (v.isTensor() && v.toTensor().defined()) {
          meta = TensorMeta::of(v.toTensor());
          meta->device = device;
          meta->requires_grad = false;
        }
        slots_[n.result(next++)] = Slot{std::move(v), device};
        derived.push_back(std::move(meta));
      };
      if (is_tensor_list(rets[r].type())) {
        for (const at::Tensor& t : stack[r].toTensorVector()) take(t);
      } else {
        take(std::move(stack[r]));
      }
    }
    if (next != n.num_results())
      throw IrError("deriving metadata: node " + describe(&n) + " returned " + std::to_string(next) +
                    " results on meta tensors, the graph has " + std::to_string(n.num_results()));
    return derived;
  }

 private:
  const Slot& slot(const Node& user, const Value* v) const {
    auto it = slots_.find(v);
    if (it == slots_.end())
      throw IrError("deriving metadata: node " + describe(&user) + " reads %" + v->name() +
                    ", whose value is unknown (a non-tensor input, or a tensor without metadata)");
    return it->second;
  }

  c10::IValue list(const Node& n, const c10::Argument& formal, const Argument::ValueList& values) const {
    auto type = formal.type()->cast<c10::ListType>();
    if (type && type->getElementType()->kind() == c10::TypeKind::OptionalType) {
      c10::List<std::optional<at::Tensor>> l;
      for (const Value* v : values)
        l.push_back(v ? std::optional<at::Tensor>(slot(n, v).value.toTensor()) : std::nullopt);
      return l;
    }
    c10::List<at::Tensor> l;
    for (const Value* v : values) l.push_back(slot(n, v).value.toTensor());
    return l;
  }

  c10::Device device_of(const Node& user, const Value* v) const { return slot(user, v).device; }

  // See Note [Deriving metadata].
  c10::Device result_device(const Node& n, size_t ret) const {
    const auto& formals = n.schema().arguments();
    if (const c10::AliasInfo* alias = n.schema().returns()[ret].alias_info())
      for (size_t i = 0; i < formals.size(); ++i)
        if (formals[i].alias_info() && sets_overlap(*alias, *formals[i].alias_info()))
          for (const Value* v : n.arg(i).values()) return device_of(n, v);
    for (size_t i = 0; i < formals.size(); ++i)
      if (formals[i].name() == "device" && n.arg(i).is_constant() && n.arg(i).constant().isDevice())
        return n.arg(i).constant().toDevice();
    for (const Value* v : n.inputs())
      if (v->is_tensor())
        if (c10::Device d = device_of(n, v); !d.is_cpu()) return d;
    return c10::Device(c10::kCPU);
  }

  std::string inputs_text(const Node& n) const {
    std::string s;
    for (const Value* v : n.inputs()) {
      if (!v->is_tensor()) continue;
      auto it = slots_.find(v);
      if (it == slots_.end() || !it->second.value.isTensor() || !it->second.value.toTensor().defined()) continue;
      TensorMeta m = TensorMeta::of(it->second.value.toTensor());
      m.device = it->second.device;
      s += (s.empty() ? "%" : ", %") + v->name() + " : " + to_string(m);
    }
    return s.empty() ? "no tensor inputs" : s;
  }

  std::unordered_map<const Value*, Slot> slots_;
};

}  // namespace

void run_on_meta(const Graph& graph, const std::function<bool(const Node&, const DerivedMetas&)>& visit) {
  MetaRunner runner;
  for (const Node* n : graph.nodes()) {
    switch (n->kind()) {
      case NodeKind::Placeholder:
        if (!n->result()->has_meta())
          throw IrError("deriving metadata: placeholder %" + n->result()->name() +
                        " has no TensorMeta; every placeholder needs one");
        runner.define(n->result(), n->result()->meta());
        break;
      case NodeKind::Constant:
        runner.define_constant(*n);
        break;
      case NodeKind::Call:
        if (!visit(*n, runner.call(*n))) return;
        break;
      case NodeKind::Output:
        break;
    }
  }
}

DerivedMetas derive_meta(const Node& node) {
  MetaRunner runner;
  for (const Value* v : node.inputs()) {
    if (v->node()->is_constant()) {
      runner.define_constant(*v->node());
    } else if (v->has_meta()) {
      runner.define(v, v->meta());
    }
  }
  return runner.call(node);
}

}  // namespace crucible::ir::detail
