#include <crucible/autograd/collect_metadata.h>
#include <crucible/autograd/dedupe_wrapper.h>

namespace crucible::autograd {

void AOTDedupeWrapper::pre_compile(AotRequest& request) {
  const std::vector<at::Tensor>& args = request.flat_args;
  const size_t num_state = request.config.num_params_buffers;
  needs_post_compile_ = false;
  keep_arg_mask_.assign(args.size(), true);
  std::vector<size_t> first_of(args.size());
  bool written_duplicate = false;
  for (size_t i = 0; i < args.size(); ++i) {
    first_of[i] = i;
    if (i < num_state || !args[i].defined()) continue;
    for (size_t j = num_state; j < i; ++j) {
      if (keep_arg_mask_[j] && args[j].defined() && args[j].is_same(args[i])) {
        keep_arg_mask_[i] = false;
        first_of[i] = j;
        const InputAliasInfo& a = request.fw_metadata.input_info[i];
        const InputAliasInfo& b = request.fw_metadata.input_info[j];
        written_duplicate |= a.mutates_data || a.mutates_metadata || b.mutates_data || b.mutates_metadata;
        break;
      }
    }
  }
  if (!written_duplicate) {  // strategy 1
    keep_arg_mask_.assign(args.size(), true);
    return;
  }
  needs_post_compile_ = true;
  std::vector<size_t> kept_index(args.size());
  std::vector<at::Tensor> deduped;
  std::vector<size_t> add_dupe_map;  // per original argument: its index among the kept ones
  add_dupe_map.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    if (keep_arg_mask_[i]) {
      kept_index[i] = deduped.size();
      deduped.push_back(args[i]);
    }
    add_dupe_map.push_back(kept_index[first_of[i]]);
  }
  request.flat_fn = [inner = std::move(request.flat_fn),
                     map = std::move(add_dupe_map)](const std::vector<at::Tensor>& kept) {
    std::vector<at::Tensor> full;
    full.reserve(map.size());
    for (size_t k : map) full.push_back(kept[k]);
    return inner(full);
  };
  request.flat_args = std::move(deduped);
  request.fw_metadata = collect_metadata(request, request.trace_joint, nullptr, &request.analysis_hash);
}

ir::CompiledFn AOTDedupeWrapper::post_compile(ir::CompiledFn compiled, const AotRequest& request) {
  (void)request;
  if (!needs_post_compile_) return compiled;
  return [mask = keep_arg_mask_, compiled = std::move(compiled)](std::vector<at::Tensor>& args) {
    std::vector<at::Tensor> kept;
    kept.reserve(args.size());
    for (size_t i = 0; i < args.size(); ++i)
      if (mask[i]) kept.push_back(std::move(args[i]));
    args.clear();
    return compiled(kept);
  };
}

}  // namespace crucible::autograd
