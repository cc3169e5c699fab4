#include <crucible/ir/error.h>
#include <crucible/ir/interpreter.h>

#include "describe.h"

#include <ATen/core/List.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/stack.h>
#include <c10/util/Exception.h>

#include <limits>
#include <optional>
#include <unordered_map>

namespace crucible::ir {

using detail::describe;

// Note [Interpreter plan]
// The constructor turns the graph into flat arrays so that run() does no
// string or map lookups and allocates only the value slots, one stack and the
// lists Tensor[] arguments need:
//  * every Value a placeholder or call produces gets a slot (an IValue) in a
//    per-run array; Values of constant nodes get none, their IValue is pushed
//    straight from the graph;
//  * each argument of each call is a Source: a slot, a constant, or a list of
//    sources (Tensor[] / Tensor?[]);
//  * the last read of every slot is marked `move`: the IValue moves onto the
//    kernel's stack (or into the output vector) and dies with it, which is how
//    a value is freed right after its last use. Results nobody reads are
//    dropped as soon as the kernel returns; unused inputs at the start.
// Constant tensors are shared by every run; an in-place op on one changes it
// for later runs, as it would change an FX GraphModule's attribute.

namespace {

constexpr uint32_t kNoSlot = std::numeric_limits<uint32_t>::max();

enum class SourceKind : uint8_t { Slot, Constant, None, TensorList, OptionalTensorList };

struct Source {
  SourceKind kind;
  bool move = false;                      // Slot: this read is the slot's last one
  uint32_t slot = kNoSlot;                // Slot
  const c10::IValue* constant = nullptr;  // Constant (owned by the graph)
  uint32_t begin = 0, end = 0;            // lists: element sources in Plan::elements
};

// One schema return: a single IValue into `slot`, or a Tensor[] unpacked into
// `count` consecutive entries of Plan::result_slots starting at `begin`.
struct Return {
  bool list = false;
  uint32_t slot = kNoSlot;
  uint32_t begin = 0, count = 0;
};

struct Step {
  const Node* node;
  c10::OperatorHandle op;
  uint32_t args_begin, args_end;        // in Plan::args
  uint32_t returns_begin, returns_end;  // in Plan::returns
  bool no_grad = false;                 // Note [Nodes traced under no_grad]
};

}  // namespace

struct Interpreter::Plan {
  size_t num_slots = 0;
  size_t max_args = 0;
  std::vector<uint32_t> input_slots;  // per placeholder; kNoSlot when unused
  std::vector<Step> steps;
  std::vector<Source> args;
  std::vector<Source> elements;  // list elements
  std::vector<Return> returns;
  std::vector<uint32_t> result_slots;
  std::vector<Source> outputs;

  class Builder;
};

class Interpreter::Plan::Builder {
 public:
  explicit Builder(Plan& p) : p_(p) {}

  void plan(const Graph& graph) {
    if (!graph.output_node()) throw IrError("interpreter: the graph has no output node; call Graph::set_output first");
    for (Node* n : graph.nodes()) {
      switch (n->kind()) {
        case NodeKind::Placeholder:
          p_.input_slots.push_back(define(n->result()));
          break;
        case NodeKind::Constant:
          constants_[n->result()] = &n->constant_value();
          break;
        case NodeKind::Call:
          plan_call(n);
          break;
        case NodeKind::Output:
          for (const Argument& a : n->args()) {
            if (!a.is_value()) throw IrError("interpreter: the output node holds a non-Value argument");
            Value* v = a.value();
            if (!v->is_tensor())
              throw IrError("interpreter: output %" + v->name() + " is a " + v->type()->str() +
                            ", but a CompiledFn returns tensors only; return a tensor instead");
            p_.outputs.push_back(source(v, n));
            note_read(p_.outputs.back(), {SourceRef::Output, p_.outputs.size() - 1});
          }
          break;
      }
    }
    // Mark the last read of every slot as a move (see Note [Interpreter plan]).
    for (auto& [slot, src] : last_read_) src_at(src).move = true;
  }

 private:
  // Where a Source lives: vectors grow while planning, so keep indices.
  struct SourceRef {
    enum { Arg, Element, Output } where;
    size_t index;
  };

  Source& src_at(SourceRef r) {
    switch (r.where) {
      case SourceRef::Arg:
        return p_.args[r.index];
      case SourceRef::Element:
        return p_.elements[r.index];
      case SourceRef::Output:
        return p_.outputs[r.index];
    }
    return p_.args[r.index];
  }

  uint32_t define(Value* v) {
    if (!v->has_users()) return kNoSlot;
    auto slot = static_cast<uint32_t>(p_.num_slots++);
    slots_[v] = slot;
    return slot;
  }

