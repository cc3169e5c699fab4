// The pass manager: passes by name, verification between passes, and the
// instruments (should_run, timing, change detection).
#include <crucible/ir/error.h>
#include <crucible/ir/interpreter.h>
#include <crucible/ir/pass_manager.h>

#include <ATen/ATen.h>

#include "catch.h"
#include "testing.h"

using namespace crucible::ir;

namespace {

TensorMeta f32(std::vector<int64_t> sizes) { return TensorMeta::contiguous(std::move(sizes)); }

// relu(x + y) computed twice, plus a dead exp: CSE then DCE leave one add,
// one relu and the mul.
Graph redundant() {
  Graph g;
  Value* x = g.add_placeholder("x", f32({3}));
  Value* y = g.add_placeholder("y", f32({3}));
  Value* a1 = g.add_call("aten::add.Tensor", {x, y})->result();
  Value* r1 = g.add_call("aten::relu", {a1})->result();
  Value* a2 = g.add_call("aten::add.Tensor", {x, y})->result();
  Value* r2 = g.add_call("aten::relu", {a2})->result();
  Value* e = g.add_call("aten::exp", {x})->result();
  Value* m = g.add_call("aten::mul.Tensor", {r1, r2})->result();
  for (Value* v : {a1, r1, a2, r2, e, m}) v->set_meta(f32({3}));
  g.set_output({m});
  return g;
}

// Records what the hooks saw.
struct Recorder : Instrument {
  std::vector<std::string> skip;
  std::vector<std::string> log;
  bool should_run(const StageEvent& e) override { return std::find(skip.begin(), skip.end(), e.stage) == skip.end(); }
  void before_stage(const StageEvent& e) override {
    log.push_back("before " + std::string(e.stage) + (e.graphs.empty() ? "" : " " + std::string(e.graphs[0].name)));
  }
  void after_stage(const StageEvent& e) override {
    log.push_back("after " + std::string(e.stage) + (e.failed ? " failed" : e.changed ? " changed" : " unchanged"));
  }
};

}  // namespace

TEST_CASE("passes run by name, in order, and keep the interpreted result", "[ir][pass_manager]") {
  Graph g = redundant();
  const std::vector<at::Tensor> inputs{at::randn({3}), at::randn({3})};
  const auto before = Interpreter(g)(inputs);

  const PassRegistry registry = PassRegistry::builtin();
  REQUIRE(registry.names() == std::vector<std::string>{"cse", "dce", "fold_view_chains", "fuse_addmm", "fuse_attention",
                                                       "fuse_flash_attention", "fuse_linear_cross_entropy",
                                                       "fuse_reduced_precision_attention", "propagate_meta"});
  PassManager(registry.passes({"cse", "dce"})).run(g);
  std::vector<std::string> targets;
  for (Node* n : g.nodes())
    if (n->is_call()) targets.push_back(n->target());
  REQUIRE(targets == std::vector<std::string>{"aten::add.Tensor", "aten::relu", "aten::mul.Tensor"});
  REQUIRE_EQUAL_TENSORS(Interpreter(g)(inputs).at(0), before.at(0));
  const auto r = at::relu(inputs[0] + inputs[1]);
  REQUIRE_EQUAL_TENSORS(Interpreter(g)(inputs).at(0), r * r);
}

TEST_CASE("the registry names the passes it knows", "[ir][pass_manager]") {
  PassRegistry registry = PassRegistry::builtin();
  REQUIRE_THROWS_WITH(
      registry.get("dead_code"),
      CRUCIBLE_HAS_SUBSTR(
          "unknown pass 'dead_code'; registered passes: cse, dce, "
          "fold_view_chains, fuse_addmm, fuse_attention, fuse_flash_attention, fuse_linear_cross_entropy, "
          "fuse_reduced_precision_attention, "
          "propagate_meta"));
  REQUIRE_THROWS_WITH(registry.add({"dce", [](Graph&) {}}), CRUCIBLE_HAS_SUBSTR("'dce' is already registered"));
  registry.add({"noop", [](Graph&) {}});
  REQUIRE(registry.names() == std::vector<std::string>{"cse", "dce", "fold_view_chains", "fuse_addmm", "fuse_attention",
                                                       "fuse_flash_attention", "fuse_linear_cross_entropy",
                                                       "fuse_reduced_precision_attention", "noop", "propagate_meta"});
}

