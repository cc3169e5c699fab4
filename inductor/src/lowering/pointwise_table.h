// Private: lowering's table of pointwise ops (Note [Lowering]): for each
// ATen op the loops compute elementwise, which arguments are tensors and
// constants, which dtypes it takes, and its formula as C-like text (the
// same text both renderers emit).
#pragma once

#include "loop_ir/loop_ir.h"

#include <crucible/ir/graph.h>

#include <ATen/core/ivalue.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace crucible::inductor::detail {

/// How the loops compute one pointwise op.
struct PointwiseOp {
  /// What a formula is written from: the operands' values (`x`, in
  /// tensor_args order), the node (its constants), the C++ type the
  /// formula is evaluated in, and the element's index.
  struct Ctx {
    const std::vector<std::string>& x;
    const ir::Node* n;
    const std::string& T;            // the C++ type the formula is evaluated in
    const std::vector<Expr>& index;  // the element's index (ops that read it: arange)
  };
  /// The formula: C-like text computing the element.
  using Render = std::function<std::string(const Ctx&)>;

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

/// The pointwise ops the loops compute, by target ("aten::add.Tensor").
const std::unordered_map<std::string, PointwiseOp>& pointwise_ops();

/// The C++ literal of constant `v` in type `T` (an integer type, bool,
/// float or double): integers exactly, NaN and the infinities through
/// std::numeric_limits, other numbers to 17 significant digits.
std::string literal(const c10::IValue& v, const std::string& T);

/// Whether argument `a` is a numeric constant (int, double, bool or a
/// real Scalar).
bool numeric_constant(const ir::Argument& a);

/// f32, f64, bf16 or f16.
bool is_float(c10::ScalarType t);

/// Whether a scalar operand of a higher category (bool < integer < float)
/// than tensor dtype `t` promotes the op's computation, as ATen's
/// result_type rules say.
bool scalar_promotes(const c10::IValue& v, c10::ScalarType t);

/// The type node `n` computes `op`'s formula in: its result's dtype, or
/// its first tensor operand's for ops that compute in their operands'
/// type (comparisons).
c10::ScalarType compute_type(const ir::Node* n, const PointwiseOp& op);

}  // namespace crucible::inductor::detail
