#include <crucible/autograd/aot_cache.h>
#include <crucible/autograd/error.h>
#include <crucible/ir/error.h>

#include <functional>

namespace crucible::autograd {

size_t AotCache::KeyHash::operator()(const Key& k) const {
  // The digest is uniform already; the other parts are compared on a hit.
  return static_cast<size_t>(k.graph.low) ^ std::hash<std::string>{}(k.compiler_key);
}

AotCache::Compiled AotCache::compile(const ir::Backend& backend, std::string_view compiler_key, std::string_view kind,
                                     const ir::Graph& graph, const std::vector<at::Tensor>& example_inputs) {
  if (compiler_key.empty())
    throw AotError(
        "AotCache::compile: an empty compiler_key names no compiler, and unknown compilers are never "
        "shared; set AotConfig::compiler_key to what identifies the backends and their options");
  Key key;
  try {
    key.graph = ir::graph_hash(graph);
  } catch (const ir::IrError& e) {
    {
      std::lock_guard lock(mu_);
      ++stats_.bypasses;
    }
    return {backend(graph, example_inputs), std::string("bypass: ") + e.what()};
  }
  key.compiler_key = compiler_key;
  key.kind = kind;
  key.inputs.reserve(example_inputs.size());
  for (const at::Tensor& t : example_inputs)
    key.inputs.push_back(t.defined() ? std::optional(ir::TensorMeta::of(t)) : std::nullopt);
  {
    std::lock_guard lock(mu_);
    if (auto it = entries_.find(key); it != entries_.end()) {
      recency_.splice(recency_.begin(), recency_, it->second.recency);
      ++stats_.hits;
      return {it->second.fn, "hit"};
    }
    ++stats_.misses;
  }
  ir::CompiledFn fn = backend(graph, example_inputs);  // outside the lock: see Note [AOT graph cache]
  std::lock_guard lock(mu_);
  if (auto it = entries_.find(key); it != entries_.end()) return {it->second.fn, "miss"};  // another thread's
  if (capacity_ == 0) return {std::move(fn), "miss"};
  recency_.push_front(key);
  entries_.emplace(std::move(key), Entry{fn, recency_.begin()});
  evict_beyond_capacity();
  return {std::move(fn), "miss"};
}

void AotCache::evict_beyond_capacity() {
  while (entries_.size() > capacity_) {
    entries_.erase(recency_.back());
    recency_.pop_back();
    ++stats_.evictions;
  }
}

AotCache::Stats AotCache::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void AotCache::reset_stats() {
  std::lock_guard lock(mu_);
  stats_ = {};
}

size_t AotCache::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

size_t AotCache::capacity() const {
  std::lock_guard lock(mu_);
  return capacity_;
}

void AotCache::set_capacity(size_t capacity) {
  std::lock_guard lock(mu_);
  capacity_ = capacity;
  evict_beyond_capacity();
}

void AotCache::clear() {
  std::lock_guard lock(mu_);
  entries_.clear();
  recency_.clear();
}

const std::shared_ptr<AotCache>& default_aot_cache() {
  // Never destroyed: at exit its CompiledFns would free tensors (device
  // memory too) after LibTorch's own statics, whose order is unknown.
  static const auto* cache = new std::shared_ptr<AotCache>(std::make_shared<AotCache>());
  return *cache;
}

}  // namespace crucible::autograd
