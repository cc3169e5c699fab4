#include "compile_cache.h"

#include "module_trace.h"

#include <crucible/autograd/aot_dispatch.h>
#include <crucible/autograd/error.h>

#include <ATen/core/grad_mode.h>

#include <atomic>

namespace crucible::autograd::detail {

CompileCache::CompileCache(std::string api, TraceFn trace, tracer::TensorFn flat_fn, AotConfig config)
    : api_(std::move(api)), trace_(std::move(trace)), flat_fn_(std::move(flat_fn)), config_(std::move(config)) {
  static std::atomic<size_t> next_id{0};
  id_ = next_id++;
}

std::vector<at::Tensor> CompileCache::call(std::vector<at::Tensor> args, const std::vector<bool>& extra,
                                           std::optional<size_t> num_params_buffers) {
  std::shared_ptr<const Entry> entry = entry_for(args, extra, num_params_buffers);
  return entry->fn(args);
}

void CompileCache::compile(std::vector<at::Tensor> args, const std::vector<bool>& extra,
                           std::optional<size_t> num_params_buffers) {
  entry_for(args, extra, num_params_buffers);
}

std::shared_ptr<const CompileCache::Entry> CompileCache::entry_for(std::vector<at::Tensor>& args,
                                                                   const std::vector<bool>& caller_extra,
                                                                   std::optional<size_t> num_params_buffers) {
  // The modules the function reads from outside compute by their train()/eval() mode too.
  std::vector<bool> extra = caller_extra;
  const std::vector<bool> named = named_training_flags(config_.named_modules);
  extra.insert(extra.end(), named.begin(), named.end());
  const size_t first_input = num_params_buffers.value_or(config_.num_params_buffers);
  for (size_t i = 0; i < args.size(); ++i)
    if (!args[i].defined())
      throw AotError(api_ + ": input " + std::to_string(i < first_input ? i : i - first_input) +
                     (i < first_input ? " of the module's state" : "") +
                     " is an undefined tensor (at::Tensor()); a compiled function takes defined tensors: pass "
                     "a tensor, or leave the argument out of the compiled call");
  const bool grad_enabled = at::GradMode::is_enabled();
  const size_t num_args = args.size();
  std::shared_ptr<const Entry> hit;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : entries_) {
      if (!e->lifted.append_to(args)) continue;
      if (e->guards.check(args, grad_enabled, extra)) {
        hit = e;
        break;
      }
      args.resize(num_args);
    }
    if (!hit) {
      // The recompile reason: the first failing guard of the closest compilation.
      runtime::InputGuards::Mismatch closest{0, "first call"};
      for (auto e = entries_.rbegin(); e != entries_.rend(); ++e) {
        runtime::InputGuards::Mismatch m{num_args, (*e)->lifted.freed()};
        if (m.reason.empty() && (*e)->lifted.append_to(args)) {
          m = (*e)->guards.first_difference(args, grad_enabled, extra);
          args.resize(num_args);
        }
        if (e == entries_.rbegin() || m.matched > closest.matched) closest = std::move(m);
      }
      const std::string& reason = closest.reason;
      if (config_.recompile_limit && entries_.size() >= *config_.recompile_limit)
        throw AotError(api_ + ": the inputs match none of the " + std::to_string(entries_.size()) +
                       " compiled versions (" + reason + ") and recompile_limit is reached (" +
                       std::to_string(*config_.recompile_limit) +
                       "); raise the limit, or keep input sizes, strides, dtypes, devices and requires_grad fixed");
      AotRequest request;
      request.flat_fn = flat_fn_;
      request.trace = trace_;
      request.flat_args = args;
      request.config = config_;
      if (num_params_buffers) request.config.num_params_buffers = *num_params_buffers;
      request.compile_id = std::to_string(id_) + "/" + std::to_string(entries_.size());
      request.recompile_reason = reason;
      AotCompiled compiled = create_aot_dispatcher_function(std::move(request));
      if (!compiled.lifted.append_to(args))
        throw AotError(api_ + ": " + compiled.lifted.freed() + " while the function was compiled");
      hit = std::make_shared<const Entry>(
          Entry{runtime::InputGuards(args, grad_enabled, extra), std::move(compiled.fn), std::move(compiled.lifted)});
      entries_.push_back(hit);
    }
  }
  return hit;
}

size_t CompileCache::num_compilations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

}  // namespace crucible::autograd::detail
