// AotCache: compiled graphs shared by every callable that traces to the same
// graph and compiles it with the same compilers (the in-memory half of
// torch/_functorch/_aot_autograd/autograd_cache.py's AOTAutogradCache, keyed
// where torch/_inductor/codecache.py's FxGraphCache keys: on the graph the
// backend receives).
#pragma once

#include <crucible/ir/backend.h>
#include <crucible/ir/graph.h>
#include <crucible/ir/hash.h>
#include <crucible/ir/tensor_meta.h>

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace crucible::autograd {

// Note [AOT graph cache]
// Note [AOT cache guards] (aot_function.h) keeps each callable's own
// compilations; this cache lets different callables share the backend's
// work. What it keeps is a backend's result: the CompiledFn that
// fw_compiler, bw_compiler or inference_compiler returned for one graph.
// Tracing, the metadata analysis and partitioning still run at every
// compilation: a C++ function is code, not a graph, so the graph to hash
// exists only once it is traced (the seed hashes Dynamo's graph, which it
// has before AOTAutograd runs). The runtime wrappers are built around the
// shared CompiledFn from each callable's own metadata, as on a miss.
//
// The key of one backend call:
//  - graph_hash of the graph (Note [Graph hash]): everything that shaped it
//    — decompositions, partition_fn, num_params_buffers,
//    keep_inference_input_mutations, functionalize_rng_ops, grad mode, the
//    dedupe and synthetic-base calling conventions — shows in the graph;
//  - which compiler: "forward", "backward" or "inference";
//  - AotConfig::compiler_key, the compilers' identity;
//  - each example input's TensorMeta (sizes, strides, storage offset,
//    dtype, device, requires_grad), or that it is undefined: what a backend
//    may specialize on besides the graph.
// The graph enters as its 128-bit digest, the rest is compared exactly.
// debug_assert is a wrapper outside the CompiledFn and not in the key.
//
// A backend is a std::function, which has no identity to compare, so the
// cache trusts compiler_key: empty (the default) means unknown compilers and
// no sharing. A config that sets it promises that every config with the
// same key compiles a graph to an equivalent result with all three
// compilers; that the result depends on nothing but the graph and the
// example inputs' metadata (a backend that reads example values, or
// process-wide flags, must put what it read into the key, or use none);
// and that its CompiledFn may be called from several callables at once, as
// it already may be from several threads. A hit skips the backend entirely,
// so what the backend does besides compiling (dumps, timing, counting)
// happens once per key.
//
// Scope: by default the process-wide default_aot_cache(), as torch.compile's
// caches are global: compiling the same model twice, in two callables or
// after a callable is gone, compiles once. AotConfig::cache may name an
// AotCache of its own, shared only by the callables given it, or nullptr
// for no sharing. recompile_limit still counts each callable's own
// compilations, hits included.
//
// The cache holds at most capacity() entries and drops the least recently
// used one beyond that; an entry keeps its CompiledFn, and what that holds
// (the interpreter's copy of the graph), alive after every callable that used
// it is gone, until it is dropped or clear() runs. It is thread-safe; the
// backend runs outside its lock, so two threads missing on one key at once
// both compile, and both then use the result stored first.
//
// No disk layer: the key exists only after tracing, so a disk hit could save
// only the backend call, and no backend's result can be written today — the
// interpreter's result is the graph already in hand, a user backend's an
// opaque closure. A code-generating backend (inductor) will have files to
// keep; its disk cache can key on the same digest, which is the same in
// every process.

/// Shared compiled graphs, least recently used dropped beyond a capacity.
class AotCache {
 public:
  /// Entries kept by default.
  static constexpr size_t kDefaultCapacity = 256;

  explicit AotCache(size_t capacity = kDefaultCapacity) : capacity_(capacity) {}
  AotCache(const AotCache&) = delete;
  AotCache& operator=(const AotCache&) = delete;

  /// What one compile() did. `outcome` is "hit" (the backend was skipped),
  /// "miss" (it ran and its result is kept) or "bypass: <why>" (the graph
  /// could not be hashed, see graph_hash; it ran and nothing is kept).
  struct Compiled {
    ir::CompiledFn fn;
    std::string outcome;
  };

  /// The CompiledFn kept for this key (Note [AOT graph cache]), else
  /// backend(graph, example_inputs), kept. `kind` names the compiler
  /// ("forward", "backward", "inference"); `example_inputs` holds one tensor
  /// per placeholder. Throws AotError for an empty compiler_key (unknown
  /// compilers are never shared), and what the backend throws (nothing is
  /// kept then).
  Compiled compile(const ir::Backend& backend, std::string_view compiler_key, std::string_view kind,
                   const ir::Graph& graph, const std::vector<at::Tensor>& example_inputs);

  /// Counts since construction (or reset_stats): hits, misses, bypasses,
  /// and entries dropped for capacity.
  struct Stats {
    size_t hits = 0;
    size_t misses = 0;
    size_t bypasses = 0;
    size_t evictions = 0;
  };
  Stats stats() const;
  void reset_stats();

  /// Entries kept now.
  size_t size() const;
  /// The most entries kept (a count of compiled graphs, not bytes):
  /// kDefaultCapacity unless the constructor or set_capacity said otherwise.
  size_t capacity() const;
  /// Changes the capacity, dropping the least recently used entries beyond
  /// it (0 keeps nothing: every compile misses).
  void set_capacity(size_t capacity);
  /// Drops every entry (callables keep the CompiledFns they hold).
  void clear();

 private:
  struct Key {
    ir::GraphHash graph;
    std::string compiler_key;
    std::string kind;
    std::vector<std::optional<ir::TensorMeta>> inputs;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct Entry {
    ir::CompiledFn fn;
    std::list<Key>::iterator recency;  // its place in recency_
  };
  void evict_beyond_capacity();  // with mu_ held

  mutable std::mutex mu_;
  size_t capacity_;
  std::list<Key> recency_;  // most recently used first
  std::unordered_map<Key, Entry, KeyHash> entries_;
  Stats stats_;
};

/// The process-wide cache AotConfig::cache names by default. It is never
/// destroyed, so the CompiledFns it keeps are not freed at exit after
/// LibTorch's own statics; clear() frees them earlier.
const std::shared_ptr<AotCache>& default_aot_cache();

}  // namespace crucible::autograd
