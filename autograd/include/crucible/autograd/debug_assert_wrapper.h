// DebugAssertWrapper: checks at every call that inputs compiled as not
// requiring grad still do not (runtime_wrappers.py's DebugAssertWrapper).
#pragma once

#include <crucible/autograd/aot_request.h>

#include <vector>

namespace crucible::autograd {

/// pre_compile records which flat arguments require grad; the wrapped
/// callable throws AotError naming the input when one that did not now
/// does: the compiled graph computes no gradient for it, so running it
/// would silently drop that gradient. The cache guards already make this
/// impossible for aot_function and aot_module; the check is for callers
/// that run a compiled callable without guards (aot_module_simplified with
/// AotConfig::debug_assert) and for finding guard bugs.
class DebugAssertWrapper : public AotWrapper {
 public:
  std::string_view name() const override { return "DebugAssertWrapper"; }
  void pre_compile(AotRequest& request) override;
  ir::CompiledFn post_compile(ir::CompiledFn compiled, const AotRequest& request) override;

 private:
  std::vector<bool> flat_requires_grad_;
};

}  // namespace crucible::autograd
