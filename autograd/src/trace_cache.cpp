#include "trace_cache.h"

#include <crucible/ir/error.h>
#include <crucible/ir/instrument.h>
#include <crucible/ir/parser.h>
#include <crucible/ir/printer.h>
#include <crucible/runtime/disk_cache.h>
#include <crucible/runtime/instruments.h>

#include <ATen/Context.h>
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
// A std::string: GCC 12 at -O2 takes `std::string(const char*) + " " + ...`
// for an out-of-bounds write (-Warray-bounds), which this is not.
const std::string kTraceCacheVersion = "crucible-aot-trace-1";

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

// The text both keys digest: Note [AOT trace cache]'s key, with `analysis`
// and `metadata` standing for the analysis's graph digest and result.
std::string key_text(const AotRequest& request, std::string_view kind, const ir::GraphHash& analysis,
                     const ViewAndMutationMeta& metadata) {
  const AotConfig& c = request.config;
  std::string k = kTraceCacheVersion + "\n" + std::string(kind) + "\ncode\n" + runtime::startup_code_identity() +
                  "analysis " + analysis.hex() + "\ncompiler " + c.compiler_key + "\nmode " +
                  std::to_string(static_cast<int>(c.trace_mode)) + " freeze " + std::to_string(c.freeze) + " state " +
                  std::to_string(c.num_params_buffers) + " keep_mutations " +
                  std::to_string(c.keep_inference_input_mutations) + " rng " + std::to_string(c.functionalize_rng_ops) +
                  " joint " + std::to_string(request.trace_joint) + "\ndecompositions";
  std::vector<std::string_view> ops;
  for (const auto& [name, d] : c.decompositions) ops.push_back(name);
  std::sort(ops.begin(), ops.end());
  for (std::string_view op : ops) k += " " + std::string(op);
  k += "\nwrappers";
  for (const auto& w : c.wrappers) k += " " + std::string(w->name());
  k += "\n" + metadata.to_string() + "\nlifted";
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
  return k;
}

std::optional<std::string> cache_key(const AotRequest& request, std::string_view kind) {
  if (!request.analysis_hash) return std::nullopt;
  return hex128(key_text(request, kind, *request.analysis_hash, request.fw_metadata));
}

// The path of entry `<prefix><key>.txt` in the inductor's cache directory,
// or nullopt when the directory is unusable (warned of once).
std::optional<std::string> entry_path(const std::string& dir, char prefix, const std::string& key) {
  try {
    return runtime::private_cache_dir(dir, "inductor") + "/" + prefix + key + ".txt";
  } catch (const runtime::CacheError& e) {
    TORCH_WARN_ONCE("AOTAutograd: the trace cache is not used: ", e.what());
    return std::nullopt;
  }
}

// The body of the entry at `path` if it is whole and stored under `key`.
std::optional<std::string> read_entry(const std::string& path, const std::string& key) {
  std::string text = runtime::read_file(path);
  const std::string header = kTraceCacheVersion + " " + key + " ";
  if (text.compare(0, header.size(), header) != 0) return std::nullopt;
  const size_t eol = text.find('\n', header.size());
  if (eol == std::string::npos) return std::nullopt;
  std::string body = text.substr(eol + 1);
  if (text.compare(header.size(), eol - header.size(), hex64(body)) != 0) return std::nullopt;
  return body;
}

void write_entry(const std::string& path, const std::string& key, const std::string& body) {
  try {
    runtime::write_atomically(path, kTraceCacheVersion + " " + key + " " + hex64(body) + "\n" + body);
  } catch (const runtime::CacheError& e) {
    TORCH_WARN_ONCE("AOTAutograd: a trace cache entry was not stored: ", e.what());
  }
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

// The digest a fingerprint entry holds: 32 hex digits, high half first.
std::optional<ir::GraphHash> parse_hash(std::string_view body) {
  if (body.size() != 32 || body.find_first_not_of("0123456789abcdef") != std::string_view::npos) return std::nullopt;
  ir::GraphHash h;
  h.high = std::stoull(std::string(body.substr(0, 16)), nullptr, 16);
  h.low = std::stoull(std::string(body.substr(16)), nullptr, 16);
  return h;
}

// What a real-mode trace may follow that a fake-mode one does not see: the
// process-wide switches by which ATen's composite ops pick a device's kernel
// (Note [Fake fingerprints]).
std::string device_routing_flags() {
  const at::Context& ctx = at::globalContext();
  return "cudnn " + std::to_string(ctx.userEnabledCuDNN()) + " mkldnn " + std::to_string(ctx.userEnabledMkldnn()) +
         " flash " + std::to_string(ctx.userEnabledFlashSDP()) + " mem_efficient " +
         std::to_string(ctx.userEnabledMemEfficientSDP()) + " math " + std::to_string(ctx.userEnabledMathSDP()) +
         " cudnn_sdp " + std::to_string(ctx.userEnabledCuDNNSDP()) + " deterministic " +
         std::to_string(ctx.deterministicAlgorithms());
}

bool same_tensors(const std::vector<tracer::NamedTensor>& a, const std::vector<tracer::NamedTensor>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const auto& x, const auto& y) { return x.name == y.name && x.tensor.is_same(y.tensor); });
}

