// The run-time plan's construction: see runtime/memory_plan.h.
#include "runtime/memory_plan.h"

#include <crucible/inductor/error.h>
#include <crucible/ir/aliasing.h>
#include <crucible/runtime/instruments.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace crucible::inductor::detail {

namespace {

// The bytes from a buffer's first element to its last, its offset included
// (the storage a fresh tensor of this layout gets).
int64_t span_bytes(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, int64_t offset,
                   c10::ScalarType dtype) {
  int64_t last = offset;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) return 0;
    last += (sizes[d] - 1) * strides[d];
  }
  return (last + 1) * static_cast<int64_t>(c10::elementSize(dtype));
}

int64_t span_bytes(const KernelArg& a) { return span_bytes(a.sizes, a.strides, 0, a.dtype); }

int64_t span_bytes(const ir::TensorMeta& m) { return span_bytes(m.sizes, m.strides, m.storage_offset, m.dtype); }

class Planner {
 public:
  Planner(Plan& p, const CompiledSchedule& s, int kernel_config, bool bind_kernels)
      : p_(p), s_(s), kernel_config_(kernel_config), bind_kernels_(bind_kernels) {}

  void plan() {
    const ir::Graph& g = *p_.graph;
    for (ir::Node* n : g.nodes()) {
      if (n->is_placeholder()) p_.input_slots.push_back(define(n->result()));
      if (n->is_constant()) constants_[n->result()] = &n->constant_value();
    }
    for (const auto& step : s_.steps) {
      if (step.extern_node)
        plan_extern(step.extern_node);
      else
        plan_kernel(s_.kernels[step.kernel]);
    }
    for (const ir::Argument& a : g.output_node()->args()) {
      if (!a.is_value() || !a.value()->is_tensor())
        throw InductorError("inductor: the graph returns a non-tensor; a CompiledFn returns tensors only");
      p_.outputs.push_back(source(a.value(), kNone));
    }
    for (auto& [slot, step] : last_)
      if (step != kNone) p_.steps[step].dead.push_back(slot);
    for (Step& st : p_.steps) std::sort(st.dead.begin(), st.dead.end());
    plan_reuse();
  }

 private:
  // Note [Buffer reuse]
  // Memory planning, as TorchInductor's wrapper reuses a freed buffer for a
  // new one of the same size: a generated kernel's output takes the memory
  // of a buffer that an earlier generated kernel wrote and whose last reader
  // has run, when the two span the same bytes. The dead buffer then stays in
  // its slot until the kernel that reuses it runs (instead of being cleared
  // after its last reader), which hands its storage to the new tensor. A
  // buffer another tensor still holds at run time (a view an extern kernel
  // returned, a collective in flight) is not taken: the kernel allocates as
  // before. A call makes fewer allocator calls; the peak can grow by a dead
  // buffer held from its last reader to the kernel that takes it (ResNet-18's
  // step on an H100: 1663 to 1669 MiB; GPT-2 small's unchanged).
  void plan_reuse() {
    std::unordered_map<uint32_t, int64_t> written_bytes;      // slot -> bytes, of kernel outputs
    std::unordered_map<int64_t, std::vector<uint32_t>> dead;  // bytes -> buffers free to take
    std::unordered_set<uint32_t> taken;
    for (Step& st : p_.steps) {
      for (KernelArg& a : st.kernel_args) {
        if (!a.written || a.slot == kNone) continue;
        const int64_t bytes = span_bytes(a);
        if (auto it = dead.find(bytes); bytes > 0 && it != dead.end() && !it->second.empty()) {
          a.reuse = it->second.back();
          it->second.pop_back();
          taken.insert(a.reuse);
        }
        written_bytes.emplace(a.slot, bytes);
      }
      for (uint32_t d : st.dead)
        if (auto it = written_bytes.find(d); it != written_bytes.end()) dead[it->second].push_back(d);
    }
    for (Step& st : p_.steps) std::erase_if(st.dead, [&](uint32_t d) { return taken.contains(d); });
    if (!taken.empty()) runtime::default_counters().add("inductor", "buffer_reuse", static_cast<int64_t>(taken.size()));
  }

  uint32_t define(const ir::Value* v) {
    auto slot = static_cast<uint32_t>(p_.num_slots++);
    slots_[v] = slot;
    return slot;
  }

  // A read of `v` by step `step` (kNone: the graph's output).
  Source source(const ir::Value* v, uint32_t step) {
    if (auto c = constants_.find(v); c != constants_.end()) return Source{Source::Constant, kNone, c->second, {}};
    auto it = slots_.find(v);
    if (it == slots_.end()) throw InductorError("inductor: %" + v->name() + " is read before it is defined");
    last_[it->second] = step;
    return Source{Source::Slot, it->second, nullptr, {}};
  }

