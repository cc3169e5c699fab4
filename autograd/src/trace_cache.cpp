#include "trace_cache.h"

#include <crucible/ir/error.h>
#include <crucible/ir/instrument.h>
#include <crucible/ir/parser.h>
#include <crucible/ir/printer.h>
#include <crucible/runtime/disk_cache.h>
#include <crucible/runtime/instruments.h>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace crucible::autograd::detail {

namespace {

// Bumped when what a trace records, or the entry format, changes in a way
// the build IDs would not show (they always change with the code).
constexpr const char* kTraceCacheVersion = "crucible-aot-trace-1";

std::string hex128(std::string_view text) {
  const XXH128_hash_t h = XXH3_128bits(text.data(), text.size());
  char out[33];
  std::snprintf(out, sizeof out, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return out;
}

std::string hex64(std::string_view text) {
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(XXH3_64bits(text.data(), text.size())));
  return out;
}

// Everything of Note [AOT trace cache]'s key but the directory.
std::optional<std::string> cache_key(const AotRequest& request, std::string_view kind) {
  if (!request.analysis_hash) return std::nullopt;
  const AotConfig& c = request.config;
  std::string k = std::string(kTraceCacheVersion) + "\n" + std::string(kind) + "\ncode\n" +
                  runtime::startup_code_identity() + "analysis " + request.analysis_hash->hex() + "\ncompiler " +
                  c.compiler_key + "\nmode " + std::to_string(static_cast<int>(c.trace_mode)) + " freeze " +
                  std::to_string(c.freeze) + " state " + std::to_string(c.num_params_buffers) + " keep_mutations " +
                  std::to_string(c.keep_inference_input_mutations) + " rng " + std::to_string(c.functionalize_rng_ops) +
                  " joint " + std::to_string(request.trace_joint) + "\ndecompositions";
  std::vector<std::string_view> ops;
  for (const auto& [name, d] : c.decompositions) ops.push_back(name);
  std::sort(ops.begin(), ops.end());
  for (std::string_view op : ops) k += " " + std::string(op);
  k += "\nwrappers";
  for (const auto& w : c.wrappers) k += " " + std::string(w->name());
  k += "\n" + request.fw_metadata.to_string() + "\nlifted";
  for (const std::string& n : request.lifted_names) k += " " + n;
  k += "\narguments\n";
  std::unordered_map<const c10::StorageImpl*, size_t> first_of_storage;
  for (size_t i = 0; i < request.flat_args.size(); ++i) {
    const at::Tensor& t = request.flat_args[i];
    if (!t.defined()) {
      k += "undefined\n";
      continue;
    }
    k += ir::to_string(ir::TensorMeta::of(t)) + (t.is_leaf() ? " leaf" : "");
    if (t.has_storage()) {
      auto [it, first] = first_of_storage.emplace(t.storage().unsafeGetStorageImpl(), i);
      if (!first) k += " shares " + std::to_string(it->second);
    }
    k += "\n";
  }
  return hex128(k);
}

// The graph text of the entry at `path` if it is whole and stored under `key`.
std::optional<std::string> read_entry(const std::string& path, const std::string& key) {
  std::string text = runtime::read_file(path);
  const std::string header = std::string(kTraceCacheVersion) + " " + key + " ";
  if (text.compare(0, header.size(), header) != 0) return std::nullopt;
  const size_t eol = text.find('\n', header.size());
  if (eol == std::string::npos) return std::nullopt;
  std::string body = text.substr(eol + 1);
  if (text.compare(header.size(), eol - header.size(), hex64(body)) != 0) return std::nullopt;
  return body;
}

// The graph of an entry's text, if it parses and takes `num_inputs`.
std::optional<ir::Graph> parse_entry(std::string_view body, size_t num_inputs) {
  try {
    ir::Graph g = ir::parse(body);
    if (g.placeholders().size() != num_inputs) return std::nullopt;
    return g;
  } catch (const ir::IrError&) {  // an op this LibTorch does not know, say
    return std::nullopt;
  }
}

}  // namespace

ir::Graph traced_graph(const AotRequest& request, std::string_view kind, std::string_view stage,
                       std::string_view graph_name, size_t num_inputs, const std::function<ir::Graph()>& trace) {
  const AotConfig& c = request.config;
  if (!c.disk_cache_dir || c.compiler_key.empty()) return trace();
  runtime::Counters& counters = runtime::default_counters();
  const std::optional<std::string> key = cache_key(request, kind);
  if (!key) {
    counters.add("aot_autograd", "trace_cache_bypass");
    return trace();
  }
  std::string path;
  try {
    path = runtime::private_cache_dir(*c.disk_cache_dir, "inductor") + "/a" + *key + ".txt";
  } catch (const runtime::CacheError& e) {
    TORCH_WARN_ONCE("AOTAutograd: the trace cache is not used: ", e.what());
    counters.add("aot_autograd", "trace_cache_bypass");
    return trace();
  }
  if (const std::optional<std::string> body = read_entry(path, *key)) {
    ir::StageScope scope(c.instruments, ir::StageEvent{stage});
    if (std::optional<ir::Graph> g = parse_entry(*body, num_inputs)) {
      counters.add("aot_autograd", "trace_cache_hit");
      ir::StageEvent after{stage, {{graph_name, &*g}}};
      after.cached = true;
      after.detail = "trace cache hit";
      scope.done(std::move(after));
      return std::move(*g);
    }
    scope.done(ir::StageEvent{stage, {}, /*changed=*/false, false, false, {}, "trace cache entry unusable"});
  }
  counters.add("aot_autograd", "trace_cache_miss");
  ir::Graph g = trace();
  std::string text;
  try {
    text = ir::to_text(g);
  } catch (const ir::IrError&) {  // a constant the text form cannot hold
    counters.add("aot_autograd", "trace_cache_bypass");
    return g;
  }
  try {
    runtime::write_atomically(path, std::string(kTraceCacheVersion) + " " + *key + " " + hex64(text) + "\n" + text);
  } catch (const runtime::CacheError& e) {
    TORCH_WARN_ONCE("AOTAutograd: a traced graph was not stored: ", e.what());
  }
  return g;
}

}  // namespace crucible::autograd::detail
