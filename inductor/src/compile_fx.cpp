#include <crucible/inductor/compile_fx.h>
#include <crucible/inductor/error.h>

#include "codecache/cpp_builder.h"
#include "codecache/cuda_builder.h"
#include "codecache/graph_cache.h"
#include "codegen/codegen.h"
#include "fx_passes/fx_passes.h"
#include "runtime/cuda_graphs.h"
#include "runtime/host_arith.h"

#include <crucible/ir/graph.h>
#include <crucible/ir/interpreter.h>
#include <crucible/runtime/disk_cache.h>
#include <crucible/runtime/instruments.h>

#include <ATen/core/List.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/ScalarType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace crucible::inductor {

// Note [Run-time plan]
// compile_fx_inner turns the schedule into flat steps once; a call only
// indexes arrays. Every tensor the graph makes or takes has a slot (an
// IValue); a step is an extern kernel (a boxed dispatcher call, as the
// interpreter makes) or a generated kernel (raw pointers of its inputs, fresh
// contiguous outputs, one call into the loaded library). After each step the
// slots whose last reader it was are cleared, so a buffer lives from its
// producer to its last consumer. The graph is functional, and fused nodes are
// pure, so running steps in schedule order keeps every side effect where the
// graph put it (Note [Order of side effects]).
namespace {

constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();

struct Source {
  enum Kind : uint8_t { Slot, Constant, TensorList, OptionalTensorList } kind = Slot;
  uint32_t slot = kNone;
  const c10::IValue* constant = nullptr;
  std::vector<Source> elements;  // lists; a None element is a Constant of None
};

using KernelFn = void (*)(void* const*);

// One buffer of a generated kernel's signature: read from a slot (checked
// against the layout the code was generated for) or written into a fresh
// tensor of that layout.
struct KernelArg {
  bool written = false;
  bool host_scalar = false;  // a 0-dim CPU tensor passed to a CUDA kernel by value
  Source source;             // read
  uint32_t slot = kNone;     // written
  uint32_t reuse = kNone;    // written: a dead buffer whose memory it takes (Note [Buffer reuse])
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype = c10::kFloat;
};

struct Step {
  // Extern kernel.
  const ir::Node* node = nullptr;
  std::optional<c10::OperatorHandle> op;
  std::vector<Source> args;
  std::vector<std::vector<uint32_t>> returns;  // per schema return: one slot, or a Tensor[]'s slots
  std::vector<bool> list_return;
  std::optional<detail::HostArith> host;  // computed without the dispatcher (Note [Host arithmetic])
  // Generated kernel: a C++ function, or a CUDA kernel and its launch.
  KernelFn fn = nullptr;
  void* cuda_kernel = nullptr;
  detail::Launch launch;
  std::string kernel_name;
  // Note [Autotuning]: the configurations to choose from at the first run
  // (cuda_kernel and launch are the first), and the one chosen (-1: none yet).
  struct Config {
    void* kernel = nullptr;
    std::string name;
    detail::Launch launch;
  };
  std::vector<Config> configs;
  std::string tuning_key;
  std::unique_ptr<std::atomic<int>> chosen;
  std::string fuses;  // what the kernel computes (for the profile)
  std::vector<KernelArg> kernel_args;
  // Both: slots to clear after the step.
  std::vector<uint32_t> dead;
};

// Note [Per-step profile]
// With InductorOptions::profile, every call times each step (CUDA events
// around it on a GPU, read once the call's work is done; a steady clock on
// the CPU) and the plan prints, when the CompiledFn goes, the steps that
// took the most time over all calls: what a reader needs to see where a
// compiled graph spends its time (generated kernels against extern ones)
// without a profiler. Events and the wait at the end of each call slow the
// calls down: profiling is for looking, not for timing the whole. The first
// call is left out when later ones ran (as torch.profiler's warm-up): it
// loads modules and makes cuBLAS's and cuDNN's handles, workspaces and
// algorithm choices, which cost more than the GPT-2 step's lm-head matmuls
// themselves would over ten calls.
struct StepTime {
  double ms = 0;
  int64_t calls = 0;
};

struct Plan {
  ~Plan();
  std::shared_ptr<ir::Graph> graph;  // owns the nodes and constants steps point at
  c10::Device device = c10::kCPU;    // where generated kernels run
  detail::Library library;
  std::shared_ptr<detail::CudaLibrary> cuda;
  size_t num_slots = 0;
  std::vector<uint32_t> input_slots;
  std::vector<Step> steps;
  std::vector<Source> outputs;
  bool profile = false;
  std::vector<StepTime> times;   // per step, with profile
  std::vector<double> first_ms;  // per step, the first call's share of times (the warm-up)
  // Note [Autotuning]: choices by tuning key, and where they are kept.
  mutable std::mutex tuning_mutex;
  mutable std::unordered_map<std::string, int> tuned;
  std::string cache_dir;
  std::string tuning_device;  // CudaLibrary::identity(), found once
};

// The ATen ops a kernel's `fuses` text names ("%v (aten::op) ..."), each
// once, in order, without the namespace: "amax sub exp sum div".
std::string fused_ops(const std::string& fuses) {
  std::string ops;
  std::unordered_set<std::string> seen;
  for (size_t at = fuses.find("(aten::"); at != std::string::npos; at = fuses.find("(aten::", at + 1)) {
    const size_t end = fuses.find(')', at);
    if (end == std::string::npos) break;
    std::string op = fuses.substr(at + 7, end - at - 7);
    op = op.substr(0, op.find('.'));
    if (seen.insert(op).second) ops += (ops.empty() ? "" : " ") + op;
  }
  return ops;
}

Plan::~Plan() {
  if (!profile || times.empty() || times.front().calls == 0) return;
  const bool past_warmup = times.front().calls > 1;
  if (past_warmup)
    for (size_t i = 0; i < times.size(); ++i) {
      times[i].ms -= first_ms[i];
      --times[i].calls;
    }
  std::vector<size_t> order(steps.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return times[a].ms > times[b].ms; });
  double total = 0, generated = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    total += times[i].ms;
    if (!steps[i].node) generated += times[i].ms;
  }
  const double calls = static_cast<double>(times.front().calls);
  std::ostringstream os;
  os << std::fixed << std::setprecision(3) << "inductor profile (Note [Per-step profile]): " << steps.size()
     << " steps, " << times.front().calls << (past_warmup ? " calls after the first" : " call (the warm-up)") << ", "
     << total / calls << " ms a call, of which generated kernels " << generated / calls << " ms ("
     << std::setprecision(1) << 100 * generated / std::max(total, 1e-12) << "%)\n  ms/call   share  step\n";
  for (size_t k = 0; k < std::min<size_t>(order.size(), 30); ++k) {
    const Step& st = steps[order[k]];
    const std::string what =
        st.node ? "extern " + st.node->target() + (st.node->num_results() ? " -> %" + st.node->result(0)->name() : "")
                : st.kernel_name + ": " + st.fuses;
    os << std::setprecision(3) << std::setw(9) << times[order[k]].ms / calls << std::setprecision(1) << std::setw(7)
       << 100 * times[order[k]].ms / std::max(total, 1e-12) << "%  " << what.substr(0, 160) << "\n";
  }
  // The same time summed by what ran, as torch.profiler's key_averages: one
  // line per extern op, and one per kind of generated kernel, named by the
  // ops it fuses as TorchInductor names its kernels (a layer's softmax rows
  // are one kind across the layers).
  std::map<std::string, StepTime> by_target;
  for (size_t i = 0; i < steps.size(); ++i) {
    StepTime& t = by_target[steps[i].node ? "extern " + steps[i].node->target() : "fused " + fused_ops(steps[i].fuses)];
    t.ms += times[i].ms;
    t.calls += 1;
  }
  std::vector<std::pair<std::string, StepTime>> totals(by_target.begin(), by_target.end());
  std::sort(totals.begin(), totals.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  os << "  ms/call   share  steps  summed by op\n";
  for (size_t k = 0; k < std::min<size_t>(totals.size(), 25); ++k)
    os << std::setprecision(3) << std::setw(9) << totals[k].second.ms / calls << std::setprecision(1) << std::setw(7)
       << 100 * totals[k].second.ms / std::max(total, 1e-12) << "%" << std::setw(7) << totals[k].second.calls << "  "
       << totals[k].first.substr(0, 160) << "\n";
  std::cerr << os.str();
}