  void plan_extern(const ir::Node* n) {
    auto step_index = static_cast<uint32_t>(p_.steps.size());
    Step st;
    st.node = n;
    st.op = n->op();
    st.host = host_arith_of(*n);
    const auto& formals = n->schema().arguments();
    for (size_t i = 0; i < n->args().size(); ++i) {
      const ir::Argument& a = n->args()[i];
      if (a.is_constant()) {
        st.args.push_back(Source{Source::Constant, kNone, &a.constant(), {}});
      } else if (a.is_value()) {
        st.args.push_back(source(a.value(), step_index));
      } else {
        auto list = formals.at(i).type()->cast<c10::ListType>();
        auto elem = list ? list->getElementType() : nullptr;
        Source s;
        if (elem && elem->kind() == c10::TypeKind::TensorType)
          s.kind = Source::TensorList;
        else if (elem && elem->kind() == c10::TypeKind::OptionalType)
          s.kind = Source::OptionalTensorList;
        else
          throw InductorError("inductor: unsupported list argument of " + n->target());
        for (const ir::Value* v : a.value_list())
          s.elements.push_back(v ? source(v, step_index) : Source{Source::Constant, kNone, &none_, {}});
        st.args.push_back(std::move(s));
      }
    }
    size_t next = 0;
    const auto& rets = n->schema().returns();
    for (const auto& r : rets) {
      auto list = r.type()->cast<c10::ListType>();
      bool is_list = list && list->getElementType()->kind() == c10::TypeKind::TensorType;
      std::vector<uint32_t> slots;
      size_t count = is_list ? n->num_results() - (rets.size() - 1) : 1;
      for (size_t j = 0; j < count; ++j) slots.push_back(define(n->result(next++)));
      st.returns.push_back(std::move(slots));
      st.list_return.push_back(is_list);
    }
    p_.steps.push_back(std::move(st));
  }

  void plan_kernel(const KernelPlan& k) {
    auto step_index = static_cast<uint32_t>(p_.steps.size());
    Step st;
    st.kernel_name = k.name;
    st.fuses = k.fuses;
    st.launch = k.launch;
    if (!bind_kernels_) {
      // Planned for its memory alone: no kernel to look up.
    } else if (p_.cuda) {
      st.cuda_kernel = p_.cuda->kernel(k.name);
      bool in_place = false;  // not run twice: a second run would read what the first wrote
      for (const KernelOperand& o : k.operands) in_place = in_place || (o.written && o.input);
      if (k.configs.size() > 1 && !in_place) {
        for (const KernelConfig& c : k.configs) st.configs.push_back({p_.cuda->kernel(c.name), c.name, c.launch});
        st.tuning_key = k.tuning_key;
        st.chosen = std::make_unique<std::atomic<int>>(-1);
        if (kernel_config_ >= 0)
          st.chosen->store(std::min<int>(kernel_config_, static_cast<int>(k.configs.size()) - 1));
      }
    } else {
      st.fn = reinterpret_cast<KernelFn>(symbol(p_.library, k.name));
    }
    st.kernel_args.resize(k.operands.size());
    // Reads first: a kernel never reads a slot it defines.
    for (int pass = 0; pass < 2; ++pass)
      for (size_t i = 0; i < k.operands.size(); ++i) {
        const KernelOperand& o = k.operands[i];
        if (o.written != (pass == 1)) continue;
        KernelArg& a = st.kernel_args[i];
        a.written = o.written;
        a.sizes = o.sizes;
        a.strides = o.strides;
        a.dtype = o.dtype;
        a.host_scalar = o.host_scalar;
        if (a.written && !o.input)
          a.slot = define(o.value);
        else
          a.source = source(o.value, step_index);  // read, or written in place
      }
    p_.steps.push_back(std::move(st));
  }

  Plan& p_;
  const CompiledSchedule& s_;
  const int kernel_config_;  // InductorOptions::kernel_config
  const bool bind_kernels_;
  std::unordered_map<const ir::Value*, uint32_t> slots_;
  std::unordered_map<const ir::Value*, const c10::IValue*> constants_;
  std::unordered_map<uint32_t, uint32_t> last_;
  static inline const c10::IValue none_{};
};

}  // namespace

void make_plan(Plan& plan, const CompiledSchedule& s, int kernel_config, bool bind_kernels) {
  Planner(plan, s, kernel_config, bind_kernels).plan();
}

