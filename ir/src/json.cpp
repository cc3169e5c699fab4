#include <crucible/ir/error.h>
#include <crucible/ir/json.h>

#include "graph_builder.h"
#include "literal.h"

#include <nlohmann/json.hpp>

#include <cmath>

namespace crucible::ir {

namespace {

using detail::BuildError;
using detail::Literal;
using json = nlohmann::json;

constexpr std::string_view kFormat = "crucible.graph";
constexpr int kVersion = 1;

// --- writing -----------------------------------------------------------------------

json to_json(const Literal& l) {
  switch (l.kind) {
    case Literal::Kind::None:
      return nullptr;
    case Literal::Kind::Bool:
      return l.b;
    case Literal::Kind::Int:
      return l.i;
    case Literal::Kind::Float:
      if (std::isnan(l.f)) return "nan";
      if (std::isinf(l.f)) return l.f < 0 ? "-inf" : "inf";
      return l.f;  // a float32 widened to double is exact
    case Literal::Kind::String:
    case Literal::Kind::Name:
      return l.s;
    case Literal::Kind::Value:
      return {{"value", l.s}};
    case Literal::Kind::List: {
      json a = json::array();
      for (const Literal& e : l.items) a.push_back(to_json(e));
      return a;
    }
  }
  return nullptr;
}

json to_json(const TensorMeta& m) {
  return {{"dtype", dtype_short_name(m.dtype)}, {"sizes", m.sizes},         {"strides", m.strides},
          {"storage_offset", m.storage_offset}, {"device", m.device.str()}, {"requires_grad", m.requires_grad}};
}

json results_of(const Node* n) {
  json a = json::array();
  for (const auto& r : n->results()) {
    json j = {{"name", r->name()}, {"type", r->is_tensor() ? std::string("Tensor") : r->type()->str()}};
    if (r->has_meta()) j["meta"] = to_json(r->meta());
    a.push_back(std::move(j));
  }
  return a;
}

json node_json(const Graph& g, const Node* n, const std::vector<Value*>& placeholders, size_t& placeholder) {
  auto name_of = [&](size_t index) -> json {
    if (index >= placeholders.size())
      throw IrError("the signature refers to placeholder " + std::to_string(index) + ", the graph has " +
                    std::to_string(placeholders.size()));
    return placeholders[index]->name();
  };
  json j = {{"kind", to_string(n->kind())}};
  switch (n->kind()) {
    case NodeKind::Placeholder: {
      const InputSpec& spec = g.signature().inputs.at(placeholder++);
      j["input"] = {{"kind", to_string(spec.kind)},
                    {"target", spec.target},
                    {"duplicate_of", spec.duplicate_of ? name_of(*spec.duplicate_of) : json(nullptr)}};
      break;
    }
    case NodeKind::Call: {
      j["target"] = n->target();
      json args = json::array();
      const auto& formals = n->schema().arguments();
      for (size_t i = 0; i < n->args().size(); ++i) args.push_back(to_json(detail::literal_of(n->arg(i), formals[i])));
      j["args"] = std::move(args);
      break;
    }
    case NodeKind::Constant: {
      const c10::IValue& c = n->constant_value();
      if (!c.isTensor())
        j["value"] = to_json(detail::literal_of(c, n->result()->type()));
      else if (!c.toTensor().is_meta())
        j["data"] = to_json(detail::tensor_data(c.toTensor()));
      break;
    }
    case NodeKind::Output: {
      json outs = json::array();
      const auto& specs = g.signature().outputs;
      for (size_t i = 0; i < n->args().size(); ++i) {
        const OutputSpec spec = i < specs.size() ? specs[i] : OutputSpec{};
        outs.push_back({{"value", n->arg(i).value()->name()},
                        {"kind", to_string(spec.kind)},
                        {"input", spec.input_index ? name_of(*spec.input_index) : json(nullptr)}});
      }
      j["outputs"] = std::move(outs);
      break;
    }
  }
  if (!n->is_output()) j["results"] = results_of(n);
  if (!n->source().empty()) j["source"] = n->source();
  if (!n->tags().empty()) j["tags"] = n->tags();
  return j;
}

// --- reading -----------------------------------------------------------------------

// Errors carry the path of the field at fault ("nodes[3].args[1]").
struct Field {
  const json& j;
  std::string path;

