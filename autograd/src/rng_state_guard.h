// Private: keeps the default generators' states across a compilation.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <utility>
#include <vector>

namespace crucible::autograd::detail {

// Note [RNG during compilation]
// Compiling runs the function several times (the metadata analysis, the
// joint or inference trace, again after a wrapper changes the calling
// convention), and each run draws from the default generators. The guard
// saves the state of the CPU generator, and of every CUDA device's
// generator where CUDA is present, and restores them when the compilation
// ends (also when it throws), so the compiled call then draws exactly what
// the eager call would have drawn from the same state. Random ops stay in
// the forward graph and draw at run time (unless AotConfig::
// functionalize_rng_ops, Note [Functionalized RNG]); what the backward needs
// from them (dropout's mask) is a saved value, so forward and backward
// agree as they do in eager. Given the same generator state before the
// call, a compiled CPU dropout therefore equals eager's bit for bit: the
// interpreter runs the same kernels, drawing in the same order.
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