// Note [Planned memory]
// A call of the plan, replayed on its metadata: every slot points at a
// storage; a storage holds its bytes from the step that allocates it until
// no slot points at it. The inputs' and the graph's constants' storages are
// the caller's and hold nothing here. An extern kernel's result shares the
// storage of the argument its schema aliases (ir::aliased_argument: views,
// in-place ops' results) and otherwise allocates the span its metadata
// reaches; a generated kernel's output allocates its span, or takes over a
// dead buffer's storage where Note [Buffer reuse] planned it and nothing
// else holds that storage (the runtime's test), and its outputs written in
// place allocate nothing; a split reduction's workspace lives during its
// kernel. A step's allocations come before its dead slots are cleared, so
// the peak is the most held during any step, as a caching allocator's
// max_memory_allocated sees it. torch/_inductor/memory.py estimates the
// same from its scheduler's buffers.
runtime::PlannedMemory planned_memory(const Plan& plan) {
  runtime::PlannedMemory m;
  m.steps = plan.steps.size();
  // A GPU's caching allocator hands out blocks in multiples of 512 bytes.
  const int64_t round = plan.device.is_cuda() ? 512 : 1;
  auto rounded = [round](int64_t bytes) { return (bytes + round - 1) / round * round; };
  struct Storage {
    int64_t bytes = 0;
    size_t slots = 0;
  };
  std::vector<Storage> storages;
  std::vector<int64_t> storage_of(plan.num_slots, -1);  // -1: no storage (a non-tensor), or the caller's
  int64_t held = 0;
  auto point = [&](uint32_t slot, int64_t storage) {
    storage_of[slot] = storage;
    if (storage >= 0) ++storages[static_cast<size_t>(storage)].slots;
  };
  auto allocate = [&](uint32_t slot, int64_t bytes) {
    storages.push_back({rounded(bytes), 0});
    held += storages.back().bytes;
    m.allocated_bytes += storages.back().bytes;
    ++m.buffers;
    point(slot, static_cast<int64_t>(storages.size()) - 1);
  };
  auto clear = [&](uint32_t slot) {
    const int64_t storage = std::exchange(storage_of[slot], -1);
    if (storage >= 0 && --storages[static_cast<size_t>(storage)].slots == 0)
      held -= storages[static_cast<size_t>(storage)].bytes;
  };
  auto slot_of = [](const Source& s) { return s.kind == Source::Slot ? s.slot : kNone; };

  const std::vector<ir::Value*> inputs = plan.graph->placeholders();
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i]->is_tensor() && inputs[i]->has_meta()) m.input_bytes += span_bytes(inputs[i]->meta());
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const Step& st = plan.steps[i];
    int64_t transient = 0;
    if (st.node) {
      size_t result = 0;
      for (const std::vector<uint32_t>& slots : st.returns)
        for (uint32_t slot : slots) {
          const ir::Value* v = st.node->result(result++);
          if (!v->is_tensor() || !v->has_meta()) continue;
          // The argument it aliases, by position in the node's arguments.
          uint32_t shared = kNone;
          if (const ir::Value* a = ir::aliased_argument(*v))
            for (size_t j = 0; j < st.node->args().size() && shared == kNone; ++j) {
              const ir::Argument& arg = st.node->args()[j];
              if (arg.is_value() && arg.value() == a) shared = slot_of(st.args[j]);
              if (arg.is_value_list())
                for (size_t e = 0; e < arg.value_list().size(); ++e)
                  if (arg.value_list()[e] == a) shared = slot_of(st.args[j].elements[e]);
            }
          if (ir::aliased_argument(*v))
            point(slot, shared == kNone ? -1 : storage_of[shared]);
          else
            allocate(slot, span_bytes(v->meta()));
        }
    } else {
      for (const KernelArg& a : st.kernel_args) {
        if (!a.written || a.slot == kNone) continue;
        const int64_t dead = a.reuse == kNone ? -1 : storage_of[a.reuse];
        if (dead >= 0 && storages[static_cast<size_t>(dead)].slots == 1) {
          storage_of[a.reuse] = -1;
          storage_of[a.slot] = dead;
          ++m.reused;
          continue;
        }
        if (a.reuse != kNone) clear(a.reuse);
        allocate(a.slot, span_bytes(a));
      }
      if (st.launch.arrivals > 0)
        transient = rounded(st.launch.partial_bytes) + rounded(st.launch.arrivals * static_cast<int64_t>(sizeof(int)));
    }
    if (held + transient > m.peak_bytes) {
      m.peak_bytes = held + transient;
      m.peak_step = i;
      m.peak_at = st.node ? st.node->target() : st.kernel_name;
    }
    for (uint32_t d : st.dead) clear(d);
  }
  m.output_bytes = held;
  return m;
}

}  // namespace crucible::inductor::detail
