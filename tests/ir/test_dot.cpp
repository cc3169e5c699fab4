// DOT export: one node per graph node, one edge per use, backward nodes
// marked, and Graphviz accepts the output (when `dot` is installed).
#include <crucible/ir/dot.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "catch.h"
#include "sample_graph.h"

using namespace crucible::ir;

namespace {
size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}
}  // namespace

TEST_CASE("DOT has a node per graph node and an edge per use", "[ir][dot]") {
  const Graph g = crucible::testing::sample_graph();
  const std::string dot = to_dot(g);
  INFO(dot);
  size_t uses = 0, backward = 0;
  for (const Node* n : g.nodes()) {
    uses += n->inputs().size();
    backward += n->has_tag("backward");
  }
  REQUIRE(dot.rfind("digraph crucible {", 0) == 0);
  REQUIRE(count(dot, " [label=\"%") + count(dot, " [label=\"output") == g.num_nodes());
  REQUIRE(count(dot, " -> ") == uses);
  REQUIRE(backward == 1);
  REQUIRE(count(dot, "fillcolor=\"#f4cccc\"") == backward);
  CHECK_THAT(dot, CRUCIBLE_HAS_SUBSTR("%native_layer_norm_1 : f32[2, 4, 4, 1]\\n"));
  CHECK_THAT(dot, CRUCIBLE_HAS_SUBSTR("placeholder (parameter conv.weight)"));
  CHECK_THAT(dot, CRUCIBLE_HAS_SUBSTR("[label=\"max_pool2d_with_indices_1\"]"));  // a multi-result edge
  CHECK_THAT(dot, CRUCIBLE_HAS_SUBSTR("tooltip=\"LayerNorm(ln).backward\""));

  std::ostringstream os;
  to_dot(g, os);
  REQUIRE(os.str() == dot);
}

TEST_CASE("Graphviz renders the DOT export", "[ir][dot]") {
  if (std::system("dot -V > /dev/null 2>&1") != 0)
    CRUCIBLE_SKIP("Graphviz's dot is not installed (apt-get install graphviz)");
  const auto dir = std::filesystem::temp_directory_path() / ("crucible_dot_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto in = dir / "g.dot", out = dir / "g.svg", err = dir / "err.txt";
  std::ofstream(in) << to_dot(crucible::testing::sample_graph());
  const std::string cmd = "dot -Tsvg '" + in.string() + "' -o '" + out.string() + "' 2> '" + err.string() + "'";
  const int rc = std::system(cmd.c_str());
  std::stringstream errors, svg;
  errors << std::ifstream(err).rdbuf();
  svg << std::ifstream(out).rdbuf();
  std::filesystem::remove_all(dir);
  INFO(errors.str());
  REQUIRE(rc == 0);
  REQUIRE(errors.str().empty());  // no warnings either
  REQUIRE_THAT(svg.str(), CRUCIBLE_HAS_SUBSTR("<svg"));
}
