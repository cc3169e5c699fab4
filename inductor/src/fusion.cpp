#include "fusion.h"

#include <crucible/ir/tensor_meta.h>

#include <c10/core/Scalar.h>

#include <cstdio>
#include <functional>
#include <unordered_map>
#include <unordered_set>

namespace crucible::inductor::detail {

// Note [Pointwise lowering]
// Each entry says which arguments of an ATen op are the tensor operands and
// how one element of the result is computed from one element of each, as a
// C++ expression over the operands' names and the op's constant scalars
// (torch/_inductor/lowering.py registers the same ops through
// make_pointwise). An op is lowered only when its operands allow a flat loop:
// one floating dtype (f32 or f64) for operands and result, a contiguous
// result on the CPU, and operands that are contiguous of the result's size
// or 0-dim (read at element 0: the broadcast of a scalar tensor). Anything
// else, including a scalar that is a graph Value rather than a constant,
// stays an extern kernel: the table only ever widens what is fused, never
// what the backend accepts. New ops are one entry each.
namespace {

using Expr = std::function<std::string(const std::vector<std::string>& x, const ir::Node* n)>;

struct Lowering {
  std::vector<size_t> tensor_args;  // argument positions of tensor operands, in x's order
  std::vector<size_t> scalar_args;  // argument positions that must be numeric constants
  Expr expr;
};

std::string literal(const c10::IValue& v) {
  double d = v.isDouble() ? v.toDouble() : v.isInt() ? static_cast<double>(v.toInt()) : v.toScalar().toDouble();
  char buf[64];
  std::snprintf(buf, sizeof buf, "T(%.17g)", d);
  return buf;
}

bool is_one(const c10::IValue& v) {
  if (v.isInt()) return v.toInt() == 1;
  if (v.isDouble()) return v.toDouble() == 1.0;
  return v.isScalar() && v.toScalar().isIntegral(false) && v.toScalar().toLong() == 1;
}

std::string scaled(const ir::Node* n, size_t alpha_arg, const std::string& x) {
  const c10::IValue& a = n->arg(alpha_arg).constant();
  return is_one(a) ? x : "(" + literal(a) + " * " + x + ")";
}

Expr unary(std::string f) {
  return [f](const std::vector<std::string>& x, const ir::Node*) { return f + "(" + x[0] + ")"; };
}

const std::unordered_map<std::string, Lowering>& table() {
  static const std::unordered_map<std::string, Lowering> t = {
      {"aten::add.Tensor",
       {{0, 1}, {2}, [](auto& x, auto n) { return "(" + x[0] + " + " + scaled(n, 2, x[1]) + ")"; }}},
      {"aten::sub.Tensor",
       {{0, 1}, {2}, [](auto& x, auto n) { return "(" + x[0] + " - " + scaled(n, 2, x[1]) + ")"; }}},
      {"aten::mul.Tensor", {{0, 1}, {}, [](auto& x, auto) { return "(" + x[0] + " * " + x[1] + ")"; }}},
      {"aten::div.Tensor", {{0, 1}, {}, [](auto& x, auto) { return "(" + x[0] + " / " + x[1] + ")"; }}},
      {"aten::add.Scalar",
       {{0},
        {1, 2},
        [](auto& x, auto n) { return "(" + x[0] + " + " + scaled(n, 2, literal(n->arg(1).constant())) + ")"; }}},
      {"aten::sub.Scalar",
       {{0},
        {1, 2},
        [](auto& x, auto n) { return "(" + x[0] + " - " + scaled(n, 2, literal(n->arg(1).constant())) + ")"; }}},
      {"aten::mul.Scalar",
       {{0}, {1}, [](auto& x, auto n) { return "(" + x[0] + " * " + literal(n->arg(1).constant()) + ")"; }}},
      {"aten::div.Scalar",
       {{0}, {1}, [](auto& x, auto n) { return "(" + x[0] + " / " + literal(n->arg(1).constant()) + ")"; }}},
      {"aten::neg", {{0}, {}, [](auto& x, auto) { return "(-" + x[0] + ")"; }}},
      // NaN < 0 is false, so relu(NaN) is NaN as in ATen's clamp_min.
      {"aten::relu", {{0}, {}, [](auto& x, auto) { return "(" + x[0] + " < T(0) ? T(0) : " + x[0] + ")"; }}},
      {"aten::exp", {{0}, {}, unary("std::exp")}},
      {"aten::log", {{0}, {}, unary("std::log")}},
      {"aten::sqrt", {{0}, {}, unary("std::sqrt")}},
      {"aten::tanh", {{0}, {}, unary("std::tanh")}},
      {"aten::sin", {{0}, {}, unary("std::sin")}},
      {"aten::cos", {{0}, {}, unary("std::cos")}},
      {"aten::abs", {{0}, {}, unary("std::abs")}},
      {"aten::rsqrt", {{0}, {}, [](auto& x, auto) { return "(T(1) / std::sqrt(" + x[0] + "))"; }}},
      {"aten::reciprocal", {{0}, {}, [](auto& x, auto) { return "(T(1) / " + x[0] + ")"; }}},
      {"aten::sigmoid", {{0}, {}, [](auto& x, auto) { return "(T(1) / (T(1) + std::exp(-" + x[0] + ")))"; }}},
      {"aten::pow.Tensor_Scalar",
       {{0},
        {1},
        [](auto& x, auto n) {
          const c10::IValue& e = n->arg(1).constant();
          bool two = (e.isInt() && e.toInt() == 2) || (e.isDouble() && e.toDouble() == 2.0);
          return two ? "(" + x[0] + " * " + x[0] + ")" : "std::pow(" + x[0] + ", " + literal(e) + ")";
        }}},
      // threshold_backward(grad_output, self, threshold): relu's backward.
      {"aten::threshold_backward",
       {{0, 1},
        {2},
        [](auto& x, auto n) {
          return "(" + x[1] + " <= " + literal(n->arg(2).constant()) + " ? T(0) : " + x[0] + ")";
        }}},
      {"aten::sigmoid_backward",
       {{0, 1}, {}, [](auto& x, auto) { return "(" + x[0] + " * (T(1) - " + x[1] + ") * " + x[1] + ")"; }}},
      {"aten::tanh_backward",
       {{0, 1}, {}, [](auto& x, auto) { return "(" + x[0] + " * (T(1) - " + x[1] + " * " + x[1] + "))"; }}},
  };
  return t;
}

bool numeric_constant(const ir::Argument& a) {
  if (!a.is_constant()) return false;
  const c10::IValue& v = a.constant();
  if (v.isInt() || v.isDouble()) return true;
  return v.isScalar() && (v.toScalar().isFloatingPoint() || v.toScalar().isIntegral(false));
}

}  // namespace

bool is_lowerable(const ir::Node* n) {
  if (!n->is_call() || n->num_results() != 1) return false;
  auto it = table().find(n->target());
  if (it == table().end()) return false;
  const ir::Value* out = n->result();
  if (!out->is_tensor() || !out->has_meta()) return false;
  const ir::TensorMeta& m = out->meta();
  if ((m.dtype != c10::kFloat && m.dtype != c10::kDouble) || !m.device.is_cpu() || !m.is_contiguous() ||
      m.storage_offset != 0)
    return false;
  for (size_t i : it->second.scalar_args)
    if (i >= n->args().size() || !numeric_constant(n->arg(i))) return false;
  for (size_t i : it->second.tensor_args) {
    if (i >= n->args().size() || !n->arg(i).is_value()) return false;
    const ir::Value* v = n->arg(i).value();
    if (!v->is_tensor() || !v->has_meta()) return false;
    const ir::TensorMeta& a = v->meta();
    if (a.dtype != m.dtype || !a.device.is_cpu()) return false;
    bool same = a.sizes == m.sizes && a.is_contiguous();
    if (!same && !a.sizes.empty()) return false;
  }
  return true;
}

// Note [Fusing pointwise runs]
// A run of lowerable nodes that follow each other in graph order (constants
// and placeholders between them do not break it) and share the result's
// element count and dtype becomes one loop; an extern kernel, or a node of
// another size, ends the run. Because a run is contiguous in graph order the
// schedule stays topological and no extern kernel (with its side effects)
// moves. A Value made inside the run is written to memory only when someone
// outside the run reads it (a later node or the graph's outputs); the rest
// are registers of the loop body: this is vertical fusion and the
// elimination of internal buffers. Fusing across extern kernels (reordering)
// and reductions is not done.
Schedule schedule(const ir::Graph& graph) {
  Schedule s;
  Kernel* open = nullptr;
  auto close = [&] {
    if (!open) return;
    std::unordered_set<const ir::Node*> inside(open->nodes.begin(), open->nodes.end());
    std::unordered_set<const ir::Value*> made, seen;
    for (const ir::Node* n : open->nodes) {
      for (const ir::Value* v : n->inputs())
        if (!made.contains(v) && seen.insert(v).second) open->inputs.push_back(v);
      made.insert(n->result());
    }
    for (const ir::Node* n : open->nodes) {
      const ir::Value* r = n->result();
      for (const ir::Node* u : r->users())
        if (!inside.contains(u)) {
          open->outputs.push_back(r);
          break;
        }
    }
    open = nullptr;
  };
  for (const ir::Node* n : graph.nodes()) {
    if (!n->is_call()) continue;
    if (!is_lowerable(n)) {
      close();
      s.items.push_back({n, 0});
      continue;
    }
    const ir::TensorMeta& m = n->result()->meta();
    if (open && (open->numel != m.numel() || open->dtype != m.dtype)) close();
    if (!open) {
      s.kernels.push_back(Kernel{"kernel_" + std::to_string(s.kernels.size()), {}, {}, {}, m.numel(), m.dtype});
      open = &s.kernels.back();
      s.items.push_back({nullptr, s.kernels.size() - 1});
    }
    open->nodes.push_back(n);
  }
  close();
  return s;
}

namespace {

std::string c_name(const ir::Value* v, size_t index) {
  std::string s = "v" + std::to_string(index) + "_";
  for (char c : v->name()) s += (std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
  return s;
}

}  // namespace

std::string render_cpp(const Schedule& s, int threads) {
  if (s.kernels.empty()) return {};
  std::string out =
      "// Generated by crucible inductor: one loop per fused kernel, over raw\n"
      "// pointers (no ATen). in[i]/out[i] are contiguous buffers of n elements\n"
      "// (an input of one element is a broadcast scalar).\n"
      "#include <cmath>\n#include <cstdint>\n\n";
  for (const Kernel& k : s.kernels) {
    const char* T = k.dtype == c10::kDouble ? "double" : "float";
    std::unordered_map<const ir::Value*, std::string> names;
    size_t counter = 0;
    auto name_of = [&](const ir::Value* v) -> const std::string& {
      auto it = names.find(v);
      if (it == names.end()) it = names.emplace(v, c_name(v, counter++)).first;
      return it->second;
    };
    out += "// " + k.name + " fuses:";
    for (const ir::Node* n : k.nodes) out += " %" + n->result()->name() + " (" + n->target() + ")";
    out += "\nextern \"C\" void " + k.name + "(const void* const* in, void* const* out, int64_t n) {\n";
    out += "  using T = " + std::string(T) + ";\n";
    for (size_t i = 0; i < k.inputs.size(); ++i)
      out +=
          "  const T* __restrict in" + std::to_string(i) + " = static_cast<const T*>(in[" + std::to_string(i) + "]);\n";
    for (size_t i = 0; i < k.outputs.size(); ++i)
      out += "  T* __restrict out" + std::to_string(i) + " = static_cast<T*>(out[" + std::to_string(i) + "]);\n";
    out += "#pragma omp parallel for simd schedule(static) if (n >= 32768)" +
           (threads > 0 ? " num_threads(" + std::to_string(threads) + ")" : std::string()) + "\n";
    out += "  for (int64_t i = 0; i < n; ++i) {\n";
    for (size_t i = 0; i < k.inputs.size(); ++i) {
      const ir::Value* v = k.inputs[i];
      bool scalar = v->meta().sizes.empty() && k.numel != 1;
      out += "    const T " + name_of(v) + " = in" + std::to_string(i) + (scalar ? "[0]" : "[i]") + ";\n";
    }
    for (const ir::Node* n : k.nodes) {
      const Lowering& l = table().at(n->target());
      std::vector<std::string> x;
      for (size_t a : l.tensor_args) x.push_back(name_of(n->arg(a).value()));
      out += "    const T " + name_of(n->result()) + " = " + l.expr(x, n) + ";\n";
    }
    for (size_t i = 0; i < k.outputs.size(); ++i)
      out += "    out" + std::to_string(i) + "[i] = " + name_of(k.outputs[i]) + ";\n";
    out += "  }\n}\n\n";
  }
  return out;
}

}  // namespace crucible::inductor::detail
