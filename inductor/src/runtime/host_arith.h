// Private: arithmetic on 0-dim float64 CPU tensors, done by the run-time
// plan without the dispatcher (Note [Host arithmetic] in
// runtime/host_arith.cpp).
#pragma once

#include <crucible/ir/graph.h>

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <optional>

namespace crucible::inductor::detail {

/// One op of host arithmetic: r = f(a, b), where each operand is the node's
/// argument `arg[i]` (a 0-dim float64 CPU tensor at run time) or, where
/// `arg[i]` is -1, the number `constant[i]`.
struct HostArith {
  enum class Op : uint8_t { Add, Mul, Div, Neg, Reciprocal, Pow, Square, Cube, One, Identity };
  Op op = Op::Add;
  std::array<int, 2> arg{-1, -1};
  std::array<double, 2> constant{0, 0};
  double alpha = 1;  // Add: a + alpha * b, alpha being 1 or -1
};

/// The host arithmetic `n` is: an op the table knows, whose result and
/// tensor operands are 0-dim float64 CPU tensors and whose other operands
/// are numeric constants; nullopt for any other node (it stays a boxed
/// dispatcher call).
std::optional<HostArith> host_arith_of(const ir::Node& n);

/// a and b's value under `h`, as ATen's CPU kernel computes it for 0-dim
/// float64 tensors (bitwise).
double evaluate(const HostArith& h, double a, double b);

/// `x`'s value when it is a defined 0-dim float64 CPU tensor.
std::optional<double> host_double(const at::Tensor& x);

/// A 0-dim float64 CPU tensor holding `v`, made without the dispatcher.
at::Tensor host_tensor(double v);

}  // namespace crucible::inductor::detail
