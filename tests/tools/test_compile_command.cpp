// `crucible compile --dump-dir`: every stage's graph on disk (the training
// step, and the joint, forward and backward graphs of the AOT path), in forms
// that read back.
#include "catch.h"
#include "cli.h"

#include <crucible/ir/graph.h>
#include <crucible/ir/parser.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <sstream>

using crucible::testing::run_cli;

namespace {

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

bool graphviz_installed() {
  for (const char* dir : {"/usr/bin", "/usr/local/bin"})
    if (::access((std::string(dir) + "/dot").c_str(), X_OK) == 0) return true;
  return false;
}

}  // namespace

TEST_CASE("crucible compile writes each stage's graph as text and DOT", "[tools][compile]") {
  const std::string dir = "/tmp/crucible_compile_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const auto r = run_cli("compile --model mlp --optimizer sgd --backend interpreter --dump-dir " + dir);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  // The traced step, then the passes that changed it: the first names its state.
  REQUIRE(std::filesystem::exists(dir + "/train_step.00.trace_inference.txt"));
  const std::string traced = dir + "/train_step.01.name_state.txt";
  REQUIRE(std::filesystem::exists(traced));
  REQUIRE(std::filesystem::exists(dir + "/train_step.01.name_state.dot"));
  CHECK_THAT(read(dir + "/train_step.01.name_state.dot"), CRUCIBLE_HAS_SUBSTR("digraph"));
  if (graphviz_installed()) CHECK(std::filesystem::exists(dir + "/train_step.01.name_state.svg"));
  // The text form parses back: the training step with its loss and its state.
  const crucible::ir::Graph g = crucible::ir::parse(read(traced));
  const auto& sig = g.signature();
  CHECK(sig.outputs_of(crucible::ir::OutputKind::Loss).size() == 1);
  CHECK(sig.inputs_of(crucible::ir::InputKind::Parameter).size() == 6);
  // SGD with momentum: step and momentum buffer per parameter, and the rate.
  CHECK(sig.inputs_of(crucible::ir::InputKind::State).size() == 6 * 2 + 1);
  CHECK_THAT(r.out, CRUCIBLE_HAS_SUBSTR("generates no code"));
  CHECK_THAT(r.out, CRUCIBLE_HAS_SUBSTR(traced));
  // The AOT path: the joint graph as traced, then its two parts.
  const std::string joint = dir + "/joint.00.trace_joint.txt";
  REQUIRE(std::filesystem::exists(joint));
  REQUIRE(std::filesystem::exists(dir + "/forward.00.partition.txt"));
  REQUIRE(std::filesystem::exists(dir + "/backward.00.partition.txt"));
  const crucible::ir::Graph forward = crucible::ir::parse(read(dir + "/forward.00.partition.txt"));
  const crucible::ir::Graph backward = crucible::ir::parse(read(dir + "/backward.00.partition.txt"));
  // The backward returns one gradient per parameter; the forward's outputs
  // are the loss and the values saved for the backward.
  CHECK(backward.signature().outputs_of(crucible::ir::OutputKind::Gradient).size() == 6);
  CHECK(forward.signature().outputs_of(crucible::ir::OutputKind::SavedValue).size() > 0);
  // The counters of both compilations.
  CHECK_THAT(r.out, CRUCIBLE_HAS_SUBSTR("graphs.backward: 1, graphs.forward: 1, graphs.inference: 1"));
  CHECK_THAT(r.out, CRUCIBLE_HAS_SUBSTR("stats.compilations: 3"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("crucible compile needs --dump-dir", "[tools][compile][errors]") {
  const auto r = run_cli("compile --model mlp");
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.err, CRUCIBLE_HAS_SUBSTR("--dump-dir"));
}

TEST_CASE("crucible compile --partitioner min-cut saves no more than the default partition", "[tools][compile]") {
  std::string report;  // partition.txt: what min-cut saved and recomputed, and why
  auto saved_bytes = [&report](const std::string& partitioner) {
    const std::string dir = "/tmp/crucible_compile_" + partitioner + "_" + std::to_string(::getpid());
    std::filesystem::remove_all(dir);
    const auto r = run_cli("compile --model convnet --no-svg --partitioner " + partitioner + " --dump-dir " + dir);
    INFO(r.out << r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(std::filesystem::exists(dir + "/partition.txt") == (partitioner == "min-cut"));
    if (partitioner == "min-cut") report = read(dir + "/partition.txt");
    const crucible::ir::Graph forward = crucible::ir::parse(read(dir + "/forward.00.partition.txt"));
    int64_t bytes = 0;
    const auto outputs = forward.outputs();
    for (size_t i = 0; i < outputs.size(); ++i)
      if (forward.signature().outputs[i].kind == crucible::ir::OutputKind::SavedValue)
        bytes += outputs[i]->meta().nbytes();
    std::filesystem::remove_all(dir);
    return bytes;
  };
  const int64_t by_default = saved_bytes("default"), min_cut = saved_bytes("min-cut");
  INFO("saved bytes: default " << by_default << ", min-cut " << min_cut);
  CHECK(min_cut > 0);
  CHECK(min_cut <= by_default);
  // The ConvNet's convolutions are kept for their own reason, its ReLUs
  // recomputed from what is saved, the inputs saved as inputs.
  INFO(report);
  CHECK_THAT(report, CRUCIBLE_HAS_SUBSTR("aten::convolution is compute-intensive"));
  CHECK_THAT(report, CRUCIBLE_HAS_SUBSTR("kept in the forward: an input of the function"));
  CHECK_THAT(report, CRUCIBLE_HAS_SUBSTR("recomputed in the backward: aten::"));
}
