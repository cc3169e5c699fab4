// Keeps the default generators' states across a compilation. Internal to
// Crucible: shared with the pipeline's compiled training step.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <utility>
#include <vector>

namespace crucible::autograd::detail {

/// Saves the default generators' states (the CPU one, and each CUDA
/// device's where CUDA is present) and restores them on destruction, also
/// when unwinding. See Note [RNG during compilation] in aot_dispatch.h.
class RngStateGuard {
 public:
  RngStateGuard();
  ~RngStateGuard();
  RngStateGuard(const RngStateGuard&) = delete;
  RngStateGuard& operator=(const RngStateGuard&) = delete;

 private:
  std::vector<std::pair<at::Generator, at::Tensor>> saved_;
};

}  // namespace crucible::autograd::detail
