// Running an operator on meta tensors: what a call's results look like
// (sizes, strides, offset, dtype) without computing them, as PyTorch's
// FakeTensorMode runs ops on FakeTensors (torch/_subclasses/fake_tensor.py).
// The tracer's fake mode and metadata propagation (propagate_meta.h) both
// run ops this way.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace crucible::ir {

/// Calls `op` boxed on the arguments at the top of `stack` (pushed in schema
/// order, as for c10::OperatorHandle::callBoxed), whose tensors are meta
/// tensors, and leaves its results there in their place. Runs the op's Meta
/// kernel; where LibTorch has none in C++ (it throws
/// c10::NotImplementedError), runs it on CPU stand-ins instead
/// (call_on_cpu_stand_ins). Throws c10::Error when the kernel (or the
/// stand-in run) rejects the arguments; callers name the node.
void call_on_meta(const c10::OperatorHandle& op, torch::jit::Stack& stack);

/// The fallback of call_on_meta, for callers that run the Meta kernel
/// themselves (the tracer redispatches below its own dispatch key): runs
/// `op` on zero-filled CPU tensors with the sizes, strides, storage offsets
/// and dtypes of the meta tensors among the arguments at the top of `stack`
/// (Tensor, Tensor?, Tensor[] and Tensor?[] arguments) and replaces its
/// results by meta tensors of the same metadata. Results that are inputs
/// (in-place ops) or views of inputs come back as those meta inputs or
/// views of them; see Note [CPU stand-ins]. Throws c10::Error when the CPU
/// kernel fails.
void call_on_cpu_stand_ins(const c10::OperatorHandle& op, torch::jit::Stack& stack);

}  // namespace crucible::ir
