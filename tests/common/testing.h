// Helpers shared by the test suites: comparisons against eager LibTorch.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <stdlib.h>

#include <cstdlib>

#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace crucible::testing {

/// Where `a` is farther than `bound` from `e` (all float64, of one shape):
/// a finite pair by more than the bound; otherwise exactly, since a bound
/// against an infinity is inf (or NaN for 0 * inf) and would let any value
/// pass: an infinity only against the same infinity, NaN only against NaN.
/// With `signed_zeros`, also where one is -0 and the other +0.
inline at::Tensor out_of_bound(const at::Tensor& a, const at::Tensor& e, const at::Tensor& bound, bool signed_zeros) {
  const at::Tensor both_nan = a.isnan() & e.isnan();
  at::Tensor bad = at::where(a.isfinite() & e.isfinite(), (a - e).abs() > bound, ~both_nan & (a != e));
  if (signed_zeros) bad = bad | (~both_nan & (a.signbit() != e.signbit()));
  return bad;
}

/// Why `actual` is not close to `expected` (shape, dtype or the largest
/// element difference), or "" when it is. Tolerances as torch.testing's
/// assert_close: |a - e| <= atol + rtol * |e| for finite values; infinities
/// and NaNs must match exactly (out_of_bound). With rtol = atol = 0 the
/// comparison is bitwise: -0 differs from +0 too.
inline std::string mismatch(const at::Tensor& actual, const at::Tensor& expected, double rtol, double atol) {
  std::ostringstream os;
  if (actual.defined() != expected.defined()) return "one tensor is undefined";
  if (!actual.defined()) return "";
  if (actual.sizes() != expected.sizes()) {
    os << "sizes differ: " << actual.sizes() << " vs " << expected.sizes();
    return os.str();
  }
  if (actual.scalar_type() != expected.scalar_type()) {
    os << "dtypes differ: " << actual.scalar_type() << " vs " << expected.scalar_type();
    return os.str();
  }
  if (actual.numel() == 0) return "";
  const at::Tensor a = actual.to(at::kDouble).cpu(), e = expected.to(at::kDouble).cpu();
  const at::Tensor bad = out_of_bound(a, e, atol + rtol * e.abs(), rtol == 0 && atol == 0);
  if (!bad.any().item<bool>()) return "";
  const int64_t first = bad.flatten().nonzero()[0].item<int64_t>();
  os << bad.sum().item<int64_t>() << " element(s) differ (rtol " << rtol << ", atol " << atol
     << "); max |diff| of finite values " << (a - e).abs().nan_to_num(0, 0, 0).max().item<double>()
     << "; the first at flat index " << first << ": " << a.flatten()[first].item<double>() << " vs "
     << e.flatten()[first].item<double>();
  return os.str();
}

/// Why `actual`'s sizes, strides or storage offset differ from `expected`'s
/// (what a caller sees of a tensor's layout: a view() that works on one
/// works on the other), or "" when they agree.
inline std::string layout_mismatch(const at::Tensor& actual, const at::Tensor& expected) {
  if (actual.defined() != expected.defined()) return "one tensor is undefined";
  if (!actual.defined()) return "";
  if (actual.sizes() == expected.sizes() && actual.strides() == expected.strides() &&
      actual.storage_offset() == expected.storage_offset())
    return "";
  std::ostringstream os;
  os << "layouts differ: sizes " << actual.sizes() << " strides " << actual.strides() << " offset "
     << actual.storage_offset() << " vs sizes " << expected.sizes() << " strides " << expected.strides() << " offset "
     << expected.storage_offset();
  return os.str();
}

/// Tolerances for gradients of a compiled backward against eager's. The
/// kernels are the same, but where a leaf (or an intermediate) receives
/// several contributions, the compiled graph adds them in its own order and
/// autograd's engine in another; float32 addition in another order differs by
/// a few ulps (about 1e-7 relative per term) on the small tensors tested.
inline constexpr double kGradRtol = 1e-6;
inline constexpr double kGradAtol = 1e-6;

