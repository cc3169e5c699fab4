#include <crucible/autograd/collect_metadata.h>
#include <crucible/autograd/error.h>
#include <crucible/autograd/synthetic_base_wrapper.h>

#include "metadata_mutation.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <variant>

namespace crucible::autograd {

namespace {

// The tensor an argument of a differentiable group views, or itself.
at::Tensor autograd_base(const at::Tensor& t) { return t.is_view() ? at::Tensor(t._base()) : t; }

// A tensor spanning the whole storage of `t`, in t's dtype.
at::Tensor storage_base(const at::Tensor& t) {
  const int64_t numel = static_cast<int64_t>(t.storage().nbytes()) / static_cast<int64_t>(t.element_size());
  return at::empty({0}, t.options().requires_grad(false)).set_(t.storage(), 0, {numel}, {1});
}

at::Tensor make_base(const std::vector<at::Tensor>& args, const AOTSyntheticBaseWrapper::Group& g) {
  const at::Tensor& first = args[g.members.front()];
  return g.differentiable ? autograd_base(first) : storage_base(first);
}

}  // namespace

void AOTSyntheticBaseWrapper::pre_compile(AotRequest& request) {
  const std::vector<at::Tensor>& args = request.flat_args;
  const ViewAndMutationMeta& meta = request.fw_metadata;
  num_state_ = request.config.num_params_buffers;
  groups_.clear();
  others_.clear();
  metadata_mutated_.clear();
  // Arguments by storage, in order of first appearance.
  std::vector<std::vector<size_t>> by_storage;
  for (size_t i = num_state_; i < args.size(); ++i) {
    if (!args[i].defined() || !args[i].has_storage()) continue;
    auto it = std::find_if(by_storage.begin(), by_storage.end(),
                           [&](const std::vector<size_t>& g) { return args[g.front()].is_alias_of(args[i]); });
    if (it == by_storage.end())
      by_storage.push_back({i});
    else
      it->push_back(i);
  }
  std::vector<int> group_of(args.size(), -1);
  for (const std::vector<size_t>& members : by_storage) {
    if (members.size() < 2) continue;
    bool written = false, requires_grad = false;
    for (size_t i : members) {
      written |= meta.input_info[i].mutates_data;
      requires_grad |= args[i].requires_grad();
    }
    if (!written) continue;
    Group g{members, requires_grad};
    const at::Tensor& first = args[members.front()];
    for (size_t i : members) {
      if (args[i].scalar_type() != first.scalar_type())
        throw AotError("inputs " + std::to_string(members.front()) + " and " + std::to_string(i) +
                       " share storage with different dtypes and one of them is written in place; pass "
                       "tensors that do not alias, or views of one dtype");
      if (requires_grad && !autograd_base(args[i]).is_same(autograd_base(first)))
        throw AotError("inputs " + std::to_string(members.front()) + " and " + std::to_string(i) +
                       " share storage, one of them is written in place and they require grad, but they are not "
                       "views of one tensor, so no base can carry their gradients; pass views of one tensor, or "
                       "clone one of them");
      group_of[i] = static_cast<int>(groups_.size());
      if (meta.input_info[i].mutates_metadata) metadata_mutated_.push_back(i);
    }
    groups_.push_back(std::move(g));
  }
  if (groups_.empty()) return;
  for (size_t i = num_state_; i < args.size(); ++i)
    if (group_of[i] < 0) others_.push_back(i);

  // The merged calling convention: state, bases, the others.
  using Source = std::variant<size_t, std::pair<size_t, View>>;  // new index, or (base slot, view)
  std::vector<Source> sources(args.size());
  std::vector<at::Tensor> merged(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(num_state_));
  for (size_t i = 0; i < num_state_; ++i) sources[i] = i;
  for (const Group& g : groups_) {
    const size_t slot = merged.size();
    merged.push_back(make_base(args, g));
    for (size_t i : g.members)
      sources[i] = std::make_pair(slot, View{args[i].sizes().vec(), args[i].strides().vec(), args[i].storage_offset()});
  }
  for (size_t i : others_) {
    sources[i] = merged.size();
    merged.push_back(args[i]);
  }
  request.flat_fn = [inner = std::move(request.flat_fn), sources,
                     extra = metadata_mutated_](const std::vector<at::Tensor>& new_args) {
    std::vector<at::Tensor> old;
    old.reserve(sources.size());
    for (const Source& s : sources) {
      if (const size_t* k = std::get_if<size_t>(&s)) {
        old.push_back(new_args[*k]);
      } else {
        const auto& [slot, v] = std::get<std::pair<size_t, View>>(s);
        old.push_back(new_args[slot].as_strided(v.sizes, v.strides, v.storage_offset));
      }
    }
    std::vector<at::Tensor> outs = inner(old);
    for (size_t i : extra) outs.push_back(old[i]);
    return outs;
  };
  request.flat_args = std::move(merged);
  request.fw_metadata = collect_metadata(request, request.trace_joint, nullptr, &request.analysis_hash);
}

ir::CompiledFn AOTSyntheticBaseWrapper::post_compile(ir::CompiledFn compiled, const AotRequest& request) {
  (void)request;
  if (groups_.empty()) return compiled;
  return [num_state = num_state_, groups = groups_, others = others_, extra = metadata_mutated_,
          compiled = std::move(compiled)](std::vector<at::Tensor>& args) {
    std::vector<at::Tensor> merged(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(num_state));
    for (const Group& g : groups) merged.push_back(make_base(args, g));
    for (size_t i : others) merged.push_back(args[i]);
    std::vector<at::Tensor> metadata_targets;
    for (size_t i : extra) metadata_targets.push_back(args[i]);
    args.clear();
    std::vector<at::Tensor> outs = compiled(merged);
    // See Note [Synthetic bases]: the last outputs carry the new metadata.
    const size_t first = outs.size() - metadata_targets.size();
    for (size_t j = 0; j < metadata_targets.size(); ++j) {
      const at::Tensor& m = outs[first + j];
      detail::apply_metadata(metadata_targets[j], m.sizes(), m.strides(), m.storage_offset());
    }
    outs.resize(first);
    return outs;
  };
}

}  // namespace crucible::autograd
