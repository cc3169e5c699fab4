#include "lift_inputs.h"

#include <crucible/autograd/error.h>

#include <ATen/MemoryOverlap.h>

#include <algorithm>
#include <unordered_map>
#include <vector>

namespace crucible::autograd::detail {

namespace {

std::string describe(const AotRequest& request, size_t k) {
  const std::string& name = request.lifted_names.at(k);
  return name.empty() ? "a tensor " + std::string(c10::toString(request.lifted[k].scalar_type())) +
                            c10::str(request.lifted[k].sizes())
                      : "'" + name + "'";
}

}  // namespace

void lift_inputs(AotRequest& request, const std::vector<tracer::NamedTensor>& found) {
  // See Note [Lifting in AOTAutograd].
  const size_t num_args = request.flat_args.size();
  for (const tracer::NamedTensor& t : found) {
    for (size_t i = 0; i < num_args; ++i)
      if (request.flat_args[i].defined() && request.flat_args[i].is_same(t.tensor))
        throw AotError("compilation " + request.compile_id + ": the function reads input " + std::to_string(i) +
                       " both as an argument and from outside its arguments (a captured or global tensor); read "
                       "it one way: use the argument inside the function");
    request.flat_args.push_back(t.tensor);
    request.lifted.push_back(t.tensor);
    request.lifted_names.push_back(t.name);
  }
  request.flat_fn = [fn = std::move(request.flat_fn), num_args](const std::vector<at::Tensor>& args) {
    return fn(std::vector<at::Tensor>(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(num_args)));
  };
}

std::vector<bool> reached_inputs(const AotRequest& request) {
  const std::vector<at::Tensor>& args = request.flat_args;
  std::vector<bool> reached(args.size(), false);
  for (size_t i = 0; i < args.size(); ++i) {
    reached[i] = i < request.config.num_params_buffers;
    for (const at::Tensor& l : request.lifted) reached[i] = reached[i] || (args[i].defined() && args[i].is_same(l));
  }
  return reached;
}

void check_lifted_aliasing(const AotRequest& request) {
  const std::vector<at::Tensor>& args = request.flat_args;
  const std::vector<InputAliasInfo>& info = request.fw_metadata.input_info;
  for (size_t k = 0; k < request.lifted.size(); ++k) {
    const at::Tensor& l = request.lifted[k];
    if (!l.has_storage()) continue;
    size_t self = args.size();
    for (size_t i = 0; i < args.size(); ++i)
      if (args[i].is_same(l)) self = i;
    for (size_t i = 0; i < args.size(); ++i) {
      if (i == self || !args[i].defined() || !args[i].has_storage() || !args[i].is_alias_of(l)) continue;
      const bool written = info.at(i).mutates_data || info.at(i).mutates_metadata || info.at(self).mutates_data ||
                           info.at(self).mutates_metadata;
      if (written)
        throw AotError("compilation " + request.compile_id + ": the function reads " + describe(request, k) +
                       " from outside its arguments, and it shares storage with input " + std::to_string(i) +
                       " while one of them is written in place; the compiled function cannot keep such aliasing "
                       "right: pass the tensor as an argument instead of reading it from outside");
    }
  }
}

void check_state_aliasing(const AotRequest& request) {
  const std::vector<at::Tensor>& args = request.flat_args;
  const std::vector<InputAliasInfo>& info = request.fw_metadata.input_info;
  const size_t n = std::min(request.config.num_params_buffers, args.size());
  auto written = [&](size_t i) { return info.at(i).mutates_data || info.at(i).mutates_metadata; };
  // Only tensors of one storage can overlap, so each is looked at against
  // the earlier ones of its storage (a training step writes every
  // parameter: all pairs would be GPT-2's 11 thousand), in order, so that
  // the error names the first pair.
  std::unordered_map<const c10::StorageImpl*, std::vector<size_t>> by_storage;
  for (size_t j = 0; j < n; ++j) {
    const at::Tensor& b = args[j];
    if (!b.defined() || !b.has_storage()) continue;
    std::vector<size_t>& earlier = by_storage[b.storage().unsafeGetStorageImpl()];
    for (size_t i : earlier) {
      const at::Tensor& a = args[i];
      if ((!written(i) && !written(j)) || a.is_same(b)) continue;
      // Views that cannot be told apart cheaply (TooHard) are taken to overlap.
      if (at::get_overlap_status(a, b) == at::MemOverlapStatus::No) continue;
      throw AotError("compilation " + request.compile_id + ": the module's state tensors " + std::to_string(i) +
                     " (sizes " + c10::str(a.sizes()) + ") and " + std::to_string(j) + " (sizes " +
                     c10::str(b.sizes()) + "), in named_parameters() then named_buffers() order, share memory and " +
                     std::to_string(written(i) ? i : j) +
                     " is written in place (an optimizer update, a buffer the function updates); the compiled "
                     "graph takes them as separate inputs and would not see a write to one in the other: give "
                     "each its own storage (clone one), or register one tensor under both names");
    }
    earlier.push_back(j);
  }
}

}  // namespace crucible::autograd::detail
