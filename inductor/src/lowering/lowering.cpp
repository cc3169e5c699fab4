#include "lowering/lowering.h"

#include <crucible/ir/effects.h>
#include <crucible/ir/tensor_meta.h>

#include <c10/core/Scalar.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <unordered_set>

namespace crucible::inductor::detail {

// Note [Lowering]
// Each graph node becomes one of four things (torch/_inductor/lowering.py
// and graph.py do the same with TensorBox/StorageBox):
//  - pointwise (the table below): a lazy function from an index to an
//    element, inlined into whatever reads it, or realized into a Computed
//    buffer written by a loop when the graph returns it, an extern kernel
//    reads it, or inlining would recompute too much;
//  - a reduction (sum, mean, amax, amin, var_mean): a loop over kept ×
//    reduced indices whose operand inlines its producers (the prologue);
//    its result is always a buffer;
//  - a view (view, reshape, expand, permute, transpose, slice, select,
//    split, squeeze, unsqueeze, ...): a change of index folded into the
//    readers' index expressions, never a copy; where an extern kernel or
//    the graph's outputs need the view as a tensor, the view op itself runs
//    on the realized base, so it aliases as it does in eager;
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

// ---- the pointwise table ----------------------------------------------------

struct Ctx {
  const std::vector<std::string>& x;
  const ir::Node* n;
  const std::string& T;            // the C++ type the formula is evaluated in
  const std::vector<Expr>& index;  // the element's index (ops that read it: arange)
};
using Render = std::function<std::string(const Ctx&)>;

struct PointwiseOp {
  PointwiseOp(std::vector<size_t> tensors, std::vector<size_t> scalars, Render r, bool in_operands = false,
              bool integers = false, std::vector<size_t> masks = {}, std::vector<size_t> unread = {},
              bool index = false)
      : tensor_args(std::move(tensors)),
        scalar_args(std::move(scalars)),
        render(std::move(r)),
        compute_in_operands(in_operands),
        integer_ok(integers),
        bool_args(std::move(masks)),
        unread_args(std::move(unread)),
        reads_index(index) {}
  std::vector<size_t> tensor_args;  // positions of tensor operands, in x's order
  std::vector<size_t> scalar_args;  // positions that must be numeric constants
  Render render;
  // The type the formula runs in: the result's (arithmetic, casts) or the
  // operands' common type (comparisons, whose result is bool).
  bool compute_in_operands = false;
  bool integer_ok = false;          // also lowered for i64/i32 (and bool where it makes sense)
  std::vector<size_t> bool_args;    // tensor operands read as bool masks, not cast
  std::vector<size_t> unread_args;  // tensors that only give the result's size and dtype (copy's self)
  bool reads_index = false;         // the value is a function of the element's index (arange; integers only)
};

std::string literal(const c10::IValue& v, const std::string& T) {
  // An integer constant in an integer loop is written as itself: through a
  // double, 2^53 + 1 would lose its last bit and INT64_MAX would round to
  // 2^63, which no int64_t holds (x86 converts it to INT64_MIN).
  const bool integral = v.isInt() || (v.isScalar() && v.toScalar().isIntegral(/*includeBool=*/false));
  if (integral && (T == "int64_t" || T == "int32_t")) {
    const int64_t i = v.isInt() ? v.toInt() : v.toScalar().toLong();
    // The literal 9223372036854775808 has no signed type: INT64_MIN as an expression.
    if (i == std::numeric_limits<int64_t>::min()) return T + "(-9223372036854775807LL - 1)";
    return T + "(" + std::to_string(i) + "LL)";
  }
  double d = v.isDouble() ? v.toDouble()
             : v.isInt()  ? static_cast<double>(v.toInt())
             : v.isBool() ? (v.toBool() ? 1.0 : 0.0)
                          : v.toScalar().toDouble();
  // A bool is whether the value is nonzero, as ATen converts: NaN and the
  // infinities are true (numeric_limits<bool>'s NaN and infinity are false).
  if (T == "bool") return d != 0 ? "true" : "false";
  if (std::isnan(d)) return "std::numeric_limits<" + T + ">::quiet_NaN()";
  if (std::isinf(d)) return std::string(d < 0 ? "-" : "") + "std::numeric_limits<" + T + ">::infinity()";
  char buf[80];
  if (T == "int64_t" || T == "int32_t")
    std::snprintf(buf, sizeof buf, "%s(%lld)", T.c_str(), static_cast<long long>(d));
  else
    std::snprintf(buf, sizeof buf, "%s(%.17g)", T.c_str(), d);
  return buf;
}

bool is_one(const c10::IValue& v) {
  if (v.isInt()) return v.toInt() == 1;
  if (v.isDouble()) return v.toDouble() == 1.0;
  return v.isScalar() && v.toScalar().isIntegral(false) && v.toScalar().toLong() == 1;
}

std::string lit(const Ctx& c, size_t arg) { return literal(c.n->arg(arg).constant(), c.T); }

std::string scaled(const Ctx& c, size_t alpha_arg, const std::string& x) {
  const c10::IValue& a = c.n->arg(alpha_arg).constant();
  return is_one(a) ? x : "(" + literal(a, c.T) + " * " + x + ")";
}

Render unary(std::string f) {
  return [f](const Ctx& c) { return f + "(" + c.x[0] + ")"; };
}

Render binary(std::string op) {
  return [op](const Ctx& c) { return "(" + c.x[0] + " " + op + " " + c.x[1] + ")"; };
}

Render binary_scalar(std::string op) {
  return [op](const Ctx& c) { return "(" + c.x[0] + " " + op + " " + lit(c, 1) + ")"; };
}

// A comparison with a scalar: ATen converts the scalar to the tensor's
// dtype first, so a half or bf16 tensor is compared with the rounded
// scalar (x == 0.1 holds where x holds 0.1 rounded), not with the float
// the formula computes in.
Render compare_scalar(std::string op) {
  return [op](const Ctx& c) {
    const c10::ScalarType dt = c.n->arg(0).value()->meta().dtype;
    const c10::IValue& v = c.n->arg(1).constant();
    if (!reduced_precision(dt) || v.isBool()) return "(" + c.x[0] + " " + op + " " + lit(c, 1) + ")";
    const float d = static_cast<float>(v.toScalar().toDouble());
    const float rounded = dt == c10::kHalf ? static_cast<float>(c10::Half(d)) : static_cast<float>(c10::BFloat16(d));
    return "(" + c.x[0] + " " + op + " " + literal(c10::IValue(static_cast<double>(rounded)), c.T) + ")";
  };
}

// a / b as the preludes define it (Note [Division]).
std::string divide(const std::string& a, const std::string& b) { return "crucible_div(" + a + ", " + b + ")"; }

Render identity() {
  return [](const Ctx& c) { return c.x[0]; };
}

Render fill(size_t arg) {
  return [arg](const Ctx& c) { return lit(c, arg); };
}

const std::unordered_map<std::string, PointwiseOp>& table() {
  // NaN-propagating max/min, as ATen's maximum/minimum.
  auto extremum = [](const char* cmp) {
    return [cmp](const Ctx& c) {
      const std::string &a = c.x[0], &b = c.x[1];
      return "(" + a + " != " + a + " ? " + a + " : " + b + " != " + b + " ? " + b + " : " + a + " " + cmp + " " + b +
             " ? " + a + " : " + b + ")";
    };
  };
  static const std::unordered_map<std::string, PointwiseOp> t = {
      {"aten::add.Tensor",
       {{0, 1}, {2}, [](const Ctx& c) { return "(" + c.x[0] + " + " + scaled(c, 2, c.x[1]) + ")"; }, false, true}},
      {"aten::sub.Tensor",
       {{0, 1}, {2}, [](const Ctx& c) { return "(" + c.x[0] + " - " + scaled(c, 2, c.x[1]) + ")"; }, false, true}},
      {"aten::rsub.Tensor",
       {{0, 1}, {2}, [](const Ctx& c) { return "(" + c.x[1] + " - " + scaled(c, 2, c.x[0]) + ")"; }, false, true}},
      {"aten::mul.Tensor", {{0, 1}, {}, binary("*"), false, true}},
      {"aten::div.Tensor", {{0, 1}, {}, [](const Ctx& c) { return divide(c.x[0], c.x[1]); }}},
      {"aten::add.Scalar",
       {{0}, {1, 2}, [](const Ctx& c) { return "(" + c.x[0] + " + " + scaled(c, 2, lit(c, 1)) + ")"; }, false, true}},
      {"aten::sub.Scalar",
       {{0}, {1, 2}, [](const Ctx& c) { return "(" + c.x[0] + " - " + scaled(c, 2, lit(c, 1)) + ")"; }, false, true}},
      {"aten::rsub.Scalar",
       {{0}, {1, 2}, [](const Ctx& c) { return "(" + lit(c, 1) + " - " + scaled(c, 2, c.x[0]) + ")"; }, false, true}},
      {"aten::mul.Scalar", {{0}, {1}, binary_scalar("*"), false, true}},
      {"aten::div.Scalar", {{0}, {1}, [](const Ctx& c) { return divide(c.x[0], lit(c, 1)); }}},
      {"aten::neg", {{0}, {}, [](const Ctx& c) { return "(-" + c.x[0] + ")"; }, false, true}},
      // NaN < 0 is false, so relu(NaN) is NaN as in ATen's clamp_min.
      {"aten::relu",
       {{0}, {}, [](const Ctx& c) { return "(" + c.x[0] + " < " + c.T + "(0) ? " + c.T + "(0) : " + c.x[0] + ")"; }}},
      {"aten::exp", {{0}, {}, unary("crucible_exp")}},  // Note [Vectorizable exp and erf]
      {"aten::expm1", {{0}, {}, unary("std::expm1")}},
      {"aten::log", {{0}, {}, unary("std::log")}},
      {"aten::log1p", {{0}, {}, unary("std::log1p")}},
      {"aten::sqrt", {{0}, {}, unary("std::sqrt")}},
      {"aten::tanh", {{0}, {}, unary("std::tanh")}},
      {"aten::sin", {{0}, {}, unary("std::sin")}},
      {"aten::cos", {{0}, {}, unary("std::cos")}},
      {"aten::erf", {{0}, {}, unary("crucible_erf")}},
      {"aten::floor", {{0}, {}, unary("std::floor")}},
      {"aten::ceil", {{0}, {}, unary("std::ceil")}},
      {"aten::abs", {{0}, {}, unary("std::abs")}},
      {"aten::rsqrt", {{0}, {}, [](const Ctx& c) { return divide(c.T + "(1)", "std::sqrt(" + c.x[0] + ")"); }}},
      {"aten::reciprocal", {{0}, {}, [](const Ctx& c) { return divide(c.T + "(1)", c.x[0]); }}},
      {"aten::sigmoid",
       {{0}, {}, [](const Ctx& c) { return divide(c.T + "(1)", "(" + c.T + "(1) + crucible_exp(-" + c.x[0] + "))"); }}},
      {"aten::pow.Tensor_Scalar",
       {{0},
        {1},
        [](const Ctx& c) {
          // ATen's special cases (PowKernel.cpp), which differ from
          // std::pow at -0 and -inf (sqrt(-inf) is NaN, pow(-inf, 0.5) inf).
          const double e = c.n->arg(1).constant().toScalar().toDouble();
          const std::string& x = c.x[0];
          if (e == 0.5) return "std::sqrt(" + x + ")";
          if (e == -0.5) return divide(c.T + "(1)", "std::sqrt(" + x + ")");
          if (e == -1) return divide(c.T + "(1)", x);
          if (e == 2) return "(" + x + " * " + x + ")";
          if (e == 3) return "(" + x + " * " + x + " * " + x + ")";
          if (e == -2) return divide(c.T + "(1)", "(" + x + " * " + x + ")");
          return "std::pow(" + x + ", " + lit(c, 1) + ")";
        }}},
      {"aten::pow.Scalar", {{1}, {0}, [](const Ctx& c) { return "std::pow(" + lit(c, 0) + ", " + c.x[0] + ")"; }}},
      {"aten::pow.Tensor_Tensor",
       {{0, 1}, {}, [](const Ctx& c) { return "std::pow(" + c.x[0] + ", " + c.x[1] + ")"; }}},
      {"aten::maximum", {{0, 1}, {}, extremum(">")}},
      {"aten::minimum", {{0, 1}, {}, extremum("<")}},
      // threshold_backward(grad_output, self, threshold): relu's backward.
      {"aten::threshold_backward",
       {{0, 1},
        {2},
        [](const Ctx& c) { return "(" + c.x[1] + " <= " + lit(c, 2) + " ? " + c.T + "(0) : " + c.x[0] + ")"; }}},
      {"aten::sigmoid_backward",
       {{0, 1},
        {},
        [](const Ctx& c) { return "(" + c.x[0] + " * (" + c.T + "(1) - " + c.x[1] + ") * " + c.x[1] + ")"; }}},
      {"aten::tanh_backward",
       {{0, 1},
        {},
        [](const Ctx& c) { return "(" + c.x[0] + " * (" + c.T + "(1) - " + c.x[1] + " * " + c.x[1] + "))"; }}},
      {"aten::eq.Scalar", {{0}, {1}, compare_scalar("=="), true, true}},
      {"aten::ne.Scalar", {{0}, {1}, compare_scalar("!="), true, true}},
      {"aten::lt.Scalar", {{0}, {1}, compare_scalar("<"), true, true}},
      {"aten::le.Scalar", {{0}, {1}, compare_scalar("<="), true, true}},
      {"aten::gt.Scalar", {{0}, {1}, compare_scalar(">"), true, true}},
      {"aten::ge.Scalar", {{0}, {1}, compare_scalar(">="), true, true}},
      {"aten::eq.Tensor", {{0, 1}, {}, binary("=="), true, true}},
      {"aten::ne.Tensor", {{0, 1}, {}, binary("!="), true, true}},
      {"aten::lt.Tensor", {{0, 1}, {}, binary("<"), true, true}},
      {"aten::le.Tensor", {{0, 1}, {}, binary("<="), true, true}},
      {"aten::gt.Tensor", {{0, 1}, {}, binary(">"), true, true}},
      {"aten::ge.Tensor", {{0, 1}, {}, binary(">="), true, true}},
      {"aten::where.self",
       {{0, 1, 2},
        {},
        [](const Ctx& c) { return "(" + c.x[0] + " ? " + c.x[1] + " : " + c.x[2] + ")"; },
        false,
        true,
        {0}}},
      {"aten::where.ScalarOther",
       {{0, 1},
        {2},
        [](const Ctx& c) { return "(" + c.x[0] + " ? " + c.x[1] + " : " + lit(c, 2) + ")"; },
        false,
        true,
        {0}}},
      {"aten::where.ScalarSelf",
       {{0, 2},
        {1},
        [](const Ctx& c) { return "(" + c.x[0] + " ? " + lit(c, 1) + " : " + c.x[1] + ")"; },
        false,
        true,
        {0}}},
      {"aten::masked_fill.Scalar",
       {{0, 1},
        {2},
        [](const Ctx& c) { return "(" + c.x[1] + " ? " + lit(c, 2) + " : " + c.x[0] + ")"; },
        false,
        true,
        {1}}},
      // Casts and copies: the operand is converted to the result's type.
      {"aten::to.dtype", {{0}, {}, identity(), false, true}},
      {"aten::_to_copy", {{0}, {}, identity(), false, true}},
      {"aten::clone", {{0}, {}, identity(), false, true}},
      // copy(self, src): src, as self's dtype and size; self's elements are not read.
      {"aten::copy", {{1}, {}, identity(), false, true, {}, {0}}},
      // *_like(self, ...): self gives the size and dtype only.
      {"aten::zeros_like", {{}, {}, [](const Ctx& c) { return literal(0, c.T); }, false, true, {}, {0}}},
      {"aten::ones_like", {{}, {}, [](const Ctx& c) { return literal(1, c.T); }, false, true, {}, {0}}},
      {"aten::full_like", {{}, {1}, fill(1), false, true, {}, {0}}},
      {"aten::zeros", {{}, {}, [](const Ctx& c) { return literal(0, c.T); }, false, true}},
      {"aten::ones", {{}, {}, [](const Ctx& c) { return literal(1, c.T); }, false, true}},
      {"aten::full", {{}, {1}, fill(1), false, true}},
      // arange: start + step * i over the one dimension (integer results
      // only: floating ones round as ATen's kernel does, not as this does).
      {"aten::arange",
       {{}, {0}, [](const Ctx& c) { return c.T + "(" + c.index[0].str() + ")"; }, false, true, {}, {}, true}},
      {"aten::arange.start",
       {{},
        {0, 1},
        [](const Ctx& c) { return "(" + lit(c, 0) + " + " + c.T + "(" + c.index[0].str() + "))"; },
        false,
        true,
        {},
        {},
        true}},
      {"aten::arange.start_step",
       {{},
        {0, 1, 2},
        [](const Ctx& c) { return "(" + lit(c, 0) + " + " + lit(c, 2) + " * " + c.T + "(" + c.index[0].str() + "))"; },
        false,
        true,
        {},
        {},
        true}},
  };
  return t;
}

bool numeric_constant(const ir::Argument& a) {
  if (!a.is_constant()) return false;
  const c10::IValue& v = a.constant();
  if (v.isInt() || v.isDouble() || v.isBool()) return true;
  return v.isScalar() && !v.toScalar().isComplex();
}

bool is_float(c10::ScalarType t) { return t == c10::kFloat || t == c10::kDouble || reduced_precision(t); }

// Whether a scalar operand of a higher category (bool < integer < float)
// than tensor dtype `t` promotes the op's computation (an int64 tensor
// compared with 2.5 is compared as float, a bool one with 2 as int64), as
// ATen's result_type rules say.
bool scalar_promotes(const c10::IValue& v, c10::ScalarType t) {
  const c10::Scalar s = v.toScalar();
  const int category = s.isBoolean() ? 0 : s.isIntegral(/*includeBool=*/false) ? 1 : 2;
  const int tensor_category = t == c10::kBool ? 0 : c10::isIntegralType(t, /*includeBool=*/false) ? 1 : 2;
  return category > tensor_category;
}

// Views whose index map lowering knows (Note [Lowering]).
const std::unordered_set<std::string>& view_ops() {
  static const std::unordered_set<std::string> v = {"aten::view",
                                                    "aten::_unsafe_view",
                                                    "aten::reshape",
                                                    "aten::expand",
                                                    "aten::permute",
                                                    "aten::transpose.int",
                                                    "aten::t",
                                                    "aten::unsqueeze",
                                                    "aten::squeeze.dim",
                                                    "aten::squeeze.dims",
                                                    "aten::squeeze",
                                                    "aten::slice.Tensor",
                                                    "aten::select.int",
                                                    "aten::split.Tensor",
                                                    "aten::split_with_sizes",
                                                    "aten::unbind.int",
                                                    "aten::alias",
                                                    "aten::detach",
                                                    "aten::lift_fresh"};
  return v;
}

int64_t wrap_dim(int64_t d, size_t rank) {
  int64_t r = std::max<int64_t>(static_cast<int64_t>(rank), 1);
  return d < 0 ? d + r : d;
}

// ---- the lowering ---------------------------------------------------------

enum class Kind { Pointwise, Pad, Cat, Pool, PoolBackward, Reduction, View, Extern };

// The most inputs a cat is lowered with (torch/_inductor/config.py's
// max_pointwise_cat_inputs): every element runs each input's code.
constexpr size_t kMaxCatInputs = 8;

// max_pool2d's window over the last two dims: kernel, stride, padding.
struct Window {
  int64_t kh = 0, kw = 0, sh = 0, sw = 0, ph = 0, pw = 0;
};

struct Lazy {
  std::vector<int64_t> sizes;
  c10::ScalarType dtype = c10::kFloat;
  PointwiseFn fn;
  int ops = 0;        // ops a reader inlines with it (the recomputation bound)
  bool view = false;  // a view of `base`: aliases it
  const ir::Value* base = nullptr;
  std::vector<const ir::Node*> nodes;
};

// Inlining bounds (torch/_inductor/config.py's realize_reads_threshold and
// realize_opcount_threshold play the same part).
constexpr int kMaxInlineOps = 48;
constexpr int kMaxRecompute = 24;

class Lowerer {
 public:
  explicit Lowerer(const ir::Graph& g) : g_(g) {}

