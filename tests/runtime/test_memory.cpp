// runtime::memory_peaks against what a test allocates itself: the peaks rise
// by what was written, stay after it is freed, and start again at a reset.
#include <crucible/runtime/memory.h>

#include <ATen/ATen.h>

#include "catch.h"

using crucible::runtime::memory_peaks;
using crucible::runtime::reset_memory_peaks;

namespace {

constexpr int64_t kBytes = int64_t{256} << 20;

}  // namespace

TEST_CASE("memory peaks: the resident set's peak holds what was written and freed, until a reset", "[memory]") {
  reset_memory_peaks();
  const int64_t before = memory_peaks().rss_bytes;
  REQUIRE(before > 0);
  { const at::Tensor t = at::ones({kBytes / 4}, at::kFloat); }  // every page written, then freed
  const int64_t peak = memory_peaks().rss_bytes;
  CHECK(peak - before >= kBytes * 9 / 10);
  CHECK_FALSE(memory_peaks().device_allocated_bytes.has_value());
  reset_memory_peaks();
  CHECK(memory_peaks().rss_bytes < peak - kBytes / 2);  // the freed pages went back to the system
}

TEST_CASE("memory peaks: a GPU's allocated and reserved peaks, as max_memory_allocated/reserved", "[memory][cuda]") {
  if (!at::hasCUDA()) CRUCIBLE_SKIP("no CUDA device here");
  const c10::Device gpu(c10::kCUDA, 0);
  reset_memory_peaks(gpu);
  const int64_t before = memory_peaks(gpu).device_allocated_bytes.value();
  { const at::Tensor t = at::empty({kBytes}, at::TensorOptions().dtype(at::kByte).device(gpu)); }
  const auto peaks = memory_peaks(gpu);
  CHECK(peaks.device_allocated_bytes.value() - before >= kBytes);
  CHECK(peaks.device_reserved_bytes.value() >= peaks.device_allocated_bytes.value());
  reset_memory_peaks(gpu);
  CHECK(memory_peaks(gpu).device_allocated_bytes.value() < before + kBytes);
}
