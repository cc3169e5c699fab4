// See codecache/graph_cache.h.
#include "codecache/graph_cache.h"

#include "codecache/cpp_builder.h"

#include <crucible/inductor/error.h>
#include <crucible/ir/hash.h>
#include <crucible/runtime/disk_cache.h>

#include <exception>

namespace crucible::inductor::detail {

namespace {

// The code generator's identity beyond kCodegenVersion: the build of the
// binary that holds it, as torch/_inductor keys its caches on a hash of its
// own sources (torch_key). A schedule embeds generated code, so one written
// by another build of the generator (a lowering fixed since, the version not
// bumped) must never be served. Empty for a binary linked without a build
// ID: the cache is then bypassed rather than keyed on something that may
// not change.
const std::string& generator_identity() {
  static const std::string id = runtime::build_id(reinterpret_cast<const void*>(&compiled_schedule));
  return id;
}

// Entries: Note [Graph cache entries] in codecache/schedule_entry.cpp.
std::string entry_path(const std::string& key, const InductorOptions& options) {
  return cache_dir(options) + "/g" + key + ".entry";
}

}  // namespace

CompiledSchedule compiled_schedule(const Schedule& s) {
  CompiledSchedule c;
  c.device = s.program.device;
  c.source = s.source;
  c.steps = s.steps;
  for (const KernelSignature& k : s.kernels) {
    KernelPlan kp{k.name, k.fuses, k.launch, {}, k.configs, k.tuning_key};
    for (size_t i = 0; i < k.buffers.size(); ++i) {
      const Buffer& b = s.program.buffers[k.buffers[i]];
      kp.operands.push_back(
          KernelOperand{b.value, k.written[i], b.kind == Buffer::Input, b.host_scalar, b.sizes, b.strides, b.dtype});
    }
    c.kernels.push_back(std::move(kp));
  }
  return c;
}

std::optional<std::string> graph_cache_key(const ir::Graph& graph, const InductorOptions& options,
                                           const SizeTable& sizes) {
  if (generator_identity().empty()) return std::nullopt;
  std::string hash;
  try {
    hash = ir::graph_hash(graph).hex();
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return cache_key("graph " + hash + " threads " + std::to_string(options.threads) + " build-id " +
                   generator_identity() + " sizes " + std::to_string(sizes.symbol_values.size()) + "\n" + sizes.str());
}

void store_schedule(const std::string& key, const CompiledSchedule& s, const ir::Graph& graph,
                    const InductorOptions& options) {
  write_atomically(entry_path(key, options), schedule_entry(key, s, graph));
}

std::optional<CompiledSchedule> load_schedule(const std::string& key, const ir::Graph& graph,
                                              const InductorOptions& options) {
  // An entry that does not parse or fit is a miss: it is then compiled
  // again and overwritten.
  return parse_schedule_entry(runtime::read_file(entry_path(key, options)), key, graph);
}

}  // namespace crucible::inductor::detail
