// See codecache/schedule_entry.h.
#include "codecache/schedule_entry.h"

#include "codecache/cpp_builder.h"

#include <crucible/inductor/error.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <exception>
#include <string_view>
#include <unordered_map>

namespace crucible::inductor::detail {

namespace {

using nlohmann::json;

// Nodes and values by position in graph order: what an entry names them by.
struct Positions {
  std::vector<const ir::Node*> nodes;
  std::vector<const ir::Value*> values;
  std::unordered_map<const ir::Node*, int64_t> node_index;
  std::unordered_map<const ir::Value*, int64_t> value_index;

  // A schedule only names the graph's own nodes and values; anything else
  // cannot be stored (the entry is then not written).
  template <typename T>
  static int64_t position(const std::unordered_map<const T*, int64_t>& index, const T* item) {
    auto it = index.find(item);
    if (it == index.end()) throw InductorError("inductor: a schedule names a node or value outside its graph");
    return it->second;
  }

  explicit Positions(const ir::Graph& g) {
    for (const ir::Node* n : g.nodes()) {
      node_index.emplace(n, static_cast<int64_t>(nodes.size()));
      nodes.push_back(n);
      for (size_t r = 0; r < n->num_results(); ++r) {
        value_index.emplace(n->result(r), static_cast<int64_t>(values.size()));
        values.push_back(n->result(r));
      }
    }
  }
};

// Note [Graph cache entries]
// An entry is a line of JSON (the steps, the kernels' signatures, and the
// generated source's length and digest), then the source as it is. The
// source is most of an entry (600 KB of GPT-2's 740 KB), and as a JSON
// string it took nlohmann's parser 8–12 ms of a 150–250 ms warm compile;
// read as it is, it costs a digest. A truncated or altered source fails the
// length or the digest: the entry is then a miss.
json launch_json(const Launch& l) {
  return {l.block, l.units, l.per_block, l.shared_bytes, l.exact, l.partial_bytes, l.arrivals};
}

Launch launch_of(const json& l) {
  return Launch{l.at(0).get<int>(),  l.at(1).get<int64_t>(), l.at(2).get<int64_t>(), l.at(3).get<int>(),
                l.at(4).get<bool>(), l.at(5).get<int64_t>(), l.at(6).get<int64_t>()};
}

}  // namespace

std::string schedule_entry(const std::string& key, const CompiledSchedule& s, const ir::Graph& graph) {
  const Positions at(graph);
  json steps = json::array(), kernels = json::array();
  for (const Schedule::Step& st : s.steps)
    steps.push_back(st.extern_node ? json{{"node", Positions::position(at.node_index, st.extern_node)}}
                                   : json{{"kernel", st.kernel}});
  for (const KernelPlan& k : s.kernels) {
    json operands = json::array();
    for (const KernelOperand& o : k.operands)
      operands.push_back({{"value", o.value ? Positions::position(at.value_index, o.value) : -1},
                          {"written", o.written},
                          {"input", o.input},
                          {"host_scalar", o.host_scalar},
                          {"sizes", o.sizes},
                          {"strides", o.strides},
                          {"dtype", static_cast<int>(o.dtype)}});
    json configs = json::array();
    for (const KernelConfig& c : k.configs) configs.push_back({c.name, launch_json(c.launch)});
    kernels.push_back({{"name", k.name},
                       {"fuses", k.fuses},
                       {"launch", launch_json(k.launch)},
                       {"operands", std::move(operands)},
                       {"configs", std::move(configs)},
                       {"tuning_key", k.tuning_key}});
  }
  const json header = {{"version", kCodegenVersion},
                       {"key", key},
                       {"device", s.device.str()},
                       {"source_bytes", s.source.size()},
                       {"source_digest", cache_key(s.source)},
                       {"steps", steps},
                       {"kernels", kernels}};
  return header.dump() + "\n" + s.source;
}

std::optional<CompiledSchedule> parse_schedule_entry(const std::string& text, const std::string& key,
                                                     const ir::Graph& graph) {
  if (text.empty()) return std::nullopt;
  // Anything that does not parse or fit is refused (a truncated write, a
  // disk error, an older format).
  try {
    const size_t newline = text.find('\n');
    if (newline == std::string::npos) return std::nullopt;
    const json e = json::parse(std::string_view(text).substr(0, newline));
    if (e.at("version").get<std::string>() != kCodegenVersion || e.at("key").get<std::string>() != key)
      return std::nullopt;
    CompiledSchedule s;
    s.source = text.substr(newline + 1);
    if (s.source.size() != e.at("source_bytes").get<size_t>() ||
        cache_key(s.source) != e.at("source_digest").get<std::string>())
      return std::nullopt;
    const Positions at(graph);
    s.device = c10::Device(e.at("device").get<std::string>());
    for (const json& k : e.at("kernels")) {
      KernelPlan kp;
      kp.name = k.at("name").get<std::string>();
      kp.fuses = k.at("fuses").get<std::string>();
      kp.launch = launch_of(k.at("launch"));
      for (const json& c : k.at("configs")) kp.configs.push_back({c.at(0).get<std::string>(), launch_of(c.at(1))});
      kp.tuning_key = k.at("tuning_key").get<std::string>();
      for (const json& o : k.at("operands")) {
        const auto v = o.at("value").get<int64_t>();
        const int dtype = o.at("dtype").get<int>();
        if (v < -1 || v >= static_cast<int64_t>(at.values.size()) || dtype < 0 ||
            dtype >= static_cast<int>(c10::ScalarType::NumOptions))
          return std::nullopt;
        kp.operands.push_back(
            KernelOperand{v < 0 ? nullptr : at.values[v], o.at("written").get<bool>(), o.at("input").get<bool>(),
                          o.at("host_scalar").get<bool>(), o.at("sizes").get<std::vector<int64_t>>(),
                          o.at("strides").get<std::vector<int64_t>>(), static_cast<c10::ScalarType>(dtype)});
      }
      s.kernels.push_back(std::move(kp));
    }
    for (const json& st : e.at("steps")) {
      if (st.contains("node")) {
        const auto n = st.at("node").get<int64_t>();
        if (n < 0 || n >= static_cast<int64_t>(at.nodes.size()) || !at.nodes[n]->is_call()) return std::nullopt;
        s.steps.push_back({at.nodes[n], -1});
      } else {
        const int k = st.at("kernel").get<int>();
        if (k < 0 || k >= static_cast<int>(s.kernels.size())) return std::nullopt;
        s.steps.push_back({nullptr, k});
      }
    }
    return s;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace crucible::inductor::detail
