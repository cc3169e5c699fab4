// same(): the accuracy check torch/_dynamo/utils.py uses to compare a
// compiled result with eager, tolerant of the rounding a different kernel
// order causes.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace crucible::runtime {

struct SameOptions {
  /// Used as both atol and rtol of the first allclose check, and as the
  /// slack (tol / 10) of the rmse check.
  double tol = 1e-4;
  /// Compare by cosine similarity of the flattened tensors (>= 0.99 passes)
  /// instead of allclose / rmse; for outputs whose scale is meaningless.
  bool cos_similarity = false;
  /// NaNs in the same positions compare equal.
  bool equal_nan = false;
  /// Different dtypes fail; otherwise `ref` is cast to `res`'s dtype first.
  bool exact_dtype = true;
};

/// The verdict, with the reason when it failed ("" when it passed).
struct SameResult {
  bool ok = true;
  std::string reason;
  explicit operator bool() const { return ok; }
};

// Note [same() with an fp64 reference]
// A compiled graph may sum in a different order than eager, so its result
// can differ from eager's by more than `tol` even though neither is wrong.
// When an fp64 reference (the same computation run in float64) is given,
// a result that fails allclose still passes if its error against the fp64
// reference is no worse than a small multiple of eager's own error:
//   rmse(fp64_ref, res) <= m * rmse(fp64_ref, ref) + tol / 10
// with m = 3 for small tensors (fewer than 1000 elements), 4-d tensors whose
// last two sizes are 1, or a loose tol (>= 0.02), where noise dominates the
// error, and m = 2 otherwise. A NaN in ref's error (eager itself is not
// stable in its precision) makes the bound NaN, so the check fails.

/// Compares `res` against `ref` (both tensors, on any device):
///  - both undefined: passes (a None gradient on both sides);
///  - sizes or (with exact_dtype) dtypes differ: fails;
///  - bool tensors: must be equal;
///  - cos_similarity: allclose, else cosine similarity >= 0.99;
///  - otherwise allclose(ref, res, atol=tol, rtol=tol, equal_nan), else, when
///    `fp64_ref` is a float64 tensor, the rmse check of
///    Note [same() with an fp64 reference]; without one, fails.
/// Never throws for tensor contents; mirrors torch._dynamo.utils.same.
SameResult same(const at::Tensor& ref, const at::Tensor& res, const SameOptions& options = {},
                const at::Tensor& fp64_ref = {});

/// Element-wise over lists: lengths must match, and every pair passes
/// (the reason names the first failing index). `fp64_ref` is empty or has
/// one entry per element of `ref`; throws WrapperError otherwise.
SameResult same(const std::vector<at::Tensor>& ref, const std::vector<at::Tensor>& res, const SameOptions& options = {},
                const std::vector<at::Tensor>& fp64_ref = {});

}  // namespace crucible::runtime
