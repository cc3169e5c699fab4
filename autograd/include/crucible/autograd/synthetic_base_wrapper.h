// AOTSyntheticBaseWrapper: an argument that is written and shares storage
// with another argument (runtime_wrappers.py's AOTSyntheticBaseWrapper and
// merge_view_inputs).
#pragma once

#include <crucible/autograd/aot_request.h>

#include <cstdint>
#include <vector>

namespace crucible::autograd {

// Note [Synthetic bases]
// f(a, b) with a = x.view(2, 3), b = x.view(6) and f writing a: the traces
// run on separate copies of a and b, so the write would not show through b.
// The wrapper merges every group of arguments that share a storage, when one
// of them is written, into one "synthetic base" argument, and the traced
// function regenerates the group's arguments from it with as_strided (with
// their sizes, strides and storage offsets), so functionalization sees them
// as views of one tensor and replays the write through all of them. The
// calling convention becomes
//   module state..., one base per merged group (in order of each group's
//   first argument), the other arguments in order.
// The base is, when some argument of the group requires grad, the tensor
// they all view (their common autograd base, or one of them if the others
// view it), so gradients reach it as they do in eager; AotError when they
// have none in common. Otherwise it is a tensor spanning the whole storage.
// The base's new data is written back by the runtime wrapper like any
// mutated input, which updates every aliasing argument at once. An argument
// of a group whose metadata f changes (b.transpose_) cannot be written back
// through the base: the traced function returns it as an extra output and
// the wrapper applies its sizes, strides and offset to the caller's tensor
// with as_strided_ after the call. The guards (Note [AOT cache guards])
// compile again when the aliasing, the offsets or the storage sizes of such
// arguments change.

/// Note [Synthetic bases]. A no-op unless a written argument shares storage
/// with another one (module state excluded). pre_compile re-runs the
/// metadata analysis on the merged function.
class AOTSyntheticBaseWrapper : public AotWrapper {
 public:
  std::string_view name() const override { return "AOTSyntheticBaseWrapper"; }
  void pre_compile(AotRequest& request) override;
  ir::CompiledFn post_compile(ir::CompiledFn compiled, const AotRequest& request) override;

  /// One merged group of arguments (indices in the outer calling convention).
  struct Group {
    std::vector<size_t> members;
    bool differentiable = false;  ///< the base is the members' common autograd base
  };
  /// The groups the last pre_compile merged, in order of each group's first
  /// argument (the order of their bases in the merged calling convention);
  /// empty before pre_compile and when nothing was merged (post_compile then
  /// returns the compiled callable unchanged).
  const std::vector<Group>& groups() const { return groups_; }

 private:
  struct View {
    std::vector<int64_t> sizes, strides;
    int64_t storage_offset = 0;
  };
  size_t num_state_ = 0;
  std::vector<Group> groups_;
  std::vector<size_t> others_;            // outer indices passed through, in order
  std::vector<size_t> metadata_mutated_;  // outer indices whose metadata the wrapper applies
};

}  // namespace crucible::autograd
