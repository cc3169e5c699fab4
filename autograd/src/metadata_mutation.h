// Private: applying a recorded metadata mutation to a caller's tensor.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>

namespace crucible::autograd::detail {

/// t.as_strided_(sizes, strides, offset). For a tensor that does not
/// require grad the call skips the ADInplaceOrView kernel, so the version
/// counter is not bumped: the change writes no data, and saved values of the
/// compiled forward that view `t` (saved before this epilogue runs, while
/// eager would have saved them after the change) must stay valid. A tensor
/// that requires grad gets the ordinary call, and autograd records it.
inline void apply_metadata(const at::Tensor& t, at::IntArrayRef sizes, at::IntArrayRef strides, int64_t offset) {
  if (t.requires_grad()) {
    t.as_strided_(sizes, strides, offset);
    return;
  }
  at::AutoDispatchBelowADInplaceOrView below;
  t.as_strided_(sizes, strides, offset);
}

}  // namespace crucible::autograd::detail