  // A Source reading `v` (for node `user`); records the read as the slot's
  // latest. The caller appends it to `where` at position `index`.
  Source source(Value* v, const Node* user) {
    if (auto c = constants_.find(v); c != constants_.end())
      return Source{SourceKind::Constant, false, kNoSlot, c->second};
    auto it = slots_.find(v);
    if (it == slots_.end())
      throw IrError(
          "interpreter: " + describe(user) + " reads %" + v->name() +
          " before it is defined (or from another graph); the graph is not in topological order, run verify()");
    return Source{SourceKind::Slot, false, it->second};
  }

  void note_read(const Source& s, SourceRef ref) {
    if (s.kind == SourceKind::Slot) last_read_[s.slot] = ref;
  }

  void plan_call(Node* n) {
    const auto& formals = n->schema().arguments();
    if (n->args().size() != formals.size())
      throw IrError("interpreter: " + describe(n) + " has " + std::to_string(n->args().size()) +
                    " arguments, its schema takes " + std::to_string(formals.size()) + "; run verify()");
    Step step{n, n->op(), static_cast<uint32_t>(p_.args.size()), 0, 0, 0, n->has_tag("no_grad")};
    for (size_t i = 0; i < n->args().size(); ++i) {
      const Argument& a = n->args()[i];
      if (a.is_constant()) {
        p_.args.push_back(Source{SourceKind::Constant, false, kNoSlot, &a.constant()});
      } else if (a.is_value()) {
        p_.args.push_back(source(a.value(), n));
        note_read(p_.args.back(), {SourceRef::Arg, p_.args.size() - 1});
      } else {
        p_.args.push_back(list_source(n, formals[i], a.value_list()));
      }
    }
    step.args_end = static_cast<uint32_t>(p_.args.size());
    p_.max_args = std::max(p_.max_args, n->args().size());

    step.returns_begin = static_cast<uint32_t>(p_.returns.size());
    size_t next_result = 0;
    const auto& rets = n->schema().returns();
    for (const auto& ret : rets) {
      Return r;
      auto list = ret.type()->cast<c10::ListType>();
      if (list && list->getElementType()->kind() == c10::TypeKind::TensorType) {
        // A Tensor[] return owns every result left over after the other returns.
        r.list = true;
        r.begin = static_cast<uint32_t>(p_.result_slots.size());
        r.count = static_cast<uint32_t>(n->num_results() - (rets.size() - 1));
        for (uint32_t j = 0; j < r.count; ++j) p_.result_slots.push_back(define(n->result(next_result++)));
      } else {
        if (next_result >= n->num_results())
          throw IrError("interpreter: " + describe(n) + " has fewer results than its schema returns; run verify()");
        r.slot = define(n->result(next_result++));
      }
      p_.returns.push_back(r);
    }
    if (next_result != n->num_results())
      throw IrError("interpreter: " + describe(n) + " has " + std::to_string(n->num_results()) +
                    " results, its schema returns " + std::to_string(next_result) + "; run verify()");
    step.returns_end = static_cast<uint32_t>(p_.returns.size());
    p_.steps.push_back(std::move(step));
  }

  Source list_source(const Node* n, const c10::Argument& formal, const Argument::ValueList& values) {
    auto list = formal.type()->cast<c10::ListType>();
    const c10::TypePtr elem = list ? list->getElementType() : nullptr;
    SourceKind kind;
    if (elem && elem->kind() == c10::TypeKind::TensorType) {
      kind = SourceKind::TensorList;
    } else if (elem && elem->kind() == c10::TypeKind::OptionalType &&
               elem->expectRef<c10::OptionalType>().getElementType()->kind() == c10::TypeKind::TensorType) {
      kind = SourceKind::OptionalTensorList;
    } else {
      throw IrError("interpreter: " + describe(n) + ": argument '" + formal.name() + "' has type " +
                    formal.type()->str() + ", which cannot take a list of Values (only Tensor[] and Tensor?[] can)");
    }
    Source s{kind};
    s.begin = static_cast<uint32_t>(p_.elements.size());
    for (Value* v : values) {
      if (!v) {
        if (kind == SourceKind::TensorList)
          throw IrError("interpreter: " + describe(n) + ": argument '" + formal.name() +
                        "' is Tensor[] but holds None");
        p_.elements.push_back(Source{SourceKind::None});
        continue;
      }
      p_.elements.push_back(source(v, n));
      note_read(p_.elements.back(), {SourceRef::Element, p_.elements.size() - 1});
    }
    s.end = static_cast<uint32_t>(p_.elements.size());
    return s;
  }

