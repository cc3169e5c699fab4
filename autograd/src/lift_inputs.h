// Private: lifting the tensors a function reads from outside its arguments
// into a compilation's inputs (Note [Lifting in AOTAutograd] in aot_dispatch.h).
#pragma once

#include <crucible/autograd/aot_request.h>

#include <string>
#include <vector>

namespace crucible::autograd::detail {

/// Appends `found` (tensors the metadata analysis saw flat_fn read from
/// outside) to request.flat_args and request.lifted, with their names, and
/// makes flat_fn ignore them as arguments. Throws AotError for a lifted
/// tensor that is also one of the arguments.
void lift_inputs(AotRequest& request, const std::vector<tracer::NamedTensor>& found);

/// Whether each of request.flat_args is read by the function itself rather
/// than received: module state (the first config.num_params_buffers) and
/// the lifted tensors. The traces pass such inputs as the tensors themselves.
std::vector<bool> reached_inputs(const AotRequest& request);

/// Throws AotError when a lifted tensor shares storage with another of
/// request.flat_args and one of them is written (request.fw_metadata says).
void check_lifted_aliasing(const AotRequest& request);

/// Throws AotError when two of a module's state tensors (the first
/// config.num_params_buffers of request.flat_args, other tensors) share
/// memory and one of them is written (request.fw_metadata says): the
/// function reaches both itself, so no wrapper can rebase them on one input
/// as it does aliased arguments, and the graph would see each write on one
/// of them only. State that shares a storage without overlapping (views of
/// one flat buffer) is fine.
void check_state_aliasing(const AotRequest& request);

}  // namespace crucible::autograd::detail
