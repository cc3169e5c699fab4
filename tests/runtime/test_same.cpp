// same() against the comparisons it stands for, computed directly.
#include <crucible/runtime/error.h>
#include <crucible/runtime/same.h>

#include <ATen/ATen.h>

#include <cmath>

#include "catch.h"

using crucible::runtime::same;
using crucible::runtime::SameOptions;

namespace {

double rmse(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).square().mean().sqrt().item<double>();
}

}  // namespace

TEST_CASE("same passes equal and close tensors and fails far ones", "[runtime][same]") {
  at::manual_seed(0);
  const auto ref = at::randn({64, 32});
  REQUIRE(same(ref, ref.clone()));
  // 1e-6 relative perturbation: inside allclose(atol=rtol=1e-4).
  REQUIRE(same(ref, ref * (1 + 1e-6)));
  const auto far = ref + 0.5;
  const auto r = same(ref, far);
  REQUIRE_FALSE(r);
  REQUIRE_THAT(r.reason, CRUCIBLE_HAS_SUBSTR("not allclose within tol=0.0001"));
  // A looser tol lets it through, exactly when allclose says so.
  REQUIRE(same(ref, far, SameOptions{.tol = 0.6}).ok == at::allclose(ref, far, 0.6, 0.6));
}

TEST_CASE("same reports size and dtype mismatches, and casts when exact_dtype is off", "[runtime][same]") {
  const auto ref = at::ones({2, 3});
  auto r = same(ref, at::ones({3, 2}));
  REQUIRE_FALSE(r);
  REQUIRE_THAT(r.reason, CRUCIBLE_HAS_SUBSTR("sizes differ"));
  r = same(ref, at::ones({2, 3}, at::kDouble));
  REQUIRE_FALSE(r);
  REQUIRE_THAT(r.reason, CRUCIBLE_HAS_SUBSTR("dtypes differ"));
  REQUIRE(same(ref, at::ones({2, 3}, at::kDouble), SameOptions{.exact_dtype = false}));
  REQUIRE(same(at::tensor({1, 0}) > 0, at::tensor({1, 0}) > 0));
  REQUIRE_FALSE(same(at::tensor({1, 0}) > 0, at::tensor({1, 1}) > 0));
}

TEST_CASE("same treats NaN as torch.allclose does, by equal_nan", "[runtime][same]") {
  const auto ref = at::tensor({1.0f, NAN, 3.0f});
  const auto res = at::tensor({1.0f, NAN, 3.0f});
  REQUIRE(same(ref, res, SameOptions{.equal_nan = true}).ok == at::allclose(ref, res, 1e-4, 1e-4, true));
  REQUIRE(same(ref, res, SameOptions{.equal_nan = true}));
  const auto r = same(ref, res);
  REQUIRE_FALSE(r);
  REQUIRE_THAT(r.reason, CRUCIBLE_HAS_SUBSTR("NaNs present"));
  // NaN in a different place fails even with equal_nan.
  REQUIRE_FALSE(same(ref, at::tensor({NAN, 2.0f, 3.0f}), SameOptions{.equal_nan = true}));
  // An fp64 reference does not rescue NaNs: the rmse bound is NaN.
  REQUIRE_FALSE(same(ref, res, {}, ref.to(at::kDouble)));
}

TEST_CASE("same with an fp64 reference accepts results no worse than eager's own error", "[runtime][same]") {
  at::manual_seed(1);
  // 4096 elements: the 2x multiplier applies (see Note [same() with an fp64 reference]).
  const auto fp64 = at::randn({4096}, at::kDouble);
  const auto ref = (fp64 + 1e-3 * at::randn({4096}, at::kDouble)).to(at::kFloat);
  const auto res_ok = (fp64 + 1e-3 * at::randn({4096}, at::kDouble)).to(at::kFloat);
  const auto res_bad = (fp64 + 1e-2 * at::randn({4096}, at::kDouble)).to(at::kFloat);
  const double tol = 1e-4;
  // Neither result is allclose at tol: only the rmse path can pass them.
  REQUIRE_FALSE(at::allclose(ref, res_ok, tol, tol));
  REQUIRE_FALSE(same(ref, res_ok));  // without the fp64 reference it fails
  const bool expect_ok = rmse(fp64, res_ok) <= 2.0 * rmse(fp64, ref) + tol / 10;
  const bool expect_bad = rmse(fp64, res_bad) <= 2.0 * rmse(fp64, ref) + tol / 10;
  REQUIRE(expect_ok);
  REQUIRE_FALSE(expect_bad);
  REQUIRE(same(ref, res_ok, {}, fp64).ok == expect_ok);
  const auto r = same(ref, res_bad, {}, fp64);
  REQUIRE(r.ok == expect_bad);
  REQUIRE_THAT(r.reason, CRUCIBLE_HAS_SUBSTR("rmse against fp64"));
  // A small tensor gets the 3x multiplier: 2.5x eager's error passes there.
  const auto small64 = at::randn({100}, at::kDouble);
  const auto noise = at::randn({100}, at::kDouble);
  const auto small_ref = (small64 + 1e-3 * noise).to(at::kFloat);
  const auto small_res = (small64 - 2.5e-3 * noise).to(at::kFloat);
  REQUIRE(rmse(small64, small_res) > 2.0 * rmse(small64, small_ref) + tol / 10);
  REQUIRE(rmse(small64, small_res) <= 3.0 * rmse(small64, small_ref) + tol / 10);
  REQUIRE(same(small_ref, small_res, {}, small64));
}

TEST_CASE("same with cos_similarity ignores scale but not direction", "[runtime][same]") {
  at::manual_seed(2);
  const auto ref = at::randn({256});
  REQUIRE(same(ref, ref * 1.5, SameOptions{.cos_similarity = true}));
  REQUIRE_FALSE(same(ref, ref * 1.5));
  const auto other = at::randn({256});
  const double sim = at::cosine_similarity(ref, other, 0).item<double>();
  REQUIRE(sim < 0.99);
  const auto r = same(ref, other, SameOptions{.cos_similarity = true});
  REQUIRE_FALSE(r);
  REQUIRE_THAT(r.reason, CRUCIBLE_HAS_SUBSTR("cosine similarity"));
}

TEST_CASE("same over lists names the failing element; None gradients match None", "[runtime][same]") {
  const std::vector<at::Tensor> ref{at::ones({2}), at::Tensor(), at::zeros({3})};
  REQUIRE(same(ref, {at::ones({2}), at::Tensor(), at::zeros({3})}));
  auto r = same(ref, {at::ones({2}), at::Tensor(), at::ones({3})});
  REQUIRE_FALSE(r);
  REQUIRE_THAT(r.reason, CRUCIBLE_HAS_SUBSTR("element 2"));
  r = same(ref, {at::ones({2}), at::ones({1}), at::zeros({3})});
  REQUIRE_FALSE(r);
  REQUIRE_THAT(r.reason, CRUCIBLE_HAS_SUBSTR("reference is undefined"));
  r = same(ref, {at::ones({2})});
  REQUIRE_FALSE(r);
  REQUIRE_THAT(r.reason, CRUCIBLE_HAS_SUBSTR("length mismatch"));
  REQUIRE_THROWS_AS(same(ref, ref, {}, {at::ones({2}, at::kDouble)}), crucible::runtime::WrapperError);
}