class Planner {
 public:
  Planner(Plan& p, const detail::CompiledSchedule& s, int kernel_config)
      : p_(p), s_(s), kernel_config_(kernel_config) {}

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

  // The bytes from a buffer's first element to its last (its storage).
  static int64_t span_bytes(const KernelArg& a) {
    int64_t last = 0;
    for (size_t d = 0; d < a.sizes.size(); ++d) {
      if (a.sizes[d] == 0) return 0;
      last += (a.sizes[d] - 1) * a.strides[d];
    }
    return (last + 1) * static_cast<int64_t>(c10::elementSize(a.dtype));
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
    st.host = detail::host_arith_of(*n);
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

  void plan_kernel(const detail::KernelPlan& k) {
    auto step_index = static_cast<uint32_t>(p_.steps.size());
    Step st;
    st.kernel_name = k.name;
    st.fuses = k.fuses;
    if (p_.cuda) {
      st.cuda_kernel = p_.cuda->kernel(k.name);
      st.launch = k.launch;
      bool in_place = false;  // not run twice: a second run would read what the first wrote
      for (const detail::KernelOperand& o : k.operands) in_place = in_place || (o.written && o.input);
      if (k.configs.size() > 1 && !in_place) {
        for (const detail::KernelConfig& c : k.configs)
          st.configs.push_back({p_.cuda->kernel(c.name), c.name, c.launch});
        st.tuning_key = k.tuning_key;
        st.chosen = std::make_unique<std::atomic<int>>(-1);
        if (kernel_config_ >= 0)
          st.chosen->store(std::min<int>(kernel_config_, static_cast<int>(k.configs.size()) - 1));
      }
    } else {
      st.fn = reinterpret_cast<KernelFn>(detail::symbol(p_.library, k.name));
    }
    st.kernel_args.resize(k.operands.size());
    // Reads first: a kernel never reads a slot it defines.
    for (int pass = 0; pass < 2; ++pass)
      for (size_t i = 0; i < k.operands.size(); ++i) {
        const detail::KernelOperand& o = k.operands[i];
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
  const detail::CompiledSchedule& s_;
  const int kernel_config_;  // InductorOptions::kernel_config
  std::unordered_map<const ir::Value*, uint32_t> slots_;
  std::unordered_map<const ir::Value*, const c10::IValue*> constants_;
  std::unordered_map<uint32_t, uint32_t> last_;
  static inline const c10::IValue none_{};
};

c10::IValue read(const Source& s, std::vector<c10::IValue>& slots) {
  switch (s.kind) {
    case Source::Slot:
      return slots[s.slot];
    case Source::Constant:
      return *s.constant;
    case Source::TensorList: {
      c10::List<at::Tensor> list;
      for (const Source& e : s.elements) list.push_back(read(e, slots).toTensor());
      return list;
    }
    case Source::OptionalTensorList: {
      c10::List<std::optional<at::Tensor>> list;
      for (const Source& e : s.elements) {
        c10::IValue v = read(e, slots);
        list.push_back(v.isNone() ? std::optional<at::Tensor>() : std::optional<at::Tensor>(v.toTensor()));
      }
      return list;
    }
  }
  return {};
}

// Note [Host arithmetic] in host_arith.cpp: false where an operand is not
// what the graph said (the step then runs through the dispatcher).
bool run_host_arith(const Step& st, std::vector<c10::IValue>& slots) {
  const detail::HostArith& h = *st.host;
  std::array<double, 2> x = h.constant;
  for (size_t i = 0; i < 2; ++i) {
    if (h.arg[i] < 0) continue;
    const Source& s = st.args[static_cast<size_t>(h.arg[i])];
    const c10::IValue& v = s.kind == Source::Slot ? slots[s.slot] : *s.constant;
    const std::optional<double> d = v.isTensor() ? detail::host_double(v.toTensor()) : std::nullopt;
    if (!d) return false;
    x[i] = *d;
  }
  slots[st.returns[0][0]] = detail::host_tensor(detail::evaluate(h, x[0], x[1]));
  return true;
}

void run_extern(const Step& st, std::vector<c10::IValue>& slots) {
  if (st.host && run_host_arith(st, slots)) return;
  torch::jit::Stack stack;
  stack.reserve(st.args.size());
  for (const Source& s : st.args) stack.push_back(read(s, slots));
  try {
    st.op->callBoxed(stack);
  } catch (const std::exception& e) {
    // A guard or an assert has no result to name.
    const std::string name =
        st.node->num_results() ? "%" + st.node->result(0)->name() + " (" + st.node->target() + ")" : st.node->target();
    throw InductorError("inductor: extern kernel " + name + " failed: " + e.what());
  }
  for (size_t r = 0; r < st.returns.size(); ++r) {
    if (st.list_return[r]) {
      c10::List<at::Tensor> list = std::move(stack[r]).toTensorList();
      for (size_t j = 0; j < st.returns[r].size(); ++j) slots[st.returns[r][j]] = list.get(j);
    } else {
      slots[st.returns[r][0]] = std::move(stack[r]);
    }
  }
}

bool same_layout(const at::Tensor& t, const KernelArg& a) {
  if (t.scalar_type() != a.dtype || t.sizes() != c10::IntArrayRef(a.sizes)) return false;
  for (size_t d = 0; d < a.sizes.size(); ++d)
    if (a.sizes[d] > 1 && t.stride(static_cast<int64_t>(d)) != a.strides[d]) return false;
  return true;
}

// Note [Autotuning] (cuda_codegen.cpp says what is rendered): the first
// run of a kernel rendered in several configurations times each on the
// run's own buffers, as torch/_inductor's CachingAutotuner benchmarks its
// configs at the first launch: every configuration is launched once to warm
// up, then kTimedLaunches times between two events, in kRounds rounds that
// take turns (a clock change then falls on all of them alike); the least
// mean wins. A configuration giving the same grid of the same kernel as an
// earlier one is not timed, nor one the driver refuses to launch. The
// kernels compute the same values, so running them again only overwrites
// the outputs; the chosen one runs last, so the call's results are those
// every later call gets. The choice is shared by the plan's identical
// kernels (one tuning key) and stored in the cache directory, keyed by the
// key and the device, so a new process takes it without timing (and
// computes the same bits as this one). While the stream captures a CUDA
// graph nothing can be timed: the first configuration runs, untuned (the
// warm-up call before a capture has tuned already).
constexpr int kRounds = 2;
constexpr int kTimedLaunches = 3;

std::string tuning_path(const Plan& plan, const Step& st) {
  return plan.cache_dir + "/t" + detail::cache_key(st.tuning_key + "\n" + plan.tuning_device) + ".tune";
}

int configuration(const Plan& plan, const Step& st, void* stream, void** args) {
  int chosen = st.chosen->load(std::memory_order_acquire);
  if (chosen >= 0) return chosen;
  if (plan.cuda->capturing(stream)) return 0;
  std::lock_guard<std::mutex> lock(plan.tuning_mutex);
  if ((chosen = st.chosen->load(std::memory_order_relaxed)) >= 0) return chosen;
  const int n = static_cast<int>(st.configs.size());
  runtime::Counters& counters = runtime::default_counters();
  const std::string path = tuning_path(plan, st);
  if (auto it = plan.tuned.find(st.tuning_key); it != plan.tuned.end()) {
    chosen = it->second;
  } else if (const std::string stored = runtime::read_file(path); !stored.empty()) {
    // "<choice> of <n>"; anything else (another format, a torn file) is timed again.
    int index = -1, of = -1;
    if (std::sscanf(stored.c_str(), "%d of %d", &index, &of) == 2 && of == n && index >= 0 && index < n) {
      chosen = index;
      counters.add("inductor", "autotune_cache_hit");
    }
  }
  if (chosen < 0) {
    const c10::Stream s = c10::impl::getDeviceGuardImpl(c10::kCUDA)->getStream(plan.device);
    std::vector<bool> timed(st.configs.size(), true);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < i; ++j)
        timed[i] = timed[i] && !(st.configs[j].kernel == st.configs[i].kernel &&
                                 plan.cuda->blocks(st.configs[j].launch) == plan.cuda->blocks(st.configs[i].launch));
    // A configuration the driver refuses (more registers or shared memory
    // than a block may have on this device) is left out; the first one is
    // what an untuned run launches, so its refusal stands.
    for (int i = 0; i < n; ++i) {
      if (!timed[i]) continue;
      try {
        plan.cuda->launch(st.configs[i].kernel, st.configs[i].name, st.configs[i].launch, stream, args);
      } catch (const InductorError&) {
        if (i == 0) throw;
        timed[i] = false;
      }
    }
    std::vector<c10::Event> events;
    events.reserve(2 * n * kRounds);
    for (int round = 0; round < kRounds; ++round)
      for (int i = 0; i < n; ++i) {
        if (!timed[i]) continue;
        events.emplace_back(c10::kCUDA, c10::EventFlag::BACKEND_DEFAULT);
        events.back().record(s);
        for (int k = 0; k < kTimedLaunches; ++k)
          plan.cuda->launch(st.configs[i].kernel, st.configs[i].name, st.configs[i].launch, stream, args);
        events.emplace_back(c10::kCUDA, c10::EventFlag::BACKEND_DEFAULT);
        events.back().record(s);
      }
    std::vector<double> ms(st.configs.size(), std::numeric_limits<double>::infinity());
    size_t e = 0;
    for (int round = 0; round < kRounds; ++round)
      for (int i = 0; i < n; ++i) {
        if (!timed[i]) continue;
        events[e + 1].synchronize();
        ms[i] = std::min(ms[i], events[e].elapsedTime(events[e + 1]));
        e += 2;
      }
    chosen = static_cast<int>(std::min_element(ms.begin(), ms.end()) - ms.begin());
    counters.add("inductor", "autotuned");
    try {
      detail::write_atomically(path, std::to_string(chosen) + " of " + std::to_string(n) + "\n");
    } catch (const InductorError& err) {  // the next process times it again
      TORCH_WARN_ONCE("inductor: an autotuning choice was not stored: ", err.what());
    }
  }
  plan.tuned.emplace(st.tuning_key, chosen);
  st.chosen->store(chosen, std::memory_order_release);
  return chosen;
}

// Note [Version counters of inputs written in place]
// A loop kernel that writes a graph input in place (Note [In-place
// write-backs]: an input mutation kept in the inference graph, an optimizer
// update) writes the caller's memory without the dispatcher, so nothing
// bumps the tensor's version counter as eager's in-place op does. Without
// the bump a tensor autograd saved before the call is read by a later
// backward as silently changed, where eager raises "modified by an inplace
// operation"; and an inference tensor would be written outside
// InferenceMode, which eager refuses. So each input a kernel writes is
// bumped before the kernel runs: bump_version() refuses an inference tensor
// outside InferenceMode with eager's message, before anything is written.
void run_kernel(const Plan& plan, const Step& st, std::vector<c10::IValue>& slots) {
  const at::TensorOptions device = at::TensorOptions().device(plan.device);
  std::vector<at::Tensor> keep;
  keep.reserve(st.kernel_args.size());
  std::vector<void*> ptrs(st.kernel_args.size());
  std::vector<uint64_t> scalars(plan.cuda ? st.kernel_args.size() : 0);  // host scalars' values (CUDA only)
  std::vector<std::pair<at::Tensor, at::Tensor>> write_back;             // (caller's tensor, the copy written)
  for (size_t i = 0; i < st.kernel_args.size(); ++i) {
    const KernelArg& a = st.kernel_args[i];
    if (a.written && a.slot != kNone) continue;
    at::Tensor t = read(a.source, slots).toTensor();
    if (a.host_scalar) {
      // A float64 step count or learning rate read as float or double
      // needs no dispatcher call (Note [Host arithmetic]).
      const std::optional<double> d = detail::host_double(t);
      if (d && a.dtype == c10::kFloat) {
        const auto f = static_cast<float>(*d);
        std::memcpy(&scalars[i], &f, sizeof f);
      } else if (d && a.dtype == c10::kDouble) {
        std::memcpy(&scalars[i], &*d, sizeof *d);
      } else {
        const at::Tensor v = t.to(at::kCPU, a.dtype);
        std::memcpy(&scalars[i], v.const_data_ptr(), v.element_size());
      }
      ptrs[i] = nullptr;
      continue;
    }
    // See Note [Version counters of inputs written in place].
    if (a.written) t.unsafeGetTensorImpl()->bump_version();
    // Guard the layout the kernel was generated for: a caller may pass a
    // tensor whose strides or dtype differ from the graph's metadata.
    if (!same_layout(t, a)) {
      if (t.sizes() != c10::IntArrayRef(a.sizes))
        throw InductorError("inductor: " + st.kernel_name + " expects an input of sizes " +
                            c10::str(c10::IntArrayRef(a.sizes)) + ", got " + c10::str(t.sizes()) +
                            "; the inputs differ from the compiled graph's");
      at::Tensor c = at::empty_strided(a.sizes, a.strides, device.dtype(a.dtype));
      c.copy_(t);
      if (a.written) write_back.emplace_back(t, c);  // an input written in place: copied back after
      t = std::move(c);
    }
    ptrs[i] = t.data_ptr();
    keep.push_back(std::move(t));
  }
  for (size_t i = 0; i < st.kernel_args.size(); ++i) {
    const KernelArg& a = st.kernel_args[i];
    if (!a.written || a.slot == kNone) continue;
    at::Tensor t;
    if (a.reuse != kNone) {  // Note [Buffer reuse]
      const at::Tensor dead = std::exchange(slots[a.reuse], c10::IValue()).toTensor();
      if (dead.use_count() == 1 && dead.storage().use_count() == 1)
        t = at::empty({0}, device.dtype(a.dtype)).set_(dead.storage(), 0, a.sizes, a.strides);
    }
    if (!t.defined()) t = at::empty_strided(a.sizes, a.strides, device.dtype(a.dtype));
    ptrs[i] = t.data_ptr();
    slots[a.slot] = std::move(t);
  }
  if (st.fn) {
    st.fn(ptrs.data());
  } else {
    // On the caller's current stream, after the extern kernels queued there.
    void* stream = c10::impl::getDeviceGuardImpl(c10::kCUDA)->getStream(plan.device).native_handle();
    std::vector<void*> args(ptrs.size());
    for (size_t i = 0; i < ptrs.size(); ++i)
      args[i] = st.kernel_args[i].host_scalar ? static_cast<void*>(&scalars[i]) : static_cast<void*>(&ptrs[i]);
    // A split column reduction's partials and zeroed arrival counts, made
    // on this stream (Note [Split column reductions] in cuda_codegen.cpp).
    std::array<void*, 2> workspace{};
    if (st.launch.arrivals > 0) {
      keep.push_back(at::empty({st.launch.partial_bytes}, device.dtype(at::kByte)));
      workspace[0] = keep.back().data_ptr();
      keep.push_back(at::zeros({st.launch.arrivals}, device.dtype(at::kInt)));
      workspace[1] = keep.back().data_ptr();
      args.push_back(&workspace[0]);
      args.push_back(&workspace[1]);
    }
    if (st.configs.empty()) {
      plan.cuda->launch(st.cuda_kernel, st.kernel_name, st.launch, stream, args.data());
    } else {
      const Step::Config& c = st.configs[static_cast<size_t>(configuration(plan, st, stream, args.data()))];
      plan.cuda->launch(c.kernel, c.name, c.launch, stream, args.data());
    }
  }
  for (auto& [caller, written] : write_back) caller.copy_(written);
}

// The graph compile_fx_inner lowers: a copy of the caller's, with the
// matmuls cuBLAS runs slowly padded (Note [Padding matmuls]) and the
// convolutions in cuDNN's fastest layout (Note [Channels-last convolutions]),
// its outputs in the caller's layouts (Note [Eager's strides at the outputs]).
ir::Graph prepared(const ir::Graph& graph, const InductorOptions& options) {
  ir::Graph g = graph.clone();
  detail::pad_mm(g);
  detail::channels_last_convolutions(g, options.force_layout_optimization);
  return g;
}

}  // namespace

GeneratedCode generate_code(const ir::Graph& graph) {
  const ir::Graph g = prepared(graph, {});  // outlives the schedule, which points into it
  detail::Schedule s = detail::compile_schedule(g, 0);
  return {std::move(s.source), s.program.device.is_cuda()};
}

std::string loop_ir(const ir::Graph& graph) {
  const ir::Graph g = prepared(graph, {});
  return detail::to_text(detail::compile_schedule(g, 0).program);
}

InductorOptions InductorOptions::from_environment() {
  InductorOptions o;
  auto on = [](const char* name) {
    const char* v = std::getenv(name);
    return v && *v && std::string_view(v) != "0";
  };
  o.profile = on("CRUCIBLE_INDUCTOR_PROFILE");
  o.print_generated_code = on("CRUCIBLE_INDUCTOR_PRINT_CODE");
  o.cuda_graphs = on("CRUCIBLE_INDUCTOR_CUDA_GRAPHS");
  if (const char* dir = std::getenv("CRUCIBLE_INDUCTOR_CACHE_DIR")) o.cache_dir = dir;
  if (const char* k = std::getenv("CRUCIBLE_INDUCTOR_KERNEL_CONFIG"); k && *k) o.kernel_config = std::atoi(k);
  o.force_layout_optimization = on("CRUCIBLE_INDUCTOR_FORCE_LAYOUT_OPT");
  return o;
}

std::vector<std::string> compile_cuda(const ir::Graph& graph, const std::string& arch, const InductorOptions& options) {
  const ir::Graph g = prepared(graph, options);
  detail::Schedule s = detail::compile_schedule(g, 0);
  if (s.source.empty() || !s.program.device.is_cuda()) return {};
  return detail::compile_cubins(s.source, arch, options);
}

ir::CompiledFn compile_fx_inner(const ir::Graph& graph, const std::vector<at::Tensor>& /*example_inputs*/,
                                const InductorOptions& options) {
  // With options.profile, the compile's own phases are printed too: where
  // a cold compile spends its seconds (Note [Per-step profile]).
  using Clock = std::chrono::steady_clock;
  const Clock::time_point started = Clock::now();
  std::vector<std::pair<const char*, double>> phases;
  auto phase_done = [&, last = started](const char* name) mutable {
    const Clock::time_point now = Clock::now();
    phases.emplace_back(name, std::chrono::duration<double, std::milli>(now - last).count());
    last = now;
  };
  auto plan = std::make_shared<Plan>();
  plan->graph = std::make_shared<ir::Graph>(prepared(graph, options));
  if (!plan->graph->output_node())
    throw InductorError("inductor: the graph has no output node; call Graph::set_output first");
  // See graph_cache.h; counted as torch/_inductor counts its FxGraphCache.
  runtime::Counters& counters = runtime::default_counters();
  const std::optional<std::string> key = detail::graph_cache_key(*plan->graph, options);
  std::optional<detail::CompiledSchedule> cached;
  try {
    if (key) cached = detail::load_schedule(*key, *plan->graph, options);
  } catch (const InductorError&) {  // an unusable cache directory
    if (!options.fallback_to_eager) throw;
    return ir::interpret(graph);
  }
  counters.add("inductor", !key ? "fxgraph_cache_bypass" : cached ? "fxgraph_cache_hit" : "fxgraph_cache_miss");
  phase_done("passes and graph cache lookup");
  detail::CompiledSchedule s;
  if (cached) {
    s = std::move(*cached);
  } else {
    try {
      s = detail::compiled_schedule(detail::compile_schedule(*plan->graph, options.threads));
    } catch (const std::exception& e) {
      // A node lowering did not expect (an argument of an unusual kind): the
      // graph is still valid, so it runs on the interpreter rather than fail.
      TORCH_WARN("inductor: lowering failed (", e.what(), "); this graph runs on the interpreter");
      return ir::interpret(graph);
    }
  }
  phase_done(cached ? "schedule (cached)" : "schedule (lowering, fusion, rendering)");
  const std::string& source = s.source;
  plan->device = s.device;
  if (options.print_generated_code && !source.empty()) std::cerr << source;
  try {
    if (!source.empty() && plan->device.is_cuda()) {
      if (!c10::impl::hasDeviceGuardImpl(c10::kCUDA))
        throw InductorError("inductor: the graph's tensors are on " + plan->device.str() +
                            ", but this LibTorch has no CUDA; generate_code and compile_cuda still work");
      c10::DeviceGuard guard(plan->device);
      const int index = plan->device.index() < 0 ? 0 : plan->device.index();
      const std::string arch = options.cuda_arch.empty() ? detail::device_arch(index) : options.cuda_arch;
      const std::vector<std::string> cubins = detail::compile_cubins(source, arch, options);
      phase_done("NVRTC (or its cache)");
      plan->cuda = std::make_shared<detail::CudaLibrary>(cubins, index);
      plan->cache_dir = detail::cache_dir(options);
      plan->tuning_device = plan->cuda->identity();
      phase_done("loading cubins");
    } else if (!source.empty()) {
      plan->library = detail::compile_and_load(source, options);
      phase_done("C++ compiler (or its cache) and dlopen");
    }
  } catch (const InductorError&) {
    if (!options.fallback_to_eager) throw;
    return ir::interpret(graph);
  }
  try {
    Planner(*plan, s, options.kernel_config).plan();
  } catch (const InductorError&) {
    return ir::interpret(graph);  // a graph the plan cannot express: the interpreter runs it, or names the fault
  }
  // Stored once it has built and planned: an entry always compiles. A
  // failed write costs the next process a compile, not this one its graph.
  if (key && !cached) {
    try {
      detail::store_schedule(*key, s, *plan->graph, options);
    } catch (const InductorError& e) {
      TORCH_WARN("inductor: the graph cache entry was not written: ", e.what());
    }
  }
  phase_done("run-time plan");
  plan->profile = options.profile;
  if (plan->profile) {
    plan->times.resize(plan->steps.size());
    plan->first_ms.resize(plan->steps.size());
    std::ostringstream os;
    os << std::fixed << std::setprecision(1) << "inductor compile "
       << std::chrono::duration<double, std::milli>(Clock::now() - started).count() << " ms:";
    for (size_t i = 0; i < phases.size(); ++i)
      os << (i ? "; " : " ") << phases[i].first << " " << phases[i].second << " ms";
    std::cerr << os.str() << "\n";
  }
  ir::CompiledFn fn = [plan](std::vector<at::Tensor>& inputs) {
    if (inputs.size() != plan->input_slots.size())
      throw InductorError("inductor: the compiled graph takes " + std::to_string(plan->input_slots.size()) +
                          " inputs, got " + std::to_string(inputs.size()));
    std::vector<c10::IValue> slots(plan->num_slots);
    for (size_t i = 0; i < inputs.size(); ++i) slots[plan->input_slots[i]] = std::move(inputs[i]);
    inputs.clear();
    std::optional<c10::DeviceGuard> guard;
    if (plan->cuda) guard.emplace(plan->device);
    const bool on_gpu = plan->device.is_cuda() && plan->profile;
    std::vector<c10::Event> events;  // a start and an end per step (profile on a GPU)
    for (size_t i = 0; i < plan->steps.size(); ++i) {
      const Step& st = plan->steps[i];
      const auto start = plan->profile ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
      if (on_gpu) {
        events.emplace_back(c10::kCUDA, c10::EventFlag::BACKEND_DEFAULT);
        events.back().record(c10::impl::getDeviceGuardImpl(c10::kCUDA)->getStream(plan->device));
      }
      if (st.fn || st.cuda_kernel)
        run_kernel(*plan, st, slots);
      else
        run_extern(st, slots);
      for (uint32_t d : st.dead) slots[d] = c10::IValue();
      if (on_gpu) {
        events.emplace_back(c10::kCUDA, c10::EventFlag::BACKEND_DEFAULT);
        events.back().record(c10::impl::getDeviceGuardImpl(c10::kCUDA)->getStream(plan->device));
      } else if (plan->profile) {
        plan->times[i].ms +=
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      }
    }
    if (plan->profile) {
      for (size_t i = 0; i < plan->steps.size(); ++i) {
        if (on_gpu) {
          events[2 * i + 1].synchronize();
          plan->times[i].ms += events[2 * i].elapsedTime(events[2 * i + 1]);
        }
        if (plan->times[i].calls++ == 0) plan->first_ms[i] = plan->times[i].ms;
      }
    }
    std::vector<at::Tensor> out;
    out.reserve(plan->outputs.size());
    for (const Source& s : plan->outputs) out.push_back(read(s, slots).toTensor());
    return out;
  };
  if (!options.cuda_graphs) return fn;
  // Note [CUDA graphs] in cuda_graphs.cpp.
  std::string blocker = options.profile ? std::string("profiling times each step apart")
                                        : detail::cuda_graph_blocker(*plan->graph, plan->device);
  if (!blocker.empty()) {
    TORCH_WARN("inductor: skipping CUDA graphs: ", blocker);
    return fn;
  }
  return detail::cudagraphify(std::move(fn), *plan->graph, plan->device);
}

}  // namespace crucible::inductor
