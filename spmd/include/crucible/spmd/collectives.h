// Functional collectives: graph ops that compute a new tensor (or hand one
// back) and talk to the other ranks through a c10d backend, as PyTorch's
// _c10d_functional ops (torch/csrc/distributed/c10d/Functional.cpp) do.
// Registered with TORCH_LIBRARY in the `crucible` namespace, so the tracer
// records them, the interpreter runs them, generated code calls them as
// extern kernels, and ir::is_collective knows them:
//
//   crucible::all_reduce(Tensor input, str reduce_op, str group_name) -> Tensor
//     Issues an all-reduce of a copy of `input` ("sum", "avg", "max", "min")
//     over the group registered under `group_name` (process_group.h) and
//     returns the copy at once; its value is only final after wait_tensor.
//   crucible::all_reduce_bucket(Tensor[] inputs, str reduce_op, str group_name) -> Tensor
//     DDP's bucket: the inputs (one dtype, one device) flattened and packed
//     end to end into a new 1-D buffer of their total numel, which one
//     all-reduce then reduces in place; returned at once, final after
//     wait_tensor. One copy of the gradients, where all_reduce(cat(...))
//     makes two.
//   crucible::all_gather_into_tensor(Tensor input, int group_size, str group_name) -> Tensor
//     Every rank's `input` (each of the same sizes) concatenated along dim 0
//     in rank order, into a new tensor of dim 0 group_size times the
//     input's (c10d's _allgather_base; _c10d_functional's op of this name).
//     group_size is the group's, so the meta kernel knows the result's sizes.
//   crucible::reduce_scatter_tensor(Tensor input, str reduce_op, int group_size, str group_name) -> Tensor
//     The ranks' `input`s reduced, and split along dim 0 into group_size
//     equal chunks: rank r gets chunk r, a new tensor (c10d's
//     _reduce_scatter_base; _c10d_functional's op of this name). Dim 0 must
//     be a multiple of group_size.
//   crucible::wait_tensor(Tensor input) -> Tensor
//     Waits for the collective that writes `input` (none: returns at once)
//     and returns `input`: the point where the result is read.
//   crucible::tag_grad(Tensor grad) -> Tensor
//     A copy of `grad`. The data-parallel expansion finds the gradients of
//     a traced train step by these tags and replaces them (the seed's
//     _spmd.tag_grad).
//
// All have meta kernels (the result is like the input, the packed bucket,
// or the input with dim 0 gathered or scattered), so graphs holding them
// propagate metadata and trace on fake tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace crucible::spmd {

/// How all_reduce combines the ranks' tensors. Avg is the sum divided by
/// the group's size (c10d's Gloo has no AVG: the division happens when the
/// result is waited for).
enum class ReduceOp { Sum, Avg, Max, Min };

/// "sum", "avg", "max", "min": the op's `reduce_op` string.
const char* to_string(ReduceOp op);

/// Calls crucible::all_reduce. Read the result only after wait_tensor.
/// Throws SpmdError for an unknown group or an `input` on another device
/// than the group's backend serves.
at::Tensor all_reduce(const at::Tensor& input, ReduceOp op, const std::string& group_name);
/// Calls crucible::all_reduce_bucket: `inputs` packed into one 1-D tensor
/// of their total numel, reduced as one. Read it only after wait_tensor.
/// Throws SpmdError as all_reduce does, and for an empty bucket or one
/// whose inputs differ in dtype or device.
at::Tensor all_reduce_bucket(const std::vector<at::Tensor>& inputs, ReduceOp op, const std::string& group_name);
/// Calls crucible::all_gather_into_tensor: the ranks' `input`s one after the
/// other along dim 0 (sizes [group_size * d0, ...]). Read it only after
/// wait_tensor. Throws SpmdError as all_reduce does, for a 0-dim `input`,
/// and when `group_size` is not the group's size.
at::Tensor all_gather_into_tensor(const at::Tensor& input, int64_t group_size, const std::string& group_name);
/// Calls crucible::reduce_scatter_tensor: rank r's chunk r of the ranks'
/// reduced `input`s (sizes [d0 / group_size, ...]). Read it only after
/// wait_tensor. Throws SpmdError as all_gather_into_tensor does, and when
/// dim 0 is not a multiple of `group_size`.
at::Tensor reduce_scatter_tensor(const at::Tensor& input, ReduceOp op, int64_t group_size,
                                 const std::string& group_name);
/// Calls crucible::wait_tensor. Throws SpmdError naming the rank and the
/// group when the collective failed (a rank died, timed out, or issued other
/// collectives).
at::Tensor wait_tensor(const at::Tensor& input);
/// Calls crucible::tag_grad.
at::Tensor tag_grad(const at::Tensor& grad);

/// Collectives issued and not yet waited for in this process (a graph that
/// leaves one behind has a bug; the tests check it is 0).
size_t pending_collectives();

}  // namespace crucible::spmd
