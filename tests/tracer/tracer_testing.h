// Helpers for the tracer tests: run a traced graph with the interpreter.
#pragma once

#include <crucible/ir/interpreter.h>
#include <crucible/ir/verifier.h>
#include <crucible/tracer/make_fx.h>

#include <ATen/ATen.h>

#include <vector>

namespace crucible::testing {

/// Verifies the traced graph, then interprets it on `inputs` (one per placeholder).
inline std::vector<at::Tensor> run_traced(const tracer::TraceResult& r, const std::vector<at::Tensor>& inputs) {
  ir::verify(r.graph);
  return ir::Interpreter(r.graph)(inputs);
}

/// Detached copies, so eager and interpreted runs never share an input.
inline std::vector<at::Tensor> clones(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> r;
  for (const auto& t : ts) r.push_back(t.detach().clone());
  return r;
}

/// Number of call nodes whose target is `op`.
inline size_t count_calls(const ir::Graph& g, const std::string& op) {
  size_t n = 0;
  for (ir::Node* node : g.nodes())
    if (node->is_call() && node->target() == op) ++n;
  return n;
}

}  // namespace crucible::testing
