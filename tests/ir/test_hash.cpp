// graph_hash: equal for graphs that differ only in labels, different for any
// change a backend could see, and the same in every process.
#include <crucible/ir/error.h>
#include <crucible/ir/hash.h>
#include <crucible/ir/json.h>
#include <crucible/ir/parser.h>
#include <crucible/ir/printer.h>

#include "catch.h"
#include "sample_graph.h"

#include <set>

using namespace crucible::ir;

namespace {

constexpr const char* kBase = R"(%x : f32[2, 3] = placeholder()
%w : f32[3] grad = placeholder(kind=parameter, target="fc.weight")
%add : f32[2, 3] = aten::add.Tensor(%x, %w, alpha=2) {source="fc", tags=[backward]}
%c : f64[2] = constant([0.5, 1.5])
%s : f32[] = aten::sum(%add, dtype=None)
return (%s : loss, %add : gradient(%w))
)";

GraphHash hash_of(const std::string& text) { return graph_hash(parse(text)); }

// kBase with its first `from` replaced by `to`.
std::string with(std::string_view from, std::string_view to) {
  std::string s = kBase;
  const auto p = s.find(from);
  REQUIRE(p != std::string::npos);
  return s.replace(p, from.size(), to);
}

}  // namespace

TEST_CASE("graph_hash is the same in every process (pinned digest)", "[ir][hash]") {
  // A changed encoding changes this digest; see Note [Graph hash].
  const GraphHash h = hash_of(kBase);
  CHECK(h.hex() == "d9f1625a253f262e877a357323d56278");
  CHECK(h.hex().size() == 32);
}

TEST_CASE("graph_hash ignores Value names and node sources", "[ir][hash]") {
  const GraphHash h = hash_of(kBase);
  std::string renamed = kBase;
  for (auto [from, to] : {std::pair{"%add", "%y"}, std::pair{"%x", "%input0"}, std::pair{"%s", "%loss"}})
    for (size_t p; (p = renamed.find(from)) != std::string::npos;) renamed.replace(p, std::string(from).size(), to);
  CHECK(hash_of(renamed) == h);
  CHECK(hash_of(with("source=\"fc\", ", "source=\"layer1.fc\", ")) == h);
  // A parsed copy and a JSON round trip of the sample graph hash alike.
  const Graph g = crucible::testing::sample_graph();
  CHECK(graph_hash(parse(to_text(g))) == graph_hash(g));
  CHECK(graph_hash(from_json(to_json(g))) == graph_hash(g));
}

TEST_CASE("graph_hash changes with anything a backend computes with", "[ir][hash]") {
  const std::vector<std::string> variants = {
      kBase,
      with("aten::add.Tensor", "aten::sub.Tensor"),                                  // the op
      with("alpha=2", "alpha=3"),                                                    // a constant argument
      with("alpha=2", "alpha=2.0"),                                                  // its kind: int vs float
      with("%x, %w", "%w, %x"),                                                      // argument order
      with("f32[2, 3] = placeholder()", "f32[2, 3] stride=[1, 2] = placeholder()"),  // strides
      with("%x : f32[2, 3]", "%x : f64[2, 3]"),                                      // dtype
      with("%w : f32[3] grad", "%w : f32[3]"),                                       // requires_grad
      with("kind=parameter", "kind=buffer"),                                         // input kind
      with("target=\"fc.weight\"", "target=\"fc.bias\""),                            // parameter target
      with("tags=[backward]", "tags=[recomputable]"),                                // tags
      with("constant([0.5, 1.5])", "constant([0.5, 2.5])"),                          // tensor constant data
      with("%s : loss", "%s"),                                                       // output kind
      with("gradient(%w)", "gradient(%x)"),                                          // output's input index
  };
  std::set<std::string> seen;
  for (const std::string& v : variants) {
    INFO(v);
    CHECK(seen.insert(hash_of(v).hex()).second);
  }
  // Two placeholders swapped: the same text up to names, a different graph.
  CHECK(hash_of("%a : f32[2] = placeholder()\n%b : f32[2] = placeholder()\n"
                "%c : f32[2] = aten::sub.Tensor(%a, %b)\nreturn (%c)\n") !=
        hash_of("%b : f32[2] = placeholder()\n%a : f32[2] = placeholder()\n"
                "%c : f32[2] = aten::sub.Tensor(%a, %b)\nreturn (%c)\n"));
}

TEST_CASE("graph_hash without device indices sees cuda:0 and cuda:1 alike, and cpu apart", "[ir][hash]") {
  // Metadata only: the graphs are hashed, never run, so no GPU is needed.
  auto on = [](const std::string& device) {
    return parse("%x : f32[2] @" + device + " = placeholder()\n%y : f32[2] @" + device +
                 " = aten::_to_copy(%x, device=" + device + ")\nreturn (%y)\n");
  };
  const HashOptions any_index{.device_index = false};
  CHECK(graph_hash(on("cuda:0")) != graph_hash(on("cuda:1")));
  CHECK(graph_hash(on("cuda:0"), any_index) == graph_hash(on("cuda:1"), any_index));
  CHECK(graph_hash(on("cuda:0"), any_index) != graph_hash(on("cpu"), any_index));
}

TEST_CASE("graph_hash without sizes sees a graph at other sizes alike, and other ops or ranks apart", "[ir][hash]") {
  // A reshape to [B*T, C] at two sequence lengths: sizes, strides and the
  // view's integers differ; the structure does not.
  auto at = [](int t, const std::string& op = "aten::relu", const std::string& rank = "") {
    const std::string bt = std::to_string(2 * t), sizes = "2, " + std::to_string(t) + ", 4" + rank;
    return parse("%x : f32[" + sizes + "] = placeholder()\n%v : f32[" + bt + ", 4" + rank + "] = aten::view(%x, [" +
                 bt + ", 4" + rank + "])\n%y : f32[" + bt + ", 4" + rank + "] = " + op + "(%v)\nreturn (%y)\n");
  };
  const HashOptions no_sizes{.sizes = false};
  CHECK(graph_hash(at(3)) != graph_hash(at(5)));
  CHECK(graph_hash(at(3), no_sizes) == graph_hash(at(5), no_sizes));
  CHECK(graph_hash(at(3), no_sizes) != graph_hash(at(3, "aten::tanh"), no_sizes));
  CHECK(graph_hash(at(3), no_sizes) != graph_hash(at(3, "aten::relu", ", 1"), no_sizes));
}

TEST_CASE("graph_hash covers every part of the sample graph and is deterministic", "[ir][hash]") {
  const Graph g = crucible::testing::sample_graph();
  const GraphHash h = graph_hash(g);
  CHECK(graph_hash(g) == h);
  CHECK(graph_hash(crucible::testing::sample_graph()) == h);
  Graph changed = crucible::testing::sample_graph();
  changed.add_constant(int64_t{4}, "extra");
  CHECK(graph_hash(changed) != h);
}

TEST_CASE("graph_hash refuses what the text form cannot hold, naming the node", "[ir][hash]") {
  Graph g;
  Value* x = g.add_placeholder("x", TensorMeta::contiguous({2}));
  Node* add = g.add_call("aten::add.Tensor", {x, x, c10::IValue(c10::complex<double>(1, 2))});
  add->result()->set_meta(TensorMeta::contiguous({2}));
  g.set_output({add->result()});
  REQUIRE_THROWS_AS(graph_hash(g), IrError);
  REQUIRE_THROWS_WITH(graph_hash(g), CRUCIBLE_HAS_SUBSTR("graph_hash: %add (aten::add.Tensor): argument 'alpha'"));
}
