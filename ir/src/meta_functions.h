// Output metadata, computed in C++, for ops LibTorch has no Meta kernel for
// and whose CPU stand-in run is costly. See Note [Meta functions].
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace crucible::ir::detail {

/// Replaces `op`'s arguments at the top of `stack` (meta tensors) by meta
/// results, as its Meta kernel would, and returns true; returns false with
/// the stack untouched when there is no function for `op` or its arguments
/// are outside what the function covers.
bool call_meta_function(const c10::OperatorHandle& op, torch::jit::Stack& stack);

}  // namespace crucible::ir::detail
