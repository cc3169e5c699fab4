// Private: running a plan (Note [Run-time plan] in runtime/plan.h): one
// call of a compiled graph, step by step.
#pragma once

#include "runtime/plan.h"

#include <ATen/core/Tensor.h>

#include <vector>

namespace crucible::inductor::detail {

/// Runs `plan` on `inputs` (taken: the vector is left empty) and returns
/// the graph's outputs: extern kernels through the dispatcher (or as host
/// arithmetic), generated kernels on raw pointers, inputs copied where
/// their layout differs from the one the code was generated for, each
/// input a kernel writes in place bumped (Note [Version counters of inputs
/// written in place]). With plan.profile, times each step into
/// plan.times. Throws InductorError for inputs of another count or sizes,
/// and naming the extern kernel that fails.
std::vector<at::Tensor> run_plan(Plan& plan, std::vector<at::Tensor>& inputs);

}  // namespace crucible::inductor::detail