 private:
  Plan& p_;
  std::unordered_map<const Value*, uint32_t> slots_;
  std::unordered_map<const Value*, const c10::IValue*> constants_;
  std::unordered_map<uint32_t, SourceRef> last_read_;
};

namespace {

// Reads a slot or constant source: moves on the last read.
inline c10::IValue read(std::vector<c10::IValue>& slots, const Source& s) {
  if (s.kind == SourceKind::Constant) return *s.constant;
  if (s.kind == SourceKind::None) return {};
  return s.move ? std::move(slots[s.slot]) : slots[s.slot];
}

}  // namespace

Interpreter::Interpreter(const Graph& graph) : plan_(std::make_unique<Plan>()) { Plan::Builder(*plan_).plan(graph); }

Interpreter::~Interpreter() = default;
Interpreter::Interpreter(Interpreter&&) noexcept = default;
Interpreter& Interpreter::operator=(Interpreter&&) noexcept = default;

std::vector<at::Tensor> Interpreter::run(std::vector<at::Tensor>& inputs) const {
  const Plan& p = *plan_;
  if (inputs.size() != p.input_slots.size())
    throw IrError("interpreter: the graph takes " + std::to_string(p.input_slots.size()) +
                  " inputs (one per placeholder), got " + std::to_string(inputs.size()));
  std::vector<c10::IValue> slots(p.num_slots);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (p.input_slots[i] != kNoSlot) slots[p.input_slots[i]] = std::move(inputs[i]);
  inputs.clear();

  torch::jit::Stack stack;
  stack.reserve(p.max_args);
  for (const Step& step : p.steps) {
    for (uint32_t a = step.args_begin; a < step.args_end; ++a) {
      const Source& s = p.args[a];
      switch (s.kind) {
        case SourceKind::Slot:
        case SourceKind::Constant:
        case SourceKind::None:
          stack.push_back(read(slots, s));
          break;
        case SourceKind::TensorList: {
          c10::List<at::Tensor> list;
          list.reserve(s.end - s.begin);
          for (uint32_t e = s.begin; e < s.end; ++e) list.push_back(read(slots, p.elements[e]).toTensor());
          stack.emplace_back(std::move(list));
          break;
        }
        case SourceKind::OptionalTensorList: {
          c10::List<std::optional<at::Tensor>> list;
          list.reserve(s.end - s.begin);
          for (uint32_t e = s.begin; e < s.end; ++e) {
            const Source& el = p.elements[e];
            if (el.kind == SourceKind::None)
              list.push_back(std::nullopt);
            else
              list.push_back(read(slots, el).toTensor());
          }
          stack.emplace_back(std::move(list));
          break;
        }
      }
    }
    try {
      std::optional<at::NoGradGuard> no_grad;
      if (step.no_grad) no_grad.emplace();
      step.op.callBoxed(stack);
    } catch (const c10::Error& e) {
      throw IrError("interpreter: node " + describe(step.node) + " failed: " + e.what_without_backtrace());
    } catch (const std::exception& e) {
      throw IrError("interpreter: node " + describe(step.node) + " failed: " + e.what());
    }
    if (stack.size() != step.returns_end - step.returns_begin)
      throw IrError("interpreter: node " + describe(step.node) + " returned " + std::to_string(stack.size()) +
                    " values, its schema declares " + std::to_string(step.returns_end - step.returns_begin));
    for (uint32_t r = step.returns_begin, i = 0; r < step.returns_end; ++r, ++i) {
      const Return& ret = p.returns[r];
      if (!ret.list) {
        if (ret.slot != kNoSlot) slots[ret.slot] = std::move(stack[i]);
        continue;
      }
      c10::List<at::Tensor> list = std::move(stack[i]).toTensorList();
      if (list.size() != ret.count)
        throw IrError("interpreter: node " + describe(step.node) + " returned " + std::to_string(list.size()) +
                      " tensors, the graph has " + std::to_string(ret.count) +
                      " results for them; rebuild the node with the right list_size");
      for (uint32_t j = 0; j < ret.count; ++j)
        if (uint32_t slot = p.result_slots[ret.begin + j]; slot != kNoSlot) slots[slot] = list.extract(j);
    }
    stack.clear();
  }

  std::vector<at::Tensor> out;
  out.reserve(p.outputs.size());
  for (const Source& s : p.outputs) out.push_back(read(slots, s).toTensor());
  return out;
}

std::vector<at::Tensor> Interpreter::operator()(const std::vector<at::Tensor>& inputs) const {
  std::vector<at::Tensor> copy = inputs;
  return run(copy);
}

CompiledFn interpret(const Graph& graph, const std::vector<at::Tensor>& /*example_inputs*/) {
  // The graph and the interpreter planned over it live and die together.
  struct Compiled {
    Graph graph;
    std::optional<Interpreter> interpreter;
  };
  auto c = std::make_shared<Compiled>(Compiled{graph.clone(), std::nullopt});
  c->interpreter.emplace(c->graph);
  return [c](std::vector<at::Tensor>& inputs) { return c->interpreter->run(inputs); };
}

}  // namespace crucible::ir
