// The builder's instruments (ir/instrument.h): graph dumps (text, DOT, SVG,
// generated code) and verification after every stage. Timing, metrics and
// counters are runtime's (runtime/instruments.h).
#pragma once

#include <crucible/ir/instrument.h>
#include <crucible/runtime/backend_registry.h>

#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace crucible::pipeline {

struct GraphDumpOptions {
  /// Created if missing.
  std::string dir;
  bool text = true;  ///< <file>.txt: the text form (ir/printer.h)
  bool dot = true;   ///< <file>.dot: Graphviz DOT (ir/dot.h)
  /// <file>.svg, rendered by Graphviz's `dot -Tsvg` where it is installed
  /// (skipped silently where it is not); needs `dot`.
  bool svg = true;
  /// Graphs with more nodes than this get no SVG: Graphviz's layout time
  /// grows fast with the node count (about 1 s for a 225-node training step,
  /// 11 minutes for a 918-node one). The DOT file is still written.
  size_t svg_max_nodes = 400;
  /// A rendering still running after this many seconds is stopped and its
  /// SVG left out.
  double svg_timeout_s = 30;
  /// The code the backend generates (runtime::BackendInfo::generated_code), written
  /// after each backend stage as `<graph>.<NN>.code.<file name>`; empty: none.
  runtime::CodeGenerator code{};
};

/// Writes each graph a stage makes or changes to `dir` as
/// `<graph>.<NN>.<stage>.{txt,dot,svg}`, NN counting 00, 01, ... per graph
/// name in the order the files are written, so `ls` lists a graph's history
/// in order. A graph first seen as a stage's input (the joint graph, which
/// aot_function traces) is written as `<graph>.<NN>.input` before that stage.
/// Passes that leave the graph unchanged write nothing; the backend stage
/// writes the generated code, when `code` is set. A compiler stage served
/// from the graph cache (no pass or backend ran) writes its graph as
/// `<graph>.<NN>.<stage>.cached`, so a dump is never silently empty.
/// The constructor throws PipelineError when it cannot create `dir`; the
/// hooks throw PipelineError naming a file they cannot write.
class GraphDumper : public ir::Instrument {
 public:
  explicit GraphDumper(GraphDumpOptions options);
  void before_stage(const ir::StageEvent& event) override;
  void after_stage(const ir::StageEvent& event) override;
  /// Every file written so far, in order.
  const std::vector<std::string>& files() const { return files_; }

 private:
  void dump(std::string_view graph_name, std::string_view stage, const ir::Graph& graph);
  std::string next_base(std::string_view graph_name, std::string_view stage);
  GraphDumpOptions options_;
  std::map<std::string, int, std::less<>> counters_;
  std::vector<std::string> files_;
};

/// Runs ir::verify on every graph a stage produces (the pass manager verifies
/// between passes already; this adds the trace and partition results).
/// Throws ir::IrError naming the stage and the graph, with the verifier's message.
class GraphVerifier : public ir::Instrument {
 public:
  void after_stage(const ir::StageEvent& event) override;
};

}  // namespace crucible::pipeline
