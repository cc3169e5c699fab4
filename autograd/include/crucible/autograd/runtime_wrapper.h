// RuntimeWrapper: the epilogue every AOTAutograd call runs after the compiled
// graph: writes input mutations back into the caller's tensors and rebuilds
// outputs that alias inputs or intermediates
// (torch/_functorch/_aot_autograd/runtime_wrappers.py's RuntimeWrapper and
// _create_runtime_wrapper).
#pragma once

#include <crucible/autograd/aot_request.h>

#include <cstddef>
#include <vector>

namespace crucible::autograd {

// Note [Regenerating aliased outputs]
// An output that aliases an input must alias the caller's tensor, and one
// that views an intermediate must be a view autograd knows about (so an
// in-place op on it later, or its gradient, reaches the base). After the
// compiled call the runtime wrapper therefore
//  - is_input: returns the caller's input itself;
//  - alias_of_input: returns caller_input.as_strided(sizes, strides,
//    offset_at_call_start + offset_delta), with the recorded metadata (the
//    graph does not compute it, see Note [Forward graph outputs]);
//  - alias_of_intermediate (autograd path): returns base.as_strided(...) of
//    the intermediate base the autograd Function returned, taking the view's
//    sizes, strides and offset from the graph's own output when that output
//    does alias the base (a backend may lay the base out differently than
//    tracing did), else from the recorded metadata;
//  - alias_of_intermediate_base_is_user_output (autograd path): the same,
//    from the rebuilt user output.
// On the inference path nothing needs autograd's view tracking, so outputs
// aliasing intermediates are returned as the graph made them. A rebuilt
// output that eager would not have made require grad (a detached alias) is
// detached, as the seed's gen_alias_from_base does.
//
// Note [Views with another dtype]
// An output may view its base with another dtype (Tensor::view(dtype): the
// same bytes read as int32, bf16, ...). It is rebuilt from the base's whole
// storage read as the output's dtype (a flat view from the storage's first
// byte, which view(dtype) always allows for a contiguous 1-D tensor), then
// as_strided to the output's sizes, strides and offset; offsets are kept in
// the output's elements. As in eager, such a view carries no gradient when
// the element sizes differ.
//
// Input mutations are applied before outputs are rebuilt, in input order:
// metadata first (caller_input.as_strided_ to the recorded sizes, strides and
// offset; for an input that does not require grad without bumping its
// version counter, so saved values that view it stay valid: eager saved them
// after the change, the compiled forward before), then data
// (caller_input.copy_(new value)). A data write that
// autograd did not see in eager (made under no_grad, or to an input that
// does not require grad) is copied under NoGradGuard; any other is copied
// with grad mode on, so the caller's tensor gets the history eager gives it
// and the gradient flows back through the compiled backward (the new value
// is a differentiable output of the autograd Function).

/// The epilogue of Note [Regenerating aliased outputs]. On the autograd path
/// (request.trace_joint), the inputs listed in `indices_of_inps_to_detach`
/// (those the backward computes no gradient for) are detached before the
/// call, so autograd records no edge to them, as the seed does. On the
/// inference path the compiled callable runs under NoGradGuard. The wrapped
/// callable takes the caller's flat arguments and returns the user outputs.
class RuntimeWrapper : public AotWrapper {
 public:
  explicit RuntimeWrapper(std::vector<size_t> indices_of_inps_to_detach = {})
      : indices_of_inps_to_detach_(std::move(indices_of_inps_to_detach)) {}
  std::string_view name() const override { return "RuntimeWrapper"; }
  ir::CompiledFn post_compile(ir::CompiledFn compiled, const AotRequest& request) override;

 private:
  std::vector<size_t> indices_of_inps_to_detach_;
};

}  // namespace crucible::autograd
