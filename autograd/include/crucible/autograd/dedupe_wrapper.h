// AOTDedupeWrapper: the same tensor passed as several arguments, f(x, x)
// (runtime_wrappers.py's AOTDedupeWrapper).
#pragma once

#include <crucible/autograd/aot_request.h>

#include <vector>

namespace crucible::autograd {

// Note [Duplicated inputs]
// Tracing f(x, x) must not record a graph where the second argument is the
// first one (its gradient would be counted once for two uses), and must not
// hide that they are one tensor when f writes to one of them (the other
// would not see it). As in the seed there are two strategies:
//  1. when no duplicated argument is written, nothing changes: every trace
//     runs on distinct copies of the arguments, so the graph is a function of
//     two leaves; at run time the autograd Function gets x twice and the
//     engine accumulates both gradients into x, as eager's two uses of one
//     leaf do;
//  2. when one is written, the duplicates are removed from the compiled
//     calling convention: the traced function takes the deduplicated
//     arguments and passes the same traced tensor in each duplicated
//     position (so a write through one is seen through the other), and at
//     run time the wrapper drops the duplicates before the call. Such a graph
//     is specialized to that duplication, which the cache guards check
//     (Note [AOT cache guards]).
// Module state (the first config.num_params_buffers arguments) is left
// alone: a parameter registered under two names is one placeholder to the
// tracer already.

/// Strategy 2 of Note [Duplicated inputs] when a duplicated argument is
/// written; otherwise a no-op. pre_compile re-runs the metadata analysis on
/// the deduplicated function.
class AOTDedupeWrapper : public AotWrapper {
 public:
  std::string_view name() const override { return "AOTDedupeWrapper"; }
  void pre_compile(AotRequest& request) override;
  ir::CompiledFn post_compile(ir::CompiledFn compiled, const AotRequest& request) override;

  /// Per original argument: kept (its first occurrence) or dropped.
  const std::vector<bool>& keep_arg_mask() const { return keep_arg_mask_; }

 private:
  bool needs_post_compile_ = false;
  std::vector<bool> keep_arg_mask_;
};

}  // namespace crucible::autograd