  Program run() {
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
    return std::move(p_);
  }

 private:
  void lower_node(const ir::Node* n) {
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

  // Note [Trailing write-backs]
  // A functional training step ends with copy_(input, new value) for every
  // parameter, buffer and optimizer state it updates, and each new value
  // was computed from the old values of the others (a parameter's update
  // reads the old momentum). Those copies commute — none reads another's
  // result — so lowering may take them in any order; taking first the
  // copies whose new value reads an input another copy overwrites lets
  // every one of them write in place (Note [In-place write-backs]): the
  // parameter is written while the momentum still holds its old value, then
  // the momentum. A cycle (two copies that each read the other's input)
  // keeps graph order, and the realization before each write keeps it
  // right. Among the copies free to go, the order also serves speed:
  //  - first those that wait on no collective, then those whose
  //    collective was issued earliest (Note [Sinking waits]), so that in a
  //    data-parallel step the parameters whose gradients are reduced first
  //    are updated while the last buckets are still on the wire;
  //  - then a copy of the last one's size: a parameter's new value and its
  //    optimizer state, one after the other, fuse into one loop group
  //    (Note [Fusion]) that reads the gradient and the old state once;
  //  - then graph order.
  static bool is_write_back(const ir::Node* n) {
    return n->is_call() && n->target() == "aten::copy_" && n->num_results() == 1 && !n->result()->has_users() &&
           n->arg(0).is_value() && n->arg(0).value()->node()->is_placeholder();
  }

  std::vector<const ir::Node*> write_back_order(const std::vector<const ir::Node*>& copies) const {
    // reads[i]: the buffers copy i's new value reads.
    std::vector<std::unordered_set<int>> reads(copies.size());
    std::vector<int> dst(copies.size(), -1);
    for (size_t i = 0; i < copies.size(); ++i) {
      if (auto b = p_.buffer_of.find(copies[i]->arg(0).value()); b != p_.buffer_of.end()) dst[i] = b->second;
      if (!copies[i]->arg(1).is_value()) continue;
      const ir::Value* src = copies[i]->arg(1).value();
      if (auto b = p_.buffer_of.find(src); b != p_.buffer_of.end()) continue;  // computed already
      auto l = lazy_.find(src);
      if (l == lazy_.end()) continue;
      Loop probe;
      probe.sizes = l->second.sizes;
      probe.fn = l->second.fn;
      for (const Read& r : reads_of(p_, probe, probe.numel(), 1)) reads[i].insert(r.buffer);
    }
    auto numel_of = [](const ir::Node* copy) {
      const ir::Value* d = copy->arg(0).value();
      return d->has_meta() ? d->meta().numel() : int64_t{-1};
    };
    // blockers[j]: the pending copies other than j that read what j overwrites.
    std::vector<int> blockers(copies.size(), 0);
    std::vector<size_t> ready(copies.size(), 0);  // 0: waits on nothing; else 1 + its collective's position
    for (size_t i = 0; i < copies.size(); ++i) {
      for (size_t j = 0; j < copies.size(); ++j)
        if (i != j && dst[j] >= 0 && reads[i].contains(dst[j])) ++blockers[j];
      for (int b : reads[i])
        if (auto w = waited_.find(b); w != waited_.end()) ready[i] = std::max(ready[i], 1 + w->second);
    }
    std::vector<const ir::Node*> order;
    std::vector<bool> done(copies.size(), false);
    int64_t last_numel = -1;
    while (order.size() < copies.size()) {
      size_t pick = copies.size();
      auto key = [&](size_t j) { return std::make_tuple(ready[j], numel_of(copies[j]) != last_numel, j); };
      for (size_t j = 0; j < copies.size(); ++j)
        if (!done[j] && blockers[j] == 0 && (pick == copies.size() || key(j) < key(pick))) pick = j;
      if (pick == copies.size())  // a cycle: graph order
        for (size_t j = 0; j < copies.size() && pick == copies.size(); ++j)
          if (!done[j]) pick = j;
      done[pick] = true;
      for (size_t j = 0; j < copies.size(); ++j)
        if (j != pick && dst[j] >= 0 && reads[pick].contains(dst[j])) --blockers[j];
      order.push_back(copies[pick]);
      last_numel = numel_of(copies[pick]);
    }
    return order;
  }

  // -- classification --

  // A tensor the loops can read and write: on the loops' device, of a type they handle.
  bool loop_tensor(const ir::Value* v) const {
    return v && v->is_tensor() && v->has_meta() && v->meta().device == p_.device && !ctype_of(v->meta().dtype).empty();
  }

  // A 0-dim CPU tensor that loops on a GPU read by value (Note [Lowering]).
  bool host_scalar(const ir::Value* v) const {
    return p_.device.is_cuda() && v && v->is_tensor() && v->has_meta() && v->meta().device.is_cpu() &&
           v->meta().sizes.empty() && !ctype_of(v->meta().dtype).empty() && !reduced_precision(v->meta().dtype);
  }

  Kind classify(const ir::Node* n) const {
    for (const auto& r : n->results())
      if (!loop_tensor(r.get())) return Kind::Extern;
    if (n->is_mutating() || n->is_nondeterministic()) return Kind::Extern;
    const std::string& t = n->target();
    if (view_ops().contains(t)) {
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
    auto it = table().find(t);
    if (it == table().end() || n->num_results() != 1) return Kind::Extern;
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

  // The window of max_pool2d_with_indices(x, kernel, stride, padding,
  // dilation, ceil_mode) (first = 1) or of its backward (grad, x, kernel,
  // ..., indices: first = 2, indices at 7), when lowered (Note [Max
  // pooling]): a float input of 3 or 4 dims, constant sizes, no dilation,
  // padding within each dim.
  std::optional<Window> window_of(const ir::Node* n, size_t first, size_t indices) const {
    if (n->args().size() < std::max(first + 5, indices + 1)) return std::nullopt;
    for (size_t i = 0; i < first; ++i)
      if (!n->arg(i).is_value() || !loop_tensor(n->arg(i).value()) || !is_float(n->arg(i).value()->meta().dtype))
        return std::nullopt;
    if (indices && (!n->arg(indices).is_value() || !loop_tensor(n->arg(indices).value()) ||
                    n->arg(indices).value()->meta().dtype != c10::kLong))
      return std::nullopt;
    for (size_t i = first; i < first + 5; ++i)
      if (!n->arg(i).is_constant()) return std::nullopt;
    const std::vector<int64_t>& x = n->arg(first - 1).value()->meta().sizes;
    if (x.size() != 3 && x.size() != 4) return std::nullopt;
    auto pair = [&](size_t i, int64_t fallback) -> std::optional<std::pair<int64_t, int64_t>> {
      const std::vector<int64_t> v = n->arg(i).constant().toIntVector();
      if (v.empty()) return std::make_pair(fallback, fallback);
      if (v.size() == 1) return std::make_pair(v[0], v[0]);
      if (v.size() == 2) return std::make_pair(v[0], v[1]);
      return std::nullopt;
    };
    const auto kernel = pair(first, 0);
    if (!kernel) return std::nullopt;
    const auto stride = n->arg(first + 1).constant().toIntVector().empty() ? kernel : pair(first + 1, 0);
    const auto padding = pair(first + 2, 0), dilation = pair(first + 3, 1);
    if (!stride || !padding || !dilation || *dilation != std::make_pair<int64_t, int64_t>(1, 1)) return std::nullopt;
    Window w{kernel->first, kernel->second, stride->first, stride->second, padding->first, padding->second};
    const int64_t h = x[x.size() - 2], wd = x.back();
    if (indices) {  // the backward counts the gradient's rows and columns modulo their numbers
      const std::vector<int64_t>& g = n->arg(0).value()->meta().sizes;
      if (g.size() != x.size() || g[g.size() - 2] < 1 || g.back() < 1) return std::nullopt;
    }
    if (w.kh < 1 || w.kw < 1 || w.sh < 1 || w.sw < 1 || w.ph < 0 || w.pw < 0 || w.ph > h || w.pw > wd || h < 1 ||
        wd < 1)
      return std::nullopt;
    return w;
  }

  // constant_pad_nd(x, pads, value) lowered: a float tensor padded by
  // constants, each side at most the dimension's size (Note [Lowering]).
  bool pad_ok(const ir::Node* n) const {
    if (n->args().size() != 3 || !n->arg(0).is_value() || !loop_tensor(n->arg(0).value()) || !n->arg(1).is_constant() ||
        !numeric_constant(n->arg(2)) || !is_float(n->result()->meta().dtype))
      return false;
    const std::vector<int64_t>& sizes = n->arg(0).value()->meta().sizes;
    const std::vector<int64_t> pads = n->arg(1).constant().toIntVector();
    if (pads.size() % 2 != 0 || pads.size() / 2 > sizes.size()) return false;
    for (size_t k = 0; k < pads.size(); ++k) {
      const int64_t size = sizes[sizes.size() - 1 - k / 2];
      if (pads[k] < 0 || pads[k] > size) return false;
    }
    return true;
  }

  // cat(tensors, dim)'s dimension, when lowered (Note [Masked loads]): 1
  // to kMaxCatInputs inputs of the result's rank that the loops read, each
  // of the result's sizes but along dim, besides the 1-d empty tensors cat
  // skips.
  std::optional<int64_t> cat_dim(const ir::Node* n) const {
    if (n->args().empty() || n->args().size() > 2 || !n->arg(0).is_value_list() ||
        (n->args().size() == 2 && !(n->arg(1).is_constant() && n->arg(1).constant().isInt())))
      return std::nullopt;
    const std::vector<int64_t>& sizes = n->result()->meta().sizes;
    if (sizes.empty()) return std::nullopt;
    const int64_t dim = wrap_dim(n->args().size() == 2 ? n->arg(1).constant().toInt() : 0, sizes.size());
    size_t parts = 0;
    for (const ir::Value* v : n->arg(0).value_list()) {
      if (!loop_tensor(v)) return std::nullopt;
      const std::vector<int64_t>& in = v->meta().sizes;
      if (in.size() == 1 && in[0] == 0 && sizes.size() != 1) continue;  // skipped by cat
      if (in.size() != sizes.size()) return std::nullopt;
      for (size_t d = 0; d < in.size(); ++d)
        if (static_cast<int64_t>(d) != dim && in[d] != sizes[d]) return std::nullopt;
      parts += in[dim] > 0;
    }
    if (parts == 0 || parts > kMaxCatInputs) return std::nullopt;
    return dim;
  }

  static c10::ScalarType compute_type(const ir::Node* n, const PointwiseOp& op) {
    if (!op.compute_in_operands) return n->result()->meta().dtype;
    return n->arg(op.tensor_args[0]).value()->meta().dtype;
  }

  bool reduction_ok(const ir::Node* n) const {
    static const std::unordered_set<std::string> names = {"aten::sum.dim_IntList",
                                                          "aten::sum",
                                                          "aten::mean.dim",
                                                          "aten::mean",
                                                          "aten::amax",
                                                          "aten::amin",
                                                          "aten::var_mean.dim",
                                                          "aten::var_mean.correction"};
    if (!names.contains(n->target()) || !n->arg(0).is_value() || !loop_tensor(n->arg(0).value())) return false;
    c10::ScalarType in = n->arg(0).value()->meta().dtype;
    if (!is_float(in)) return false;
    for (const auto& r : n->results())
      if (r->meta().dtype != in) return false;
    for (size_t i = 1; i < n->args().size(); ++i)
      if (!n->arg(i).is_constant()) return false;
    // sum/mean's dtype= argument: only None or the input's own dtype.
    const std::string& t = n->target();
    size_t dtype_arg = t == "aten::sum" || t == "aten::mean"                   ? 1
                       : t == "aten::sum.dim_IntList" || t == "aten::mean.dim" ? 3
                                                                               : 0;
    if (dtype_arg && dtype_arg < n->args().size() && !n->arg(dtype_arg).constant().isNone()) return false;
    return true;
  }

  // -- buffers and realization --

  // A value lowered to a body (pointwise, a pad or a view), not yet realized.
  void define_lazy(const ir::Value* v, Lazy l) {
    lazy_[v] = std::move(l);
    unrealized_.push_back(v);
  }

  // The buffers the body of lazy value `v` loads. Fixed once `v` is defined:
  // its body inlines its producers' bodies as they were then, so a producer
  // realized later changes nothing here. Memoized: before every mutating
  // extern kernel the values still to be read are checked against what it
  // writes (lower_extern), and a training step has one such write-back per
  // parameter and optimizer state.
  const std::vector<int>& buffers_read(const ir::Value* v) {
    auto [it, fresh] = reads_.try_emplace(v);
    if (fresh) {
      Loop probe;
      probe.sizes = lazy_.at(v).sizes;
      probe.fn = lazy_.at(v).fn;
      for (const Read& r : reads_of(p_, probe, probe.numel(), 1))
        if (std::find(it->second.begin(), it->second.end(), r.buffer) == it->second.end())
          it->second.push_back(r.buffer);
    }
    return it->second;
  }

  int add_buffer(const ir::Value* v, Buffer::Kind kind) {
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

  static std::string c_name(const std::string& s) {
    std::string out;
    for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    return out;
  }

  // Dense and non-overlapping: strides a permutation of some row-major
  // strides, so a buffer can be allocated with them.
  static bool dense(const ir::TensorMeta& m) {
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

  void realize(const ir::Value* v) {
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
  static std::vector<int> memory_order(const Buffer& b) {
    std::vector<int> order, ones;
    for (size_t d = 0; d < b.sizes.size(); ++d) (b.sizes[d] == 1 ? ones : order).push_back(static_cast<int>(d));
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
      return b.strides[static_cast<size_t>(x)] > b.strides[static_cast<size_t>(y)];
    });
    if (std::is_sorted(order.begin(), order.end())) return {};
    order.insert(order.end(), ones.begin(), ones.end());
    return order;
  }

  // `v` as a tensor at run time: a view runs its view op on the (realized)
  // base; anything else lazy is realized.
  void ensure_tensor(const ir::Value* v) {
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

  bool needs_tensor(const ir::Value* v) const {
    if (outputs_.contains(v)) return true;
    for (const ir::Node* u : v->users()) {
      // A write-back may take v in place (Note [In-place write-backs]);
      // if it does not, it realizes v when it is lowered.
      if (is_write_back(u) && u->arg(1).is_value() && u->arg(1).value() == v) continue;
      if (u->is_output() || (u->is_call() && kind_.at(u) == Kind::Extern)) return true;
    }
    return false;
  }

  // -- pointwise --

  // Operand `v` read at `index` (the result's multi-index): broadcast by
  // aligning sizes right, size-1 dimensions read at 0.
  static std::vector<Expr> broadcast(const std::vector<int64_t>& from, const std::vector<Expr>& index) {
    std::vector<Expr> out(from.size());
    size_t lead = index.size() - from.size();
    for (size_t d = 0; d < from.size(); ++d) out[d] = from[d] == 1 ? Expr() : index[lead + d];
    return out;
  }

  void lower_pointwise(const ir::Node* n) {
    const PointwiseOp& op = table().at(n->target());
    const ir::Value* out = n->result();
    std::vector<Lazy> operands;
    std::vector<bool> masks;
    Lazy l;
    l.sizes = out->meta().sizes;
    l.dtype = out->meta().dtype;
    l.ops = 1;
    for (size_t i : op.tensor_args) {
      const Lazy& a = lazy_.at(n->arg(i).value());
      operands.push_back(a);
      masks.push_back(std::find(op.bool_args.begin(), op.bool_args.end(), i) != op.bool_args.end());
      l.ops += a.ops;
      for (const ir::Node* m : a.nodes)
        if (std::find(l.nodes.begin(), l.nodes.end(), m) == l.nodes.end()) l.nodes.push_back(m);
    }
    l.nodes.push_back(n);
    std::string T = ctype_of(compute_type(n, op));
    std::string R = ctype_of(l.dtype);
    // A conversion to bf16 or f16, or a fill of that dtype, rounds where it
    // stands (Note [Reduced-precision loops]).
    bool rounds = reduced_precision(l.dtype) && operands.empty();
    for (size_t k = 0; k < operands.size(); ++k) rounds = rounds || (!masks[k] && operands[k].dtype != l.dtype);
    const c10::ScalarType dtype = l.dtype;
    const bool one_hot = selects_one(n);
    l.fn = [operands, masks, T, R, n, &op, rounds, dtype, one_hot](Body& b, const std::vector<Expr>& index) {
      std::vector<std::string> x;
      int level = 0;
      Val condition;
      for (size_t k = 0; k < operands.size(); ++k) {
        // Note [One-hot selections]: the selected operand read where chosen.
        if (one_hot && k == 1) b.push_mask(condition.name, condition.level);
        Val v = operands[k].fn(b, broadcast(operands[k].sizes, index));
        if (one_hot && k == 1) b.pop_mask();
        if (k == 0) condition = v;
        level = std::max(level, v.level);
        std::string t = ctype_of(operands[k].dtype);
        x.push_back(masks[k] || t == T ? v.name : "static_cast<" + T + ">(" + v.name + ")");
      }
      if (op.reads_index) level = std::max(level, level_of(index[0]));
      std::string e = op.render(Ctx{x, n, T, index});
      if (R != T) e = "static_cast<" + R + ">(" + e + ")";
      if (rounds) e = round_to(dtype, e);
      return b.compute(e, level, R);
    };
    define_lazy(out, std::move(l));
    realize_if_costly(out);
  }

  // Note [One-hot selections]
  // where(i == t, v, 0), with i counting along a dimension d (an arange
  // viewed along it) and t constant along d, selects at most one element of
  // each line along d: nll_loss's decomposition picks the target's
  // log-probability so, and sums over the classes. Its value operand, and
  // the producers inlined into it, are then read under the condition
  // (Body::push_mask, Note [Masked loads]): memory is read at the selected
  // element alone, where the sum would otherwise walk the whole line of the
  // value from memory (GPT-2's log-probabilities over its 50257-word
  // vocabulary: a second pass over the logits, after the one that makes the
  // maximum and the sum of exponentials). A masked operand is read one
  // element at a time, which costs nothing here: almost nothing is read.
  bool selects_one(const ir::Node* n) const {
    if (n->target() != "aten::where.self" && n->target() != "aten::where.ScalarOther") return false;
    const ir::Value* cond = n->arg(0).value();
    if (!cond->node()->is_call() || cond->node()->target() != "aten::eq.Tensor") return false;
    const ir::Node* eq = cond->node();
    for (int side = 0; side < 2; ++side) {
      const ir::Argument &i = eq->arg(side), &t = eq->arg(1 - side);
      if (!i.is_value() || !t.is_value() || !i.value()->has_meta() || !t.value()->has_meta()) continue;
      const std::vector<int64_t>&is = i.value()->meta().sizes, &ts = t.value()->meta().sizes;
      // i counts along its one dimension d of more than one element.
      const auto counting = [](int64_t s) { return s > 1; };
      const auto d = std::find_if(is.begin(), is.end(), counting);
      if (is.size() != ts.size() || d == is.end() || std::find_if(d + 1, is.end(), counting) != is.end()) continue;
      if (ts[static_cast<size_t>(d - is.begin())] == 1 && counts(i.value())) return true;
    }
    return false;
  }

  // `v` is an arange (integers counting by a step that is not 0), seen
  // through views that keep its elements in order.
  static bool counts(const ir::Value* v) {
    static const std::unordered_set<std::string> views = {"aten::view", "aten::_unsafe_view", "aten::reshape",
                                                          "aten::unsqueeze"};
    const ir::Node* n = v->node();
    while (n->is_call() && views.contains(n->target()) && n->arg(0).is_value()) n = n->arg(0).value()->node();
    if (!n->is_call() || !n->result()->has_meta() || !c10::isIntegralType(n->result()->meta().dtype, false))
      return false;
    if (n->target() == "aten::arange" || n->target() == "aten::arange.start") return true;
    return n->target() == "aten::arange.start_step" && n->arg(2).is_constant() &&
           n->arg(2).constant().toScalar().toDouble() != 0;
  }

  // Realizes a new pointwise value where inlining it would not pay: a
  // tensor something needs, too many ops, or too much recomputation or
  // re-reading across its readers. A write-back of the value is not a
  // reader that recomputes it: taken in place, its loop joins the other
  // readers' kernel and shares their loads (an optimizer's new momentum,
  // read by the parameter's update and written back; Note [In-place
  // write-backs]).
  void realize_if_costly(const ir::Value* out) {
    size_t readers = 0;
    for (const ir::Node* u : out->users())
      readers += !(is_write_back(u) && u->arg(1).is_value() && u->arg(1).value() == out);
    const Lazy& made = lazy_.at(out);
    if (needs_tensor(out) || made.ops > kMaxInlineOps ||
        (readers > 1 && (made.ops * static_cast<int>(readers - 1) > kMaxRecompute || full_loads(made) > 1)))
      realize(out);
  }

  // constant_pad_nd: element i of a padded dimension of size N (pad lo
  // before) is x[i - lo] where lo <= i < lo + N, else the value. The load
  // goes to (i + N - lo) mod N, which equals i - lo inside and stays in
  // bounds outside (lo <= N): nothing is read out of bounds, and a pointwise
  // producer of x fuses with the pad (pad_mm's padded gradients are written
  // once, padded).
  void lower_pad(const ir::Node* n) {
    const Lazy& in = lazy_.at(n->arg(0).value());
    const ir::Value* out = n->result();
    const std::vector<int64_t> pads = n->arg(1).constant().toIntVector();
    const size_t rank = in.sizes.size();
    std::vector<int64_t> before(rank, 0);
    std::vector<bool> padded(rank, false);
    for (size_t k = 0; k < pads.size(); k += 2) {
      const size_t d = rank - 1 - k / 2;
      before[d] = pads[k];
      padded[d] = pads[k] > 0 || pads[k + 1] > 0;
    }
    Lazy l;
    l.sizes = out->meta().sizes;
    l.dtype = out->meta().dtype;
    l.ops = in.ops + 1;
    l.nodes = in.nodes;
    l.nodes.push_back(n);
    const std::string T = ctype_of(l.dtype);
    const std::string fill = literal(n->arg(2).constant(), T);
    const std::string I = ctype_of(in.dtype);
    l.fn = [in, before, padded, T, I, fill](Body& b, const std::vector<Expr>& index) {
      std::vector<Expr> src(index.size());
      std::string inside;
      int level = 0;
      for (size_t d = 0; d < index.size(); ++d) {
        if (!padded[d]) {
          src[d] = index[d];
          continue;
        }
        const int64_t size = in.sizes[d];
        src[d] = mod(index[d] + (size - before[d]), size);
        const std::string i = "(" + index[d].str() + ")";
        const std::string lower = before[d] > 0 ? i + " >= " + std::to_string(before[d]) + " && " : "";
        inside += std::string(inside.empty() ? "" : " && ") + "(" + lower + i + " < " +
                  std::to_string(before[d] + size) + ")";
        level = std::max(level, level_of(index[d]));
      }
      Val v = in.fn(b, src);
      std::string x = I == T ? v.name : "static_cast<" + T + ">(" + v.name + ")";
      return b.compute(inside.empty() ? x : "(" + inside + " ? " + x + " : " + fill + ")", std::max(level, v.level), T);
    };
    define_lazy(out, std::move(l));
    realize_if_costly(out);
  }

  // Note [Masked loads]
  // cat(tensors, dim) is a pointwise value, as in TorchInductor's
  // pointwise_cat: element i along dim is input k's element i - offset_k,
  // k the input whose range [offset_k, offset_k + size_k) holds i, chosen
  // by comparisons of i. Each input's code (its loads, and those of the
  // producers inlined into it) runs under a mask saying i is in its range
  // (Body::push_mask): memory is read only for the input chosen, and the
  // other inputs' loads give 0, on which their code computes harmlessly
  // (the loops' ops are total: no integer division, nothing that traps).
  // So producers fuse into the cat and the cat into its readers: a GPT's
  // q, k and v gradients, read through their head transposes, are written
  // into one [B, T, 3C] buffer by one kernel, where an extern cat wrote a
  // copy of three realized tensors. A reader whose index range lies inside
  // one input's (a slice of the cat) reads that input alone, unmasked.
  // Shifted indices i - offset_k are negative where k is not chosen; index
  // expressions divide with floor semantics (index.cpp), so that every /
  // and % the kernel computes is of a non-negative value where chosen.
  void lower_cat(const ir::Node* n) {
    struct Part {
      Lazy in;
      int64_t offset, size;
    };
    const int64_t dim = *cat_dim(n);
    const ir::Value* out = n->result();
    Lazy l;
    l.sizes = out->meta().sizes;
    l.dtype = out->meta().dtype;
    l.ops = 1;
    std::vector<Part> parts;
    int64_t offset = 0;
    for (const ir::Value* v : n->arg(0).value_list()) {
      const Lazy& in = lazy_.at(v);
      if (in.sizes.size() != l.sizes.size() || in.sizes[dim] == 0) continue;
      parts.push_back({in, offset, in.sizes[dim]});
      offset += in.sizes[dim];
      l.ops += in.ops;
      for (const ir::Node* m : in.nodes)
        if (std::find(l.nodes.begin(), l.nodes.end(), m) == l.nodes.end()) l.nodes.push_back(m);
    }
    l.nodes.push_back(n);
    const c10::ScalarType dtype = l.dtype;
    // The inputs' ranges are compared in units of g elements, the greatest
    // common divisor of their offsets and sizes: where a loop walks the
    // inner elements of a unit as its innermost variable (Note [Split
    // loops]), the choice depends on the outer ones alone.
    int64_t g = 0;
    for (const Part& p : parts) g = std::gcd(g, std::gcd(p.offset, p.size));
    l.fn = [parts, dim, dtype, g](Body& b, const std::vector<Expr>& index) {
      const Expr& i = index[dim];
      const Expr unit = floordiv(i, g);
      const std::string at = "(" + unit.str() + ")", T = ctype_of(dtype);
      std::string value;
      int level = level_of(unit);
      for (size_t k = parts.size(); k-- > 0;) {  // the last first: the others wrap it
        const Part& p = parts[k];
        const int64_t end = p.offset + p.size;
        if (i.hi() < p.offset || i.lo() >= end) continue;  // never chosen here
        std::vector<Expr> src = index;
        // i - offset; where size divides offset, i mod size, the same where
        // chosen and simpler to index with (equal inputs: a reshape of q,
        // k or v reads its heads at i mod C).
        src[dim] = p.offset % p.size == 0 ? mod(i, p.size) : i + (-p.offset);
        std::string inside;
        if (i.lo() < p.offset) inside = at + " >= " + std::to_string(p.offset / g);
        if (i.hi() >= end) inside += std::string(inside.empty() ? "" : " && ") + at + " < " + std::to_string(end / g);
        if (!inside.empty()) b.push_mask("(" + inside + ")", level_of(unit));
        const Val v = p.in.fn(b, src);
        if (!inside.empty()) b.pop_mask();
        level = std::max(level, v.level);
        std::string x = v.name;
        if (p.in.dtype != dtype) {
          x = "static_cast<" + T + ">(" + x + ")";
          if (reduced_precision(dtype)) x = round_to(dtype, x);  // Note [Reduced-precision loops]
        }
        value = value.empty() ? x : at + " < " + std::to_string(end / g) + " ? " + x + " : " + value;
      }
      return b.compute(value, level, T);
    };
    define_lazy(out, std::move(l));
    // Read twice, a cat is made once: each reader would gather from every
    // input again, with the choice and its masks (a GPT's q, k, v gradient
    // is read by the projection's matmuls and by its bias's gradient).
    if (out->users().size() > 1)
      realize(out);
    else
      realize_if_costly(out);
  }

  // Note [Max pooling]
  // max_pool2d_with_indices is a pointwise loop over its output: element
  // (oh, ow) takes the largest of its kh x kw window of x, rows then
  // columns, a later element replacing it when greater or NaN, and its
  // index (ih * W + iw) with it; the first element inside the input
  // starts the search, as in ATen's kernels, so ties and -inf keep
  // ATen's index. Positions outside the input are skipped, their loads
  // sent to (i mod H) as constant_pad_nd's are, so nothing is read out of
  // bounds and a pointwise producer of x fuses into the window.
  // Its backward is a pointwise loop over x: element (ih, iw) sums, in
  // the order of the windows, the gradient of every output whose window
  // covers it and whose index names it: at most ceil(kh / sh) rows of
  // outputs, counted down from floor((ih + ph) / sh), times as many
  // columns. (TorchInductor lowers both the same way, without the scatter
  // ATen's backward makes with atomic adds on a GPU.) On the CPU the
  // backward stays ATen's: the gather's divisions and remainders of the
  // index, which the vectorizer cannot take, cost more than ATen's scatter
  // (0.67 against 0.13 ms a step in the ConvNet's, with ReLU's backward).
  // The indices are written beside the values (the same search, in the
  // same kernel) when anything reads them: the backward reads each up to
  // ceil(kh / sh)·ceil(kw / sw) times, a search recomputed as often.
  void lower_max_pool(const ir::Node* n) {
    const Window w = *window_of(n, 1, 0);
    const Lazy& in = lazy_.at(n->arg(0).value());
    const size_t rank = in.sizes.size();
    const int64_t H = in.sizes[rank - 2], W = in.sizes[rank - 1];
    const std::string T = ctype_of(in.dtype);
    // The search, for the value (want_index false) or the index.
    auto search = [in, w, rank, H, W, T](Body& b, const std::vector<Expr>& index, bool want_index) {
      const Expr &oh = index[rank - 2], &ow = index[rank - 1];
      std::string best = "-std::numeric_limits<" + T + ">::infinity()", at = "int64_t(-1)";
      int level = std::max(level_of(oh), level_of(ow));
      for (int64_t i = 0; i < w.kh; ++i)
        for (int64_t j = 0; j < w.kw; ++j) {
          const Expr ih = oh * w.sh + (i - w.ph), iw = ow * w.sw + (j - w.pw);
          std::vector<Expr> src = index;
          src[rank - 2] = mod(oh * w.sh + (i - w.ph + w.ph * H), H);
          src[rank - 1] = mod(ow * w.sw + (j - w.pw + w.pw * W), W);
          std::string inside;
          auto bound = [&](const Expr& e, int64_t size) {
            if (e.lo() < 0) inside += std::string(inside.empty() ? "" : " && ") + "(" + e.str() + ") >= 0";
            if (e.hi() >= size)
              inside += std::string(inside.empty() ? "" : " && ") + "(" + e.str() + ") < " + std::to_string(size);
          };
          bound(ih, H);
          bound(iw, W);
          const Val v = in.fn(b, src);
          level = std::max(level, v.level);
          const std::string better = i == 0 && j == 0 ? "true"
                                                      : "(" + at + " < 0 || " + v.name + " > " + best + " || " +
                                                            v.name + " != " + v.name + ")";
          const Val take = b.compute(inside.empty() ? better : "(" + inside + ") && " + better, level, "bool");
          best = b.compute(take.name + " ? " + v.name + " : " + best, level, T).name;
          at = b.compute(take.name + " ? int64_t(" + (ih * W + iw).str() + ") : " + at, level, "int64_t").name;
        }
      return b.compute(want_index ? at : best, level, want_index ? "int64_t" : T);
    };
    for (size_t r = 0; r < 2; ++r) {
      const ir::Value* out = n->result(r);
      Lazy l;
      l.sizes = out->meta().sizes;
      l.dtype = out->meta().dtype;
      l.ops = in.ops * static_cast<int>(w.kh * w.kw) + 1;
      l.nodes = in.nodes;
      l.nodes.push_back(n);
      l.fn = [search, r](Body& b, const std::vector<Expr>& index) { return search(b, index, r == 1); };
      define_lazy(out, std::move(l));
      if (r == 1 && !out->users().empty())
        realize(out);
      else
        realize_if_costly(out);
    }
  }

  void lower_max_pool_backward(const ir::Node* n) {
    const Window w = *window_of(n, 2, 7);
    const Lazy &grad = lazy_.at(n->arg(0).value()), &indices = lazy_.at(n->arg(7).value());
    const ir::Value* out = n->result();
    const size_t rank = out->meta().sizes.size();
    const int64_t W = out->meta().sizes[rank - 1];
    const int64_t OH = grad.sizes[rank - 2], OW = grad.sizes[rank - 1];
    const int64_t rows = (w.kh + w.sh - 1) / w.sh, cols = (w.kw + w.sw - 1) / w.sw;
    const std::string T = ctype_of(out->meta().dtype), G = ctype_of(grad.dtype);
    Lazy l;
    l.sizes = out->meta().sizes;
    l.dtype = out->meta().dtype;
    l.ops = static_cast<int>(rows * cols) * (grad.ops + indices.ops + 2);
    l.nodes = grad.nodes;
    for (const ir::Node* m : indices.nodes)
      if (std::find(l.nodes.begin(), l.nodes.end(), m) == l.nodes.end()) l.nodes.push_back(m);
    l.nodes.push_back(n);
    l.fn = [grad, indices, w, rank, W, OH, OW, rows, cols, T, G](Body& b, const std::vector<Expr>& index) {
      const Expr &ih = index[rank - 2], &iw = index[rank - 1];
      const Expr top = floordiv(ih + w.ph, w.sh), left = floordiv(iw + w.pw, w.sw);
      const std::string here = "int64_t(" + (ih * W + iw).str() + ")";
      std::string sum = T + "(0)";
      int level = std::max(level_of(ih), level_of(iw));
      // Output rows top - (rows - 1) .. top, columns likewise, in ATen's order.
      for (int64_t a = rows - 1; a >= 0; --a)
        for (int64_t c = cols - 1; c >= 0; --c) {
          const Expr oh = top + (-a), ow = left + (-c);
          std::vector<Expr> src = index;
          src[rank - 2] = mod(top + (rows * OH - a), OH);
          src[rank - 1] = mod(left + (cols * OW - c), OW);
          // The window of (oh, ow) covers (ih, iw): oh >= 0, oh < OH and
          // oh·sh - ph + kh > ih (oh·sh - ph <= ih holds as oh <= top).
          std::string covers;
          auto need = [&](const std::string& cond) { covers += std::string(covers.empty() ? "" : " && ") + cond; };
          if (oh.lo() < 0) need("(" + oh.str() + ") >= 0");
          if (oh.hi() >= OH) need("(" + oh.str() + ") < " + std::to_string(OH));
          if (ow.lo() < 0) need("(" + ow.str() + ") >= 0");
          if (ow.hi() >= OW) need("(" + ow.str() + ") < " + std::to_string(OW));
          const Expr row_end = oh * w.sh + (w.kh - w.ph), col_end = ow * w.sw + (w.kw - w.pw);
          need("(" + row_end.str() + ") > (" + ih.str() + ")");
          need("(" + col_end.str() + ") > (" + iw.str() + ")");
          const Val i = indices.fn(b, src), g = grad.fn(b, src);
          level = std::max({level, i.level, g.level});
          const std::string x = G == T ? g.name : "static_cast<" + T + ">(" + g.name + ")";
          sum = b.compute("(" + covers + " && " + i.name + " == " + here + ") ? " + sum + " + " + x + " : " + sum,
                          level, T)
                    .name;
        }
      return b.compute(sum, level, T);
    };
    define_lazy(out, std::move(l));
    realize_if_costly(out);
  }

  // The buffers of the lazy's size (not broadcast) its inlined body reads:
  // inlined into several readers, each of them reads all of these again,
  // where a realized value costs one write and one read per reader.
  int full_loads(const Lazy& l) const {
    Loop probe;
    probe.sizes = l.sizes;
    probe.fn = l.fn;
    std::unordered_set<int> seen;
    for (const Read& r : reads_of(p_, probe, probe.numel(), 1))
      if (p_.buffers[r.buffer].numel() >= probe.numel()) seen.insert(r.buffer);
    return static_cast<int>(seen.size());
  }

  // -- reductions --

  std::vector<int64_t> reduced_dims(const ir::Node* n, size_t rank) const {
    const std::string& t = n->target();
    std::vector<int64_t> dims;
    bool all = true;
    if (t != "aten::sum" && t != "aten::mean") {
      const c10::IValue& d = n->arg(1).constant();
      if (d.isIntList() && !d.toIntVector().empty()) {
        all = false;
        for (int64_t x : d.toIntVector()) dims.push_back(wrap_dim(x, rank));
      } else if (d.isInt()) {
        all = false;
        dims.push_back(wrap_dim(d.toInt(), rank));
      }
    }
    if (all)
      for (size_t i = 0; i < rank; ++i) dims.push_back(static_cast<int64_t>(i));
    std::sort(dims.begin(), dims.end());
    dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
    return dims;
  }

  // The loop of m when `sum` reduces exp(x - m) with m = amax(x) over the
  // same dims, kept (a softmax's decomposition): Loop::online_max; else -1.
  int softmax_max_loop(const ir::Node* sum) const {
    auto node_of = [](const ir::Argument& a, const char* target) -> const ir::Node* {
      if (!a.is_value() || !a.value()->node()->is_call() || a.value()->node()->target() != target) return nullptr;
      return a.value()->node();
    };
    const ir::Node* e = node_of(sum->arg(0), "aten::exp");
    const ir::Node* d = e ? node_of(e->arg(0), "aten::sub.Tensor") : nullptr;
    const ir::Node* m = d ? node_of(d->arg(1), "aten::amax") : nullptr;
    auto is_one = [](const ir::Argument& a) {
      return a.is_constant() && ((a.constant().isInt() && a.constant().toInt() == 1) ||
                                 (a.constant().isDouble() && a.constant().toDouble() == 1.0));
    };
    if (!m || m->args().size() < 3 || d->args().size() < 3 || !d->arg(0).is_value() || !m->arg(0).is_value() ||
        d->arg(0).value() != m->arg(0).value() || !is_one(d->arg(2)) || !m->arg(2).is_constant() ||
        !m->arg(2).constant().isBool() || !m->arg(2).constant().toBool())
      return -1;
    const size_t rank = sum->arg(0).value()->meta().sizes.size();
    if (m->arg(0).value()->meta().sizes.size() != rank || reduced_dims(sum, rank) != reduced_dims(m, rank)) return -1;
    auto b = p_.buffer_of.find(m->result());
    if (b == p_.buffer_of.end()) return -1;
    const int loop = p_.buffers[b->second].loop;
    return loop >= 0 && p_.loops[loop].reduction && p_.loops[loop].rtype == ReductionType::Max ? loop : -1;
  }

  void lower_reduction(const ir::Node* n) {
    const std::string& t = n->target();
    const ir::Value* xv = n->arg(0).value();
    Lazy x = lazy_.at(xv);
    const std::vector<int64_t>& xs = x.sizes;
    std::vector<int64_t> dims = reduced_dims(n, xs.size());
    std::vector<bool> reduced(xs.size(), false);
    std::vector<int64_t> rsizes;
    for (int64_t d : dims)
      if (d < static_cast<int64_t>(xs.size())) {
        reduced[d] = true;
        rsizes.push_back(xs[d]);
      }
    bool keepdim = false;
    if (t == "aten::sum.dim_IntList" || t == "aten::mean.dim" || t == "aten::amax" || t == "aten::amin")
      keepdim = n->arg(2).constant().toBool();
    else if (t == "aten::var_mean.dim")
      keepdim = n->arg(3).constant().toBool();
    else if (t == "aten::var_mean.correction")
      keepdim = n->arg(3).constant().toBool();
    // The operand at (kept index, reduced index): kept index in the
    // result's sizes, with keepdim's size-1 dims skipped.
    auto operand = [x, reduced, keepdim](Body& b, const std::vector<Expr>& index, const std::vector<Expr>& rindex) {
      std::vector<Expr> in(reduced.size());
      size_t k = 0, j = 0;
      for (size_t d = 0; d < reduced.size(); ++d) {
        if (reduced[d]) {
          in[d] = rindex[j++];
          if (keepdim) ++k;
        } else {
          in[d] = index[k++];
        }
      }
      return x.fn(b, in);
    };
    int64_t count = 1;
    for (int64_t s : rsizes) count *= s;
    std::string T = ctype_of(x.dtype);
    bool column = false;
    {
      const ir::TensorMeta& m = xv->meta();
      int64_t fastest = -1;
      for (size_t d = 0; d < m.sizes.size(); ++d)
        if (m.sizes[d] > 1 && (fastest < 0 || m.strides[d] < m.strides[fastest])) fastest = static_cast<int64_t>(d);
      bool reduces = false;
      for (size_t d = 0; d < xs.size(); ++d) reduces = reduces || (reduced[d] && xs[d] > 1);
      column = fastest >= 0 && !reduced[fastest] && reduces;
    }
    auto add_loop = [&](const ir::Value* v, ReductionType type, ReduceFn fn, std::string finalize) {
      int id = add_buffer(v, Buffer::Computed);
      Loop loop;
      loop.buffer = id;
      loop.sizes = v->meta().sizes;
      loop.reduction = true;
      loop.rsizes = rsizes;
      loop.rtype = type;
      loop.rfn = std::move(fn);
      loop.finalize = std::move(finalize);
      loop.column = column;
      loop.nodes = x.nodes;
      loop.nodes.push_back(n);
      p_.buffers[id].loop = static_cast<int>(p_.loops.size());
      p_.items.push_back({nullptr, static_cast<int>(p_.loops.size())});
      p_.loops.push_back(std::move(loop));
    };
    std::string mean = "$ / " + T + "(" + std::to_string(count) + ")";
    if (t == "aten::sum.dim_IntList" || t == "aten::sum") {
      add_loop(n->result(), ReductionType::Sum, operand, "");
      p_.loops.back().online_max = softmax_max_loop(n);
    } else if (t == "aten::mean.dim" || t == "aten::mean") {
      add_loop(n->result(), ReductionType::Sum, operand, mean);
    } else if (t == "aten::amax" || t == "aten::amin") {
      add_loop(n->result(), t == "aten::amax" ? ReductionType::Max : ReductionType::Min, operand, "");
    } else {
      // var_mean: the mean, then Σ(x - mean)² over count - correction
      // (ATen's Welford gives the same values up to rounding).
      double correction = 1;
      if (t == "aten::var_mean.dim") {
        correction = n->arg(2).constant().toBool() ? 1 : 0;
      } else {
        const c10::IValue& c = n->arg(2).constant();
        correction = c.isNone() ? 1 : c.isDouble() ? c.toDouble() : c.isInt() ? c.toInt() : c.toScalar().toDouble();
      }
      const ir::Value* var = n->result(0);
      const ir::Value* mv = n->result(1);
      add_loop(mv, ReductionType::Sum, operand, mean);
      int mean_buffer = p_.buffer_of.at(mv);
      auto squared = [operand, mean_buffer, T](Body& b, const std::vector<Expr>& index,
                                               const std::vector<Expr>& rindex) {
        Val xv2 = operand(b, index, rindex);
        Val m = b.load(mean_buffer, index);
        Val d = b.compute("(" + xv2.name + " - " + m.name + ")", std::max(xv2.level, m.level), T);
        return b.compute("(" + d.name + " * " + d.name + ")", d.level, T);
      };
      char div[64];
      std::snprintf(div, sizeof div, "%.17g", std::max(0.0, static_cast<double>(count) - correction));
      add_loop(var, ReductionType::Sum, squared, "$ / " + T + "(" + div + ")");
    }
  }

  // -- views --

  void lower_view(const ir::Node* n) {
    const ir::Value* base = n->arg(0).value();
    Lazy in = lazy_.at(base);
    const std::string& t = n->target();
    const std::vector<int64_t>& is = in.sizes;
    for (size_t k = 0; k < n->num_results(); ++k) {
      const ir::Value* out = n->result(k);
      const std::vector<int64_t>& os = out->meta().sizes;
      std::function<std::vector<Expr>(const std::vector<Expr>&)> map;
      if (t == "aten::view" || t == "aten::_unsafe_view" || t == "aten::reshape") {
        map = [is, os](const std::vector<Expr>& i) { return unravel(dot(i, contiguous_strides(os)), is); };
      } else if (t == "aten::expand") {
        map = [is](const std::vector<Expr>& i) { return broadcast(is, i); };
      } else if (t == "aten::permute" || t == "aten::transpose.int" || t == "aten::t") {
        std::vector<int64_t> perm(is.size());
        for (size_t d = 0; d < perm.size(); ++d) perm[d] = static_cast<int64_t>(d);
        if (t == "aten::permute") {
          auto p = n->arg(1).constant().toIntVector();
          for (size_t d = 0; d < p.size(); ++d) perm[d] = wrap_dim(p[d], is.size());
        } else if (is.size() == 2 || t == "aten::transpose.int") {
          int64_t a = t == "aten::t" ? 0 : wrap_dim(n->arg(1).constant().toInt(), is.size());
          int64_t b = t == "aten::t" ? 1 : wrap_dim(n->arg(2).constant().toInt(), is.size());
          if (!is.empty()) std::swap(perm[a], perm[b]);
        }
        map = [perm](const std::vector<Expr>& i) {
          std::vector<Expr> r(perm.size());
          for (size_t d = 0; d < perm.size(); ++d) r[perm[d]] = i[d];
          return r;
        };
      } else if (t == "aten::unsqueeze" || t == "aten::squeeze.dim" || t == "aten::squeeze.dims" ||
                 t == "aten::squeeze") {
        if (t == "aten::unsqueeze") {
          int64_t d0 = wrap_dim(n->arg(1).constant().toInt(), os.size());
          map = [d0](const std::vector<Expr>& i) {
            std::vector<Expr> r;
            for (size_t d = 0; d < i.size(); ++d)
              if (static_cast<int64_t>(d) != d0) r.push_back(i[d]);
            return r;
          };
        } else {
          std::vector<bool> dropped(is.size(), false);
          if (t == "aten::squeeze") {
            for (size_t d = 0; d < is.size(); ++d) dropped[d] = is[d] == 1;
          } else {
            const c10::IValue& a = n->arg(1).constant();
            std::vector<int64_t> ds = a.isInt() ? std::vector<int64_t>{a.toInt()} : a.toIntVector();
            for (int64_t d : ds) {
              int64_t w = wrap_dim(d, is.size());
              if (w < static_cast<int64_t>(is.size()) && is[w] == 1) dropped[w] = true;
            }
          }
          map = [dropped](const std::vector<Expr>& i) {
            std::vector<Expr> r(dropped.size());
            size_t j = 0;
            for (size_t d = 0; d < dropped.size(); ++d) r[d] = dropped[d] ? Expr() : i[j++];
            return r;
          };
        }
      } else if (t == "aten::slice.Tensor" || t == "aten::split.Tensor" || t == "aten::split_with_sizes") {
        int64_t dim = 0, start = 0, step = 1;
        if (t == "aten::slice.Tensor") {
          dim = wrap_dim(n->arg(1).constant().toInt(), is.size());
          const c10::IValue& s = n->arg(2).constant();
          start = s.isNone() ? 0 : s.toInt();
          if (start < 0) start += is[dim];
          start = std::clamp<int64_t>(start, 0, is[dim]);
          step = n->arg(4).constant().toInt();
        } else {
          dim = wrap_dim(n->arg(2).constant().toInt(), is.size());
          for (size_t j = 0; j < k; ++j) start += n->result(j)->meta().sizes[dim];
        }
        map = [dim, start, step](const std::vector<Expr>& i) {
          std::vector<Expr> r = i;
          r[dim] = i[dim] * step + Expr(start);
          return r;
        };
      } else if (t == "aten::select.int" || t == "aten::unbind.int") {
        int64_t dim = wrap_dim(n->arg(1).constant().toInt(), is.size());
        int64_t index = t == "aten::unbind.int" ? static_cast<int64_t>(k) : n->arg(2).constant().toInt();
        if (index < 0) index += is[dim];
        map = [dim, index](const std::vector<Expr>& i) {
          std::vector<Expr> r = i;
          r.insert(r.begin() + dim, Expr(index));
          return r;
        };
      } else {  // alias, detach, lift_fresh
        map = [](const std::vector<Expr>& i) { return i; };
      }
      Lazy l;
      l.sizes = os;
      l.dtype = out->meta().dtype;
      l.ops = in.ops;
      l.nodes = in.nodes;
      l.view = true;
      l.base = base;
      PointwiseFn f = in.fn;
      l.fn = [f, map](Body& b, const std::vector<Expr>& i) { return f(b, map(i)); };
      define_lazy(out, std::move(l));
    }
    bool tensor = false;
    for (const auto& r : n->results()) tensor = tensor || needs_tensor(r.get());
    if (tensor) ensure_tensor(n->result());
  }

  // -- extern kernels --

  // The buffer a value's memory belongs to (a view's is its base's).
  const ir::Value* root(const ir::Value* v) const {
    auto it = lazy_.find(v);
    while (it != lazy_.end() && it->second.view && it->second.base) {
      v = it->second.base;
      it = lazy_.find(v);
    }
    return v;
  }

  void lower_extern(const ir::Node* n) {
    if (n->is_mutating()) {
      std::unordered_set<int> written;
      for (const ir::Value* v : n->written())
        if (auto b = p_.buffer_of.find(root(v)); b != p_.buffer_of.end()) written.insert(b->second);
      // A view of a written buffer aliases it (its readers see the write, as
      // in eager); anything else computed from it is realized now.
      std::erase_if(unrealized_, [&](const ir::Value* v) { return p_.buffer_of.contains(v) || pending_[v] <= 0; });
      std::vector<const ir::Value*> pending;
      for (const ir::Value* v : unrealized_) {
        auto rb = p_.buffer_of.find(root(v));
        if (lazy_.at(v).view && rb != p_.buffer_of.end() && written.contains(rb->second)) continue;
        pending.push_back(v);
      }
      std::sort(pending.begin(), pending.end(), [&](const ir::Value* a, const ir::Value* b) {
        return order_.at(a->node()) != order_.at(b->node()) ? order_.at(a->node()) < order_.at(b->node())
                                                            : a->index() < b->index();
      });
      for (const ir::Value* v : pending) {
        const std::vector<int>& reads = buffers_read(v);
        if (std::any_of(reads.begin(), reads.end(), [&](int b) { return written.contains(b); })) realize(v);
      }
    }
    if (write_in_place(n)) return;
    for (const ir::Value* v : n->inputs()) ensure_tensor(v);
    p_.items.push_back({n, -1});
    for (const auto& r : n->results())
      if (loop_tensor(r.get()) || host_scalar(r.get())) add_buffer(r.get(), Buffer::Extern);
    if (is_wait(n) && n->arg(0).is_value())
      for (const auto& r : n->results())
        if (auto b = p_.buffer_of.find(r.get()); b != p_.buffer_of.end())
          waited_.emplace(b->second, order_.at(n->arg(0).value()->node()));
  }

  // A wait for a collective (crucible::wait_tensor, _c10d_functional's).
  static bool is_wait(const ir::Node* n) { return ir::is_collective(*n) && n->target().ends_with("::wait_tensor"); }

  // Note [Sinking waits]
  // A wait makes what follows it on the stream wait for a collective (on
  // the host, for Gloo). Lowering meets it where the graph put it, before
  // the first node that reads its result; but the loops reading it run
  // where they are realized, often much later (an optimizer's update is
  // computed at its parameter's write-back, Note [Trailing write-backs]).
  // So each wait moves down the items to just before the first item that
  // reads what it returns, and the work in between runs while the
  // collective is in flight (torch/_inductor/comms.py's sink_waits). Waits
  // do not write what other items read, and every rank lowers the same
  // graph the same way, so the ranks still issue their collectives in one
  // order.
  void sink_waits() {
    if (std::none_of(p_.items.begin(), p_.items.end(),
                     [](const Item& it) { return it.extern_node && is_wait(it.extern_node); }))
      return;
    std::vector<Item> items;
    items.reserve(p_.items.size());
    std::vector<std::pair<Item, std::vector<int>>> held;  // waits not yet needed, and the buffers they return
    auto buffers_of = [&](const ir::Node* n) {
      std::vector<int> out;
      for (const auto& r : n->results())
        if (auto b = p_.buffer_of.find(r.get()); b != p_.buffer_of.end()) out.push_back(b->second);
      return out;
    };
    for (const Item& it : p_.items) {
      if (it.extern_node && is_wait(it.extern_node)) {
        held.emplace_back(it, buffers_of(it.extern_node));
        continue;
      }
      std::unordered_set<int> reads;
      if (it.extern_node) {
        for (const ir::Value* v : it.extern_node->inputs())
          for (const ir::Value* u : {v, root(v)})
            if (auto b = p_.buffer_of.find(u); b != p_.buffer_of.end()) reads.insert(b->second);
      } else {
        const Loop& l = p_.loops[static_cast<size_t>(it.loop)];
        for (const Read& r : reads_of(p_, l, l.numel(), l.reduction ? l.rnumel() : 1)) reads.insert(r.buffer);
      }
      std::erase_if(held, [&](const auto& h) {
        const bool needed = std::any_of(h.second.begin(), h.second.end(), [&](int b) { return reads.contains(b); });
        if (needed) items.push_back(h.first);
        return needed;
      });
      items.push_back(it);
    }
    for (const auto& h : held) items.push_back(h.first);
    p_.items = std::move(items);
  }

  // Note [In-place write-backs]
  // copy_(dst, src) with dst a graph input and src a value whose every other
  // reader is lowered already (an optimizer's new parameter or state,
  // functionalization's write-back): src's loop writes dst's memory
  // directly, with no buffer of its own and no copy. Where src is a buffer
  // already (an extern kernel's result), a copy loop writes dst. Safe when src reads dst only at the element it
  // writes (read, then write, in one iteration); the readers of dst's old
  // value were realized above, and the scheduler keeps them before the
  // write (a read of dst elsewhere in the same kernel must be in the same
  // outer iteration, Note [Fusion]).
  bool write_in_place(const ir::Node* n) {
    if (n->target() != "aten::copy_" || n->num_results() != 1 || n->result()->has_users()) return false;
    if (!n->arg(0).is_value() || !n->arg(1).is_value()) return false;
    const ir::Value* dst = n->arg(0).value();
    const ir::Value* src = n->arg(1).value();
    auto db = p_.buffer_of.find(dst);
    auto sl = lazy_.find(src);
    if (!dst->node()->is_placeholder() || db == p_.buffer_of.end() || sl == lazy_.end() || sl->second.view)
      return false;
    // A src realized already (an extern kernel's result: batch norm's new
    // running statistics) is copied by a loop, which the scheduler launches
    // with the other write-backs instead of one copy kernel each.
    if (auto sb = p_.buffer_of.find(src);
        sb != p_.buffer_of.end() ? p_.buffers[sb->second].kind == Buffer::Input : pending_[src] > 0)
      return false;
    const Buffer& d = p_.buffers[db->second];
    if (!loop_tensor(dst) || d.kind != Buffer::Input || d.loop >= 0 || !dense(dst->meta()) ||
        d.sizes != sl->second.sizes || d.dtype != sl->second.dtype)
      return false;
    Loop loop;
    loop.buffer = db->second;
    loop.sizes = d.sizes;
    loop.fn = sl->second.fn;
    Expr o = Expr::var("o", loop.numel());
    for (const Read& r : reads_of(p_, loop, loop.numel(), 1))
      if (r.buffer == loop.buffer && !(r.flat == o)) return false;
    loop.nodes = sl->second.nodes;
    loop.nodes.push_back(n);
    p_.buffers[db->second].loop = static_cast<int>(p_.loops.size());
    p_.items.push_back({nullptr, static_cast<int>(p_.loops.size())});
    p_.loops.push_back(std::move(loop));
    return true;
  }

  const ir::Graph& g_;
  Program p_;
  std::unordered_map<const ir::Node*, Kind> kind_;
  std::unordered_map<const ir::Node*, size_t> order_;
  std::unordered_map<const ir::Value*, Lazy> lazy_;
  // Lazy values that may still be read, in definition order: what lower_extern
  // checks before a write (those realized or read by every user drop out).
  std::vector<const ir::Value*> unrealized_;
  std::unordered_map<const ir::Value*, std::vector<int>> reads_;  // buffers_read
  std::unordered_map<const ir::Value*, int> pending_;
  std::unordered_map<int, size_t> waited_;  // a wait's result buffer -> where its collective was issued
  std::unordered_set<const ir::Value*> outputs_;
};

}  // namespace

Program lower(const ir::Graph& graph) { return Lowerer(graph).run(); }

}  // namespace crucible::inductor::detail