/// Where a suite that can run on either device runs its graphs
/// (CRUCIBLE_TEST_DEVICE: cpu, the default, or cuda).
inline const at::Device& test_device() {
  static const at::Device d = [] {
    const char* e = std::getenv("CRUCIBLE_TEST_DEVICE");
    return e && std::string(e) == "cuda" ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  }();
  return d;
}

/// CUDA asked for and no GPU here: a suite then compiles its graphs' CUDA
/// kernels (with NVRTC) and runs nothing.
inline bool compile_only() { return test_device().is_cuda() && !at::hasCUDA(); }

/// A fresh directory (mode 0700) under the system's temporary directory,
/// named `prefix`-XXXXXX; left behind for a look after a failure.
inline std::string temp_dir(const std::string& prefix) {
  std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
  return tmpl;
}

/// cuDNN's convolutions without TF32 while it lives. By default they round
/// their operands to TF32 (10 bits of mantissa), and a compiled graph's
/// channels-last convolutions (other cuDNN kernels) round other ones: 1e-4
/// apart where float32 agrees to 1e-7. A check of float32 values against
/// eager turns it off, as torch.compile's accuracy runs do.
class NoTf32Convolutions {
 public:
  NoTf32Convolutions() : saved_(at::globalContext().allowTF32CuDNN()) { at::globalContext().setAllowTF32CuDNN(false); }
  ~NoTf32Convolutions() { at::globalContext().setAllowTF32CuDNN(saved_); }
  NoTf32Convolutions(const NoTf32Convolutions&) = delete;
  NoTf32Convolutions& operator=(const NoTf32Convolutions&) = delete;

 private:
  bool saved_;
};

/// Collects the c10 warnings (TORCH_WARN) raised on this thread while it
/// lives, instead of printing them.
class CollectWarnings : public c10::WarningHandler {
 public:
  CollectWarnings() : guard_(this) {}
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
  std::vector<std::string> messages;

 private:
  c10::WarningUtils::WarningHandlerGuard guard_;
};

}  // namespace crucible::testing

/// REQUIRE that two tensors are close; on failure the message says by how much.
#define REQUIRE_CLOSE(actual, expected, rtol, atol)                                                   \
  do {                                                                                                \
    const std::string crucible_mismatch_ = crucible::testing::mismatch(actual, expected, rtol, atol); \
    INFO(crucible_mismatch_);                                                                         \
    REQUIRE(crucible_mismatch_.empty());                                                              \
  } while (0)

/// REQUIRE that two tensors have the same sizes, strides and storage offset.
#define REQUIRE_SAME_LAYOUT(actual, expected)                                                  \
  do {                                                                                         \
    const std::string crucible_layout_ = crucible::testing::layout_mismatch(actual, expected); \
    INFO(crucible_layout_);                                                                    \
    REQUIRE(crucible_layout_.empty());                                                         \
  } while (0)

/// REQUIRE that a compiled result is what eager gave: its sizes, strides
/// and storage offset (REQUIRE_SAME_LAYOUT) and its values (REQUIRE_CLOSE).
/// Each argument is evaluated once.
#define REQUIRE_LIKE_EAGER(actual, expected, rtol, atol)             \
  do {                                                               \
    const at::Tensor crucible_actual_ = (actual);                    \
    const at::Tensor crucible_expected_ = (expected);                \
    REQUIRE_SAME_LAYOUT(crucible_actual_, crucible_expected_);       \
    REQUIRE_CLOSE(crucible_actual_, crucible_expected_, rtol, atol); \
  } while (0)

/// REQUIRE bitwise equality (same sizes, dtype and values, NaNs equal, -0
/// not +0).
#define REQUIRE_EQUAL_TENSORS(actual, expected) REQUIRE_CLOSE(actual, expected, 0.0, 0.0)

/// Skips the rest of the test case where no CUDA device is usable (./x counts
/// the message as a skip under Catch2 2, which has no skipped state).
#define CRUCIBLE_REQUIRE_CUDA()                               \
  do {                                                        \
    if (!at::hasCUDA()) CRUCIBLE_SKIP("no CUDA device here"); \
  } while (0)
