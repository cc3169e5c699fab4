// The suites' comparison helpers (tests/common/testing.h) against the cases
// where a tolerance silently lets anything pass: a bound against an
// infinity is inf (or NaN for rtol 0), and -0 == +0 as numbers. Each helper
// must fail there, or every test built on it could pass while wrong.
#include <ATen/ATen.h>

#include <limits>

#include "catch.h"
#include "testing.h"

using crucible::testing::mismatch;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

at::Tensor t(std::initializer_list<double> values) { return at::tensor(std::vector<double>(values), at::kDouble); }

}  // namespace

TEST_CASE("mismatch passes values within the tolerance and fails beyond it", "[testing]") {
  CHECK(mismatch(t({1.0, 2.0}), t({1.0, 2.0 + 1e-9}), 1e-6, 0).empty());
  CHECK_FALSE(mismatch(t({1.0, 2.0}), t({1.0, 2.1}), 1e-6, 1e-6).empty());
  CHECK_FALSE(mismatch(t({1.0}), t({1.0, 2.0}), 1, 1).empty());
  CHECK_FALSE(mismatch(t({1.0}), at::ones({1}, at::kFloat), 1, 1).empty());
}

TEST_CASE("mismatch is exact on infinities and NaNs whatever the tolerance", "[testing]") {
  for (const double rtol : {0.0, 1e-3, 1.0})
    for (const double atol : {0.0, 1e-3, 1.0}) {
      CAPTURE(rtol, atol);
      CHECK(mismatch(t({kInf, -kInf, kNaN}), t({kInf, -kInf, kNaN}), rtol, atol).empty());
      CHECK_FALSE(mismatch(t({-kInf}), t({kInf}), rtol, atol).empty());
      CHECK_FALSE(mismatch(t({5.0}), t({kInf}), rtol, atol).empty());
      CHECK_FALSE(mismatch(t({kInf}), t({5.0}), rtol, atol).empty());
      CHECK_FALSE(mismatch(t({kNaN}), t({kInf}), rtol, atol).empty());
      CHECK_FALSE(mismatch(t({kInf}), t({kNaN}), rtol, atol).empty());
      CHECK_FALSE(mismatch(t({1.0}), t({kNaN}), rtol, atol).empty());
      CHECK_FALSE(mismatch(t({kNaN}), t({1.0}), rtol, atol).empty());
    }
}

TEST_CASE("REQUIRE_EQUAL_TENSORS's comparison is bitwise: -0 is not +0, but a tolerance takes either", "[testing]") {
  CHECK_FALSE(mismatch(t({-0.0}), t({0.0}), 0, 0).empty());
  CHECK_FALSE(mismatch(t({0.0}), t({-0.0}), 0, 0).empty());
  CHECK(mismatch(t({-0.0, 1.0}), t({-0.0, 1.0}), 0, 0).empty());
  CHECK(mismatch(t({-0.0}), t({0.0}), 1e-6, 1e-9).empty());
}