// Drops the warnings of a fingerprint's trace: they speak of fake mode,
// which the user did not ask for (the real analysis warns where it runs).
struct DropWarnings final : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

}  // namespace

ir::Graph traced_graph(const AotRequest& request, std::string_view kind, std::string_view stage,
                       std::string_view graph_name, size_t num_inputs, const std::function<ir::Graph()>& trace) {
  const AotConfig& c = request.config;
  if (!c.disk_cache_dir || c.compiler_key.empty()) return trace();
  runtime::Counters& counters = runtime::default_counters();
  const std::optional<std::string> key = cache_key(request, kind);
  const std::optional<std::string> path = key ? entry_path(*c.disk_cache_dir, 'a', *key) : std::nullopt;
  if (!path) {
    counters.add("aot_autograd", "trace_cache_bypass");
    return trace();
  }
  if (const std::optional<std::string> body = read_entry(*path, *key)) {
    ir::StageScope scope(c.instruments, ir::StageEvent{.stage = stage});
    if (std::optional<ir::Graph> g = parse_entry(*body, num_inputs)) {
      counters.add("aot_autograd", "trace_cache_hit");
      ir::StageEvent after{.stage = stage, .graphs = {{graph_name, &*g}}};
      after.cached = true;
      after.detail = "trace cache hit";
      scope.done(std::move(after));
      return std::move(*g);
    }
    scope.done(ir::StageEvent{.stage = stage, .changed = false, .detail = "trace cache entry unusable"});
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
  write_entry(*path, *key, text);
  return g;
}

ViewAndMutationMeta fingerprinted_analysis(const AotRequest& request, std::vector<tracer::NamedTensor>* lifted,
                                           std::optional<ir::GraphHash>* graph_hash, const MetadataAnalysis& analyze) {
  const AotConfig& c = request.config;
  if (c.trace_mode != tracer::TraceMode::Real || !c.disk_cache_dir || c.compiler_key.empty() || !graph_hash)
    return analyze(request, lifted, graph_hash);
  runtime::Counters& counters = runtime::default_counters();
  AotRequest fake = request;
  fake.config.trace_mode = tracer::TraceMode::Fake;
  ViewAndMutationMeta fake_meta;
  std::vector<tracer::NamedTensor> fake_lifted;
  std::optional<ir::GraphHash> fake_hash;
  try {
    DropWarnings drop;
    c10::WarningUtils::WarningHandlerGuard quiet(&drop);
    fake_meta = analyze(fake, lifted ? &fake_lifted : nullptr, &fake_hash);
  } catch (const std::exception&) {
    // Data-dependent code (item() on a fake tensor), an op fake mode cannot
    // run: the function has no fingerprint, and the real analysis says
    // whatever it has to say about it.
    fake_hash.reset();
  }
  std::optional<std::string> key;
  if (fake_hash) {
    std::string text = key_text(request, "fingerprint", *fake_hash, fake_meta) + "found";
    for (const tracer::NamedTensor& t : fake_lifted) text += " " + t.name;
    key = hex128(text + "\n" + device_routing_flags());
  }
  const std::optional<std::string> path = key ? entry_path(*c.disk_cache_dir, 'f', *key) : std::nullopt;
  if (!path) {
    counters.add("aot_autograd", "fingerprint_bypass");
    return analyze(request, lifted, graph_hash);
  }
  if (const std::optional<std::string> body = read_entry(*path, *key))
    if (const std::optional<ir::GraphHash> real_hash = parse_hash(*body)) {
      counters.add("aot_autograd", "fingerprint_hit");
      *graph_hash = real_hash;
      if (lifted) *lifted = std::move(fake_lifted);
      return fake_meta;
    }
  counters.add("aot_autograd", "fingerprint_miss");
  ViewAndMutationMeta meta = analyze(request, lifted, graph_hash);
  if (*graph_hash && meta.to_string() == fake_meta.to_string() &&
      same_tensors(lifted ? *lifted : std::vector<tracer::NamedTensor>{}, fake_lifted))
    write_entry(*path, *key, (*graph_hash)->hex());
  else
    counters.add("aot_autograd", "fingerprint_differs");
  return meta;
}

}  // namespace crucible::autograd::detail
