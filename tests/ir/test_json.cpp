// JSON serialization: lossless against the text form, a readable structure
// for tools, and errors that name the field at fault.
#include <crucible/ir/error.h>
#include <crucible/ir/json.h>
#include <crucible/ir/parser.h>
#include <crucible/ir/printer.h>

#include "catch.h"
#include "graph_equal.h"
#include "sample_graph.h"

using namespace crucible::ir;

TEST_CASE("the sample graph round-trips through JSON", "[ir][json]") {
  const Graph g = crucible::testing::sample_graph();
  const std::string json = to_json(g);
  INFO(json);
  const Graph back = from_json(json);
  REQUIRE(to_text(back) == to_text(g));
  crucible::testing::require_same_graph(g, back);
  REQUIRE(to_json(back) == json);
  REQUIRE(from_json(to_json(g, 2)).num_nodes() == g.num_nodes());  // pretty-printed reads the same
}

TEST_CASE("JSON spells nodes, metadata and constants for tools", "[ir][json]") {
  const Graph g = parse(R"(%x : f32[2, 3] = placeholder()
%w : f32[3] grad = placeholder(kind=parameter, target="fc.weight")
%add : f32[2, 3] = aten::add.Tensor(%x, %w, alpha=2) {source="fc", tags=[backward]}
%c : f64[2] = constant([0.5, nan])
%s : f32[] = aten::sum(%add, dtype=None)
return (%s : loss, %add : gradient(%w))
)");
  const std::string json = to_json(g);
  INFO(json);
  for (
      const char* part : {
          R"({"format":"crucible.graph","nodes":[)",
          R"({"input":{"duplicate_of":null,"kind":"user_input","target":""},"kind":"placeholder","results":[{"meta":{"device":"cpu","dtype":"f32","requires_grad":false,"sizes":[2,3],"storage_offset":0,"strides":[3,1]},"name":"x","type":"Tensor"}]})",
          R"({"args":[{"value":"x"},{"value":"w"},2],"kind":"call","results":[)",
          R"("source":"fc","tags":["backward"],"target":"aten::add.Tensor"})",
          R"({"data":[0.5,"nan"],"kind":"constant")",
          R"("args":[{"value":"add"},null])",
          R"({"kind":"output","outputs":[{"input":null,"kind":"loss","value":"s"},{"input":"w","kind":"gradient","value":"add"}]})",
          R"("version":1})",
      })
    CHECK_THAT(json, CRUCIBLE_HAS_SUBSTR(part));
}

TEST_CASE("JSON errors name the field at fault", "[ir][json]") {
  const std::string good =
      to_json(parse("%x : f32[2] = placeholder()\n%y : f32[2] = aten::mul.Scalar(%x, 2.0)\nreturn (%y)\n"));
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const auto p = s.find(from);
    REQUIRE(p != std::string::npos);
    return s.replace(p, from.size(), to);
  };
  REQUIRE_THROWS_WITH(from_json("{"), CRUCIBLE_HAS_SUBSTR("JSON graph: not JSON"));
  REQUIRE_THROWS_WITH(from_json(with("crucible.graph", "other")),
                      CRUCIBLE_HAS_SUBSTR("graph.format: expected \"crucible.graph\""));
  REQUIRE_THROWS_WITH(from_json(with("\"version\":1", "\"version\":7")),
                      CRUCIBLE_HAS_SUBSTR("graph.version: version 7 is not supported"));
  REQUIRE_THROWS_WITH(from_json(with("\"dtype\":\"f32\"", "\"dtype\":\"f33\"")),
                      CRUCIBLE_HAS_SUBSTR("graph.nodes[0].results[0].meta.dtype: unknown dtype 'f33'"));
  REQUIRE_THROWS_WITH(from_json(with("\"sizes\":[2]", "\"sizes\":\"2\"")),
                      CRUCIBLE_HAS_SUBSTR("graph.nodes[0].results[0].meta.sizes: expected a list of ints, got \"2\""));
  REQUIRE_THROWS_WITH(from_json(with(",\"requires_grad\":false", "")),
                      CRUCIBLE_HAS_SUBSTR("graph.nodes[0].results[0].meta.requires_grad: missing"));
  REQUIRE_THROWS_WITH(from_json(with("aten::mul.Scalar", "aten::mul.Scalr")),
                      CRUCIBLE_HAS_SUBSTR("graph.nodes[1]: operator 'aten::mul.Scalr' is not registered"));
  REQUIRE_THROWS_WITH(from_json(with("{\"value\":\"x\"},2.0", "{\"value\":\"z\"},2.0")),
                      CRUCIBLE_HAS_SUBSTR("graph.nodes[1].args[0]: argument 'self' (Tensor): undefined value %z"));
  REQUIRE_THROWS_WITH(from_json(with("{\"value\":\"x\"},2.0", "{\"value\":\"x\"},\"two\"")),
                      CRUCIBLE_HAS_SUBSTR("graph.nodes[1].args[1]: argument 'other' (Scalar): expected a Scalar"));
  REQUIRE_THROWS_WITH(from_json(with("\"kind\":\"call\"", "\"kind\":\"cal\"")),
                      CRUCIBLE_HAS_SUBSTR("graph.nodes[1].kind: unknown node kind 'cal'"));
  REQUIRE_THROWS_WITH(from_json(with("\"name\":\"y\"", "\"name\":\"x\"")),
                      CRUCIBLE_HAS_SUBSTR("graph.nodes[1]: %x is defined twice"));
}
