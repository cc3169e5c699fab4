// Private: the whole-graph cache, the counterpart of torch/_inductor's
// FxGraphCache (codecache.py). Lowering, fusion and rendering are a compile's
// largest cost once the kernel cache spares it the C++ compiler (GPT's warm
// training-step compile: 65 ms in the backend of 250); so the schedule they
// produce, which is all the run-time plan needs, is kept on disk too, under
// a key of the graph and the options, and a compile that finds it skips them.
#pragma once

#include "codecache/schedule_entry.h"
#include "loop_ir/size_expr.h"
#include "schedule.h"

#include <crucible/inductor/options.h>
#include <crucible/ir/graph.h>

#include <optional>
#include <string>
#include <vector>

namespace crucible::inductor::detail {

/// `s` as the run-time plan needs it (its loop IR left behind).
CompiledSchedule compiled_schedule(const Schedule& s);

/// The key of `graph` (the graph compile_fx_inner lowers) compiled with
/// `options` and spelled with `sizes`: a hash of ir::graph_hash (everything
/// a backend computes with), the spellings (Note [Dynamic sizes]), the
/// OpenMP thread count, the code generator's version and the GNU
/// build ID of the binary it runs from (another build never reads this
/// one's entries). The compiler and its flags are not part of it: they key
/// the kernel cache, which builds the source. nullopt, and the graph
/// bypasses the cache, when the graph cannot be hashed (a constant the text
/// form cannot hold) or the binary has no build ID.
std::optional<std::string> graph_cache_key(const ir::Graph& graph, const InductorOptions& options,
                                           const SizeTable& sizes);

/// The schedule stored under `key`, with its nodes and values resolved in
/// `graph` by position. nullopt when there is none, or the entry is
/// unreadable, truncated or does not fit `graph`: the caller then compiles
/// and stores over it. Throws InductorError only for an unusable cache
/// directory (cache_dir).
std::optional<CompiledSchedule> load_schedule(const std::string& key, const ir::Graph& graph,
                                              const InductorOptions& options);

/// Stores `s`, whose nodes and values are `graph`'s, under `key`, atomically
/// (write_atomically): processes compiling the same graph at once each
/// write a whole entry, and a reader sees one of them. Throws InductorError
/// when the cache directory is unusable or the entry cannot be written.
void store_schedule(const std::string& key, const CompiledSchedule& s, const ir::Graph& graph,
                    const InductorOptions& options);

}  // namespace crucible::inductor::detail
