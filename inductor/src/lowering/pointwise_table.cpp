// Lowering's table of pointwise ops: see lowering/pointwise_table.h.
#include "lowering/pointwise_table.h"

#include <c10/core/Scalar.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdio>
#include <limits>

namespace crucible::inductor::detail {

namespace {

using Ctx = PointwiseOp::Ctx;
using Render = PointwiseOp::Render;

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

}  // namespace

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

const std::unordered_map<std::string, PointwiseOp>& pointwise_ops() {
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

// An int64 tensor compared with 2.5 is compared as float, a bool one with
// 2 as int64.
bool scalar_promotes(const c10::IValue& v, c10::ScalarType t) {
  const c10::Scalar s = v.toScalar();
  const int category = s.isBoolean() ? 0 : s.isIntegral(/*includeBool=*/false) ? 1 : 2;
  const int tensor_category = t == c10::kBool ? 0 : c10::isIntegralType(t, /*includeBool=*/false) ? 1 : 2;
  return category > tensor_category;
}

c10::ScalarType compute_type(const ir::Node* n, const PointwiseOp& op) {
  if (!op.compute_in_operands) return n->result()->meta().dtype;
  return n->arg(op.tensor_args[0]).value()->meta().dtype;
}

}  // namespace crucible::inductor::detail
