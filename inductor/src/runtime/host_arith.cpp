#include "runtime/host_arith.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/Scalar.h>

#include <cmath>
#include <string_view>

namespace crucible::inductor::detail {

// Note [Host arithmetic]
// A training step on a GPU keeps each parameter's step count and the
// learning rate as 0-dim float64 CPU tensors (Note [Traceable optimizer
// state]), and Adam computes its bias corrections from them on the host:
// eight ops a parameter (step + 1, beta^step twice, 1 - x twice, a square
// root, lr / bc, a negation). These are extern kernels of the GPU graph, and
// each boxed dispatcher call costs microseconds: ResNet-18's 62 parameters
// make about 500 of them a step, over a millisecond of host time in a step
// whose GPU work is 8 ms and whose launches the host must keep ahead of.
// (TorchInductor renders such CPU nodes of a CUDA graph as a C++ kernel; the
// values here are scalars, so the run-time plan computes them itself.)
// The plan evaluates each such op on doubles, as ATen's CPU kernel does for
// one element (its scalar loop: a + alpha * b with alpha ±1, a * b, a / b,
// std::pow, and pow's special exponents of PowKernel.cpp), and
// stores the result in a fresh 0-dim tensor made without the dispatcher, so
// extern kernels and the graph's outputs see what eager would have made.
// A step count stays bitwise what torch::optim's host doubles give; tests
// compare every op with ATen's on the same values, NaN, infinities and
// signed zeros included. An operand that is not a 0-dim float64 CPU tensor
// at run time (the caller passed another) takes the dispatcher as before.
// Square roots stay ATen's: its CPU sqrt runs through the vectorized math
// library, whose double sqrt(0.5) differs from std::sqrt's in the last bit.

namespace {

// The numeric constant `a` of a node, when it is one.
std::optional<double> number(const ir::Argument& a) {
  if (!a.is_constant()) return std::nullopt;
  const c10::IValue& v = a.constant();
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isBool()) return v.toBool() ? 1.0 : 0.0;
  if (v.isScalar() && !v.toScalar().isComplex()) return v.toScalar().toDouble();
  return std::nullopt;
}

bool host_double_value(const ir::Value* v) {
  if (!v || !v->is_tensor() || !v->has_meta()) return false;
  const ir::TensorMeta& m = v->meta();
  return m.device.is_cpu() && m.sizes.empty() && m.dtype == c10::kDouble;
}

}  // namespace

std::optional<HostArith> host_arith_of(const ir::Node& n) {
  if (!n.is_call() || n.num_results() != 1 || !host_double_value(n.result())) return std::nullopt;
  const std::string& t = n.target();
  const size_t nargs = n.args().size();
  HostArith h;
  // Operand i from argument `at`: a float64 host tensor, or a number.
  auto operand = [&](size_t i, size_t at) {
    if (at >= nargs) return false;
    const ir::Argument& a = n.arg(at);
    if (a.is_value()) {
      if (!host_double_value(a.value())) return false;
      h.arg[i] = static_cast<int>(at);
      return true;
    }
    const std::optional<double> c = number(a);
    if (!c) return false;
    h.constant[i] = *c;
    return true;
  };
  // alpha of add/sub/rsub: ±1 only, where a + alpha * b rounds once whether
  // or not ATen's compiler contracted it into a fused multiply-add.
  auto alpha = [&](size_t at, double sign) {
    const std::optional<double> a = at < nargs ? number(n.arg(at)) : std::optional<double>(1.0);
    if (!a || (*a != 1 && *a != -1)) return false;
    h.alpha = sign * *a;
    return true;
  };
  using Op = HostArith::Op;
  if (t == "aten::add.Tensor" || t == "aten::add.Scalar" || t == "aten::sub.Tensor" || t == "aten::sub.Scalar") {
    h.op = Op::Add;
    if (!operand(0, 0) || !operand(1, 1) || !alpha(2, t.starts_with("aten::sub") ? -1 : 1)) return std::nullopt;
    return h;
  }
  if (t == "aten::rsub.Tensor" || t == "aten::rsub.Scalar") {  // other - alpha * self
    h.op = Op::Add;
    if (!operand(0, 1) || !operand(1, 0) || !alpha(2, -1)) return std::nullopt;
    return h;
  }
  if (t == "aten::mul.Tensor" || t == "aten::mul.Scalar" || t == "aten::div.Tensor" || t == "aten::div.Scalar") {
    h.op = t.starts_with("aten::mul") ? Op::Mul : Op::Div;
    if (nargs != 2 || !operand(0, 0) || !operand(1, 1)) return std::nullopt;
    return h;
  }
  if (t == "aten::neg" || t == "aten::reciprocal") {
    h.op = t == "aten::neg" ? Op::Neg : Op::Reciprocal;
    if (nargs != 1 || !operand(0, 0)) return std::nullopt;
    return h;
  }
  if (t == "aten::pow.Scalar") {  // base ** exponent tensor; a base of 1 gives 1 (Pow.cpp)
    if (nargs != 2 || !operand(0, 0) || !operand(1, 1)) return std::nullopt;
    h.op = h.constant[0] == 1 ? Op::One : Op::Pow;
    return h;
  }
  if (t == "aten::pow.Tensor_Scalar") {
    if (nargs != 2 || !operand(0, 0) || !operand(1, 1)) return std::nullopt;
    // Pow.cpp and PowKernel.cpp: exponents 0 and 1 are a fill and a copy,
    // 2 and 3 products, ±0.5, -1 and -2 roots and reciprocals.
    const double e = h.constant[1];
    if (e == 0) {
      h.op = Op::One;
    } else if (e == 1) {
      h.op = Op::Identity;
    } else if (e == 2) {
      h.op = Op::Square;
    } else if (e == 3) {
      h.op = Op::Cube;
    } else if (e == -1) {
      h.op = Op::Reciprocal;
    } else if (e == 0.5 || e == -0.5 || e == -2) {
      return std::nullopt;  // sqrt, 1 / sqrt(x), 1 / (x * x): ATen rounds them its own way (the Note)
    } else {
      h.op = Op::Pow;
    }
    return h;
  }
  if (t == "aten::pow.Tensor_Tensor") {
    h.op = Op::Pow;
    if (nargs != 2 || !operand(0, 0) || !operand(1, 1)) return std::nullopt;
    return h;
  }
  return std::nullopt;
}

double evaluate(const HostArith& h, double a, double b) {
  using Op = HostArith::Op;
  switch (h.op) {
    case Op::Add:
      return h.alpha == 1 ? a + b : a - b;
    case Op::Mul:
      return a * b;
    case Op::Div:
      return a / b;
    case Op::Neg:
      return -a;
    case Op::Reciprocal:
      return 1.0 / a;
    case Op::Pow:
      return std::pow(a, b);
    case Op::Square:
      return a * a;
    case Op::Cube:
      return a * a * a;
    case Op::One:
      return 1.0;
    case Op::Identity:
      return a;
  }
  return a;
}

std::optional<double> host_double(const at::Tensor& x) {
  if (!x.defined() || x.dim() != 0 || !x.is_cpu() || x.scalar_type() != c10::kDouble) return std::nullopt;
  return *x.const_data_ptr<double>();
}

at::Tensor host_tensor(double v) {
  at::Tensor t = at::detail::empty_cpu({}, c10::kDouble, std::nullopt, std::nullopt, std::nullopt, std::nullopt);
  *t.mutable_data_ptr<double>() = v;
  return t;
}

}  // namespace crucible::inductor::detail
