// Running an operator on meta tensors: what a call's results look like
// (sizes, strides, offset, dtype) without computing them, as PyTorch's
// FakeTensorMode runs ops on FakeTensors (torch/_subclasses/fake_tensor.py).
// The tracer's fake mode and metadata propagation (propagate_meta.h) both
// run ops this way.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstddef>
#include <cstdint>
#include <functional>

namespace crucible::ir {

/// How a call on meta tensors was computed.
enum class MetaPath : uint8_t {
  Kernel,    ///< LibTorch's Meta kernel (or a composite kernel that works on meta tensors)
  Function,  ///< one of Crucible's meta functions (Note [Meta functions] in meta_functions.cpp)
  StandIns,  ///< the op itself on zero-filled CPU stand-ins (Note [CPU stand-ins])
  Nothing,   ///< not run: the op returns nothing and writes no argument (an assertion)
};

/// Calls `op` boxed on the arguments at the top of `stack` (pushed in schema
/// order, as for c10::OperatorHandle::callBoxed), whose tensors are meta
/// tensors, and leaves its results there in their place. Runs the op's Meta
/// kernel; where LibTorch has none in C++ (it throws
/// c10::NotImplementedError), call_without_meta_kernel. Returns the path
/// taken. Throws c10::Error when the kernel (or the fallback) rejects the
/// arguments; callers name the node.
MetaPath call_on_meta(const c10::OperatorHandle& op, torch::jit::Stack& stack);

/// The fallback of call_on_meta, for callers that run the Meta kernel
/// themselves (the tracer redispatches below its own dispatch key): a meta
/// function of Crucible's where it has one for `op` and these arguments
/// (convolution, convolution_backward, native_batch_norm and its backward on
/// contiguous float inputs), else call_on_cpu_stand_ins; an op that returns
/// nothing and writes no argument (_assert_async) is not run at all, its
/// arguments popped. Returns the path taken (Function, StandIns or Nothing). Throws c10::Error when the CPU kernel
/// fails.
MetaPath call_without_meta_kernel(const c10::OperatorHandle& op, torch::jit::Stack& stack);

/// Runs `op` on zero-filled CPU tensors with the sizes, strides, storage
/// offsets and dtypes of the meta tensors among the arguments at the top of
/// `stack` (Tensor, Tensor?, Tensor[] and Tensor?[] arguments) and replaces
/// its results by meta tensors of the same metadata. Results that are inputs
/// (in-place ops) or views of inputs come back as those meta inputs or views
/// of them; see Note [CPU stand-ins]. Throws c10::Error when the CPU kernel
/// fails.
void call_on_cpu_stand_ins(const c10::OperatorHandle& op, torch::jit::Stack& stack);

/// Replaces every tensor in stack[from, end): a Tensor, or an element of a
/// Tensor[] or Tensor?[] list, by `f` of it (f is also given undefined
/// tensors; a Tensor?[]'s None stays None). Lists are rebuilt, not edited in
/// place, since a boxed caller may still hold them.
void map_tensors(torch::jit::Stack& stack, size_t from, const std::function<at::Tensor(const at::Tensor&)>& f);

}  // namespace crucible::ir
