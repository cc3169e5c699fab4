// Keeps the default generators' states across a compilation (see Note [RNG
// during compilation] in autograd/aot_dispatch.h).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <utility>
#include <vector>

namespace crucible::runtime {

/// Saves the default generators' states (the CPU one, and each CUDA
/// device's where CUDA is present) and restores them on destruction, also
/// when unwinding.
class RngStateGuard {
 public:
  RngStateGuard();
  ~RngStateGuard();
  RngStateGuard(const RngStateGuard&) = delete;
  RngStateGuard& operator=(const RngStateGuard&) = delete;

 private:
  std::vector<std::pair<at::Generator, at::Tensor>> saved_;
};

}  // namespace crucible::runtime