  [[noreturn]] void fail(const std::string& msg) const { throw IrError("JSON graph: " + path + ": " + msg); }
  Field operator[](const char* key) const {
    if (!j.is_object()) fail("expected an object");
    auto it = j.find(key);
    if (it == j.end()) Field{j, path + "." + key}.fail("missing");
    return {*it, path + "." + key};
  }
  Field operator[](size_t i) const { return {j[i], path + "[" + std::to_string(i) + "]"}; }
  bool has(const char* key) const { return j.is_object() && j.contains(key); }
  const json& array() const {
    if (!j.is_array()) fail("expected an array");
    return j;
  }
  template <typename T>
  T as(const char* what) const {
    try {
      return j.get<T>();
    } catch (const json::exception&) {
      fail(std::string("expected ") + what + ", got " + j.dump());
    }
  }
};

Literal literal_of(const Field& f) {
  const json& j = f.j;
  if (j.is_null()) return Literal::none();
  if (j.is_boolean()) return Literal::of_bool(j.get<bool>());
  if (j.is_number_integer()) return Literal::of_int(j.get<int64_t>());
  if (j.is_number_float()) return Literal::of_float(j.get<double>());
  if (j.is_string()) return Literal::of(Literal::Kind::String, j.get<std::string>());
  if (j.is_object()) return Literal::of(Literal::Kind::Value, f["value"].as<std::string>("a value name"));
  Literal l;
  l.kind = Literal::Kind::List;
  for (size_t i = 0; i < f.array().size(); ++i) l.items.push_back(literal_of(f[i]));
  return l;
}

TensorMeta meta_of(const Field& f) {
  TensorMeta m;
  const auto dtype = f["dtype"].as<std::string>("a dtype name");
  if (auto d = dtype_from_short_name(dtype))
    m.dtype = *d;
  else
    f["dtype"].fail("unknown dtype '" + dtype + "'");
  m.sizes = f["sizes"].as<std::vector<int64_t>>("a list of ints");
  m.strides = f["strides"].as<std::vector<int64_t>>("a list of ints");
  if (m.strides.size() != m.sizes.size()) f["strides"].fail("as many strides as sizes expected");
  m.storage_offset = f["storage_offset"].as<int64_t>("an int");
  const auto device = f["device"].as<std::string>("a device");
  try {
    m.device = c10::Device(device);
  } catch (const c10::Error&) {
    f["device"].fail("bad device '" + device + "'");
  }
  m.requires_grad = f["requires_grad"].as<bool>("true or false");
  return m;
}

std::vector<detail::ResultDecl> results_of(const Field& f) {
  std::vector<detail::ResultDecl> rs;
  for (size_t i = 0; i < f.array().size(); ++i) {
    const Field r = f[i];
    detail::ResultDecl d;
    d.name = r["name"].as<std::string>("a name");
    d.type = r["type"].as<std::string>("a type name");
    if (r.has("meta")) {
      if (d.type != "Tensor") r["meta"].fail("only tensors have meta");
      d.meta = meta_of(r["meta"]);
    }
    rs.push_back(std::move(d));
  }
  return rs;
}

std::optional<Literal> value_ref(const Field& f) {
  if (f.j.is_null()) return std::nullopt;
  return Literal::of(Literal::Kind::Value, f.as<std::string>("a value name or null"));
}

void read_node(detail::GraphBuilder& b, const Field& f) {
  const auto kind = f["kind"].as<std::string>("a node kind");
  Node* n;
  if (kind == "output") {
    std::vector<detail::OutputDecl> outs;
    const Field list = f["outputs"];
    for (size_t i = 0; i < list.array().size(); ++i) {
      const Field o = list[i];
      const auto k = o["kind"].as<std::string>("an output kind");
      const auto ok = output_kind_from_string(k);
      if (!ok) o["kind"].fail("unknown output kind '" + k + "'");
      outs.push_back({*value_ref(o["value"]), *ok, value_ref(o["input"])});
    }
    b.output(outs, 0, 0);
    n = b.graph().output_node();
  } else {
    const auto results = results_of(f["results"]);
    if (kind == "placeholder") {
      if (results.size() != 1) f["results"].fail("a placeholder has one result");
      const Field in = f["input"];
      const auto k = in["kind"].as<std::string>("an input kind");
      const auto ik = input_kind_from_string(k);
      if (!ik) in["kind"].fail("unknown input kind '" + k + "'");
      n = b.placeholder(results[0], {*ik, in["target"].as<std::string>("a string"), {}}, value_ref(in["duplicate_of"]));
    } else if (kind == "constant") {
      if (results.size() != 1) f["results"].fail("a constant has one result");
      const Literal value = f.has("value") ? literal_of(f["value"]) : f.has("data") ? literal_of(f["data"]) : Literal();
      n = b.constant(results[0], value);
    } else if (kind == "call") {
      const auto target = f["target"].as<std::string>("an operator name");
      const c10::OperatorHandle& op = b.op(target, 0, 0);
      const auto& formals = op.schema().arguments();
      const Field args = f["args"];
      if (args.array().size() > formals.size())
        args.fail(target + " takes " + std::to_string(formals.size()) + " arguments, " + std::to_string(args.j.size()) +
                  " given");
      std::vector<Argument> as;
      for (size_t i = 0; i < args.j.size(); ++i) {
        try {
          as.push_back(detail::argument_of(literal_of(args[i]), formals[i], b.graph()));
        } catch (const BuildError& e) {
          args[i].fail(e.what());
        }
      }
      n = b.call(op, std::move(as), results, 0, 0);
    } else {
      f["kind"].fail("unknown node kind '" + kind + "' (placeholder, call, constant, output)");
    }
  }
  std::vector<std::string> tags;
  if (f.has("tags")) tags = f["tags"].as<std::vector<std::string>>("a list of strings");
  b.annotate(n, f.has("source") ? f["source"].as<std::string>("a string") : "", tags);
}

}  // namespace

std::string to_json(const Graph& graph, int indent) {
  const auto placeholders = graph.placeholders();
  json nodes = json::array();
  size_t placeholder = 0;
  for (const Node* n : graph.nodes()) nodes.push_back(node_json(graph, n, placeholders, placeholder));
  const json j = {{"format", kFormat}, {"version", kVersion}, {"nodes", std::move(nodes)}};
  return j.dump(indent);
}

Graph from_json(std::string_view text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw IrError(std::string("JSON graph: not JSON: ") + e.what());
  }
  const Field root{j, "graph"};
  if (root["format"].j != kFormat)
    root["format"].fail("expected \"" + std::string(kFormat) + "\", got " + root["format"].j.dump());
  if (root["version"].j != kVersion)
    root["version"].fail("version " + root["version"].j.dump() + " is not supported (this build reads version " +
                         std::to_string(kVersion) + ")");
  detail::GraphBuilder b;
  const Field nodes = root["nodes"];
  for (size_t i = 0; i < nodes.array().size(); ++i) {
    const Field node = nodes[i];
    try {
      read_node(b, node);
    } catch (const BuildError& e) {
      node.fail(e.what());
    } catch (const c10::Error& e) {
      node.fail(e.what_without_backtrace());
    }
  }
  try {
    return b.finish();
  } catch (const BuildError& e) {
    root["nodes"].fail(e.what());
  }
}

}  // namespace crucible::ir
