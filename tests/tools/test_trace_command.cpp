// `crucible trace`: a zoo model's graph, printed in a form that reads back.
#include "catch.h"
#include "cli.h"

#include <crucible/ir/graph.h>
#include <crucible/ir/parser.h>

using crucible::testing::run_cli;

TEST_CASE("crucible trace prints a zoo model's forward graph with its parameters lifted", "[tools][trace]") {
  const auto r = run_cli("trace --model mlp --batch 2");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const crucible::ir::Graph g = crucible::ir::parse(r.out);
  const auto& sig = g.signature();
  // fc1..fc3, weight and bias each, then the images.
  CHECK(sig.inputs_of(crucible::ir::InputKind::Parameter).size() == 6);
  CHECK(sig.inputs_of(crucible::ir::InputKind::UserInput).size() == 1);
  REQUIRE(g.outputs().size() == 1);
  CHECK(g.outputs()[0]->meta().sizes == std::vector<int64_t>{2, 10});
}

TEST_CASE("crucible trace --joint adds a gradient output per parameter, functionalized without mutation",
          "[tools][trace]") {
  const auto r = run_cli("trace --model mlp --batch 2 --joint --functionalize");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const crucible::ir::Graph g = crucible::ir::parse(r.out);
  const auto grads = g.signature().outputs_of(crucible::ir::OutputKind::Gradient);
  REQUIRE(grads.size() == 6);
  for (size_t k = 0; k < grads.size(); ++k) {
    const size_t input = *g.signature().outputs[grads[k]].input_index;
    CHECK(g.outputs()[grads[k]]->meta().sizes == g.placeholders()[input]->meta().sizes);
  }
  for (const crucible::ir::Node* n : g.nodes()) {
    INFO(n->target());
    CHECK_FALSE((n->is_call() && n->is_mutating()));
  }
}

TEST_CASE("crucible trace traces every model of the zoo", "[tools][trace]") {
  for (const char* model : {"mlp", "convnet", "gpt", "resnet18"}) {
    INFO(model);
    const auto r = run_cli(std::string("trace --batch 2 --model ") + model);
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    const crucible::ir::Graph g = crucible::ir::parse(r.out);
    CHECK(g.signature().inputs_of(crucible::ir::InputKind::Parameter).size() > 0);
    REQUIRE(g.outputs().size() == 1);
    CHECK(g.outputs()[0]->meta().sizes.front() == 2);
  }
}

TEST_CASE("crucible trace refuses an unknown model", "[tools][trace][errors]") {
  const auto r = run_cli("trace --model alexnet");
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.err, CRUCIBLE_HAS_SUBSTR("alexnet"));
}
