// torch.autocast for a C++ scope.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace crucible::runtime {

/// Autocast on `device` in `dtype` for the guard's lifetime, as Python's
/// `with torch.autocast(device_type, dtype):` (torch/amp/autocast_mode.py):
/// ops in autocast's lower-precision list (matmuls, convolutions, linear,
/// scaled_dot_product_attention) then run in `dtype` (kBFloat16 or kHalf) on
/// that device's float32 tensors. On destruction it restores the state it
/// found, and on leaving the outermost autocast scope clears autocast's
/// cache of cast weights: a training step changes the weights in place, so a
/// cast kept for the next step would be stale. Wrap the forward and the
/// loss, not the backward or the optimizer, as with torch.autocast; a
/// compiled training step traces the casts the guard makes (the graph runs
/// them, and no autocast, at every call). Throws c10::Error for a device
/// autocast does not support. Not copyable.
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device, c10::ScalarType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_;
  bool was_enabled_;
  c10::ScalarType was_dtype_;
};

}  // namespace crucible::runtime