TEST_CASE("verification between passes names the pass that broke the graph", "[ir][pass_manager]") {
  const Pass breaks{"breaks", [](Graph& g) {
                      for (Node* n : g.nodes())
                        if (n->target() == "aten::mul.Tensor") n->set_arg(1, int64_t{3});
                    }};
  Graph g = redundant();
  REQUIRE_THROWS_WITH(PassManager({PassRegistry::builtin().get("cse"), breaks}).run(g),
                      CRUCIBLE_HAS_SUBSTR("pass 'breaks' left an invalid graph: verify: node %mul (aten::mul.Tensor): "
                                          "argument 'other' (Tensor) takes a tensor Value"));
  Graph unchecked = redundant();
  REQUIRE_NOTHROW(PassManager({breaks}, PassManagerOptions{.verify = false, .instruments = {}}).run(unchecked));

  // An invalid input is reported before any pass runs.
  Graph bad = redundant();
  bad.add_call("aten::neg", {bad.placeholders()[0]});  // no meta
  REQUIRE_THROWS_WITH(PassManager({}).run(bad), CRUCIBLE_HAS_SUBSTR("the input graph is invalid, before any pass ran"));

  // A pass that throws is named.
  Graph g2 = redundant();
  const Pass throws{"throws", [](Graph&) { throw std::runtime_error("out of ideas"); }};
  REQUIRE_THROWS_WITH(PassManager({throws}).run(g2), CRUCIBLE_HAS_SUBSTR("pass 'throws' failed: out of ideas"));
}

TEST_CASE("instruments see every pass, can skip one, and learn whether it changed the graph", "[ir][pass_manager]") {
  auto recorder = std::make_shared<Recorder>();
  recorder->skip = {"dce"};
  const auto passes = PassRegistry::builtin().passes({"cse", "dce", "cse"});
  Graph g = redundant();
  PassManager(passes, PassManagerOptions{.verify = true, .instruments = {recorder}, .graph_name = "forward"}).run(g);
  REQUIRE(recorder->log == std::vector<std::string>{"before cse forward", "after cse changed", "before cse forward",
                                                    "after cse unchanged"});
  REQUIRE(g.find_value("exp") != nullptr);  // dce was skipped
}

TEST_CASE("a pass that throws ends its stage as failed, and the error names it", "[ir][pass_manager]") {
  auto recorder = std::make_shared<Recorder>();
  const std::vector<Pass> passes{PassRegistry::builtin().get("cse"),
                                 {"throws", [](Graph&) { throw std::runtime_error("out of ideas"); }}};
  Graph g = redundant();
  REQUIRE_THROWS_WITH(PassManager(passes, PassManagerOptions{.instruments = {recorder}}).run(g),
                      CRUCIBLE_HAS_SUBSTR("pass 'throws' failed: out of ideas"));
  REQUIRE(recorder->log == std::vector<std::string>{"before cse graph", "after cse changed", "before throws graph",
                                                    "after throws failed"});
}

TEST_CASE("a change anywhere in the graph is a change", "[ir][pass_manager]") {
  auto recorder = std::make_shared<Recorder>();
  const std::vector<Pass> passes{
      {"retag", [](Graph& g) { g.find_value("exp")->node()->add_tag("backward"); }},
      {"reshape_meta",
       [](Graph& g) {
         g.find_value("exp")->set_meta(f32({1, 3}));
       }},
      {"rename", [](Graph& g) { g.rename(g.find_value("exp"), "exp_renamed"); }},
      {"signature", [](Graph& g) { g.signature().inputs[0].kind = InputKind::Parameter; }},
      {"nothing", [](Graph&) {}},
  };
  Graph g = redundant();
  PassManager(passes, PassManagerOptions{.verify = true, .instruments = {recorder}}).run(g);
  REQUIRE(recorder->log == std::vector<std::string>{"before retag graph", "after retag changed",
                                                    "before reshape_meta graph", "after reshape_meta changed",
                                                    "before rename graph", "after rename changed",
                                                    "before signature graph", "after signature changed",
                                                    "before nothing graph", "after nothing unchanged"});
}
