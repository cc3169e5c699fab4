// Private: the compilations of one aot_function or aot_module, looked up by
// their guards (Note [AOT cache guards] in aot_function.h).
#pragma once

#include <crucible/autograd/aot_request.h>
#include <crucible/runtime/lifted_inputs.h>

#include <crucible/runtime/input_guards.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace crucible::autograd::detail {

class CompileCache {
 public:
  /// `api` names the caller in messages ("aot_function", "aot_module").
  CompileCache(std::string api, TraceFn trace, tracer::TensorFn flat_fn, AotConfig config);

  /// Runs the compilation whose guards `args` (and the tensors it lifted,
  /// which must still exist: Note [Lifted tensors]) meet, compiling one first
  /// (create_aot_dispatcher_function) when none does; AotError when that
  /// would exceed config.recompile_limit. `extra` joins the guards (see
  /// InputGuards); `num_params_buffers` overrides the config's for a new
  /// compilation (a module's state count).
  std::vector<at::Tensor> call(std::vector<at::Tensor> args, const std::vector<bool>& extra = {},
                               std::optional<size_t> num_params_buffers = std::nullopt);
  /// The same without running: compiles when no compilation's guards meet `args`.
  void compile(std::vector<at::Tensor> args, const std::vector<bool>& extra = {},
               std::optional<size_t> num_params_buffers = std::nullopt);

  size_t num_compilations() const;

 private:
  struct Entry;
  /// The compilation for `args` (compiled first when none meets them); `args`
  /// gets its lifted tensors appended.
  std::shared_ptr<const Entry> entry_for(std::vector<at::Tensor>& args, const std::vector<bool>& extra,
                                         std::optional<size_t> num_params_buffers);
  struct Entry {
    runtime::InputGuards guards;  // over the arguments followed by the lifted tensors
    ir::CompiledFn fn;
    runtime::LiftedInputs lifted;
  };
  std::string api_;
  size_t id_;
  TraceFn trace_;
  tracer::TensorFn flat_fn_;
  AotConfig config_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<const Entry>> entries_;
};

}  // namespace crucible::autograd::detail
