// Helpers for the tracer tests: run a traced graph with the interpreter.
#pragma once

#include <crucible/ir/interpreter.h>
#include <crucible/ir/verifier.h>
#include <crucible/tracer/make_fx.h>

#include "graph_testing.h"

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

/// A [4, 6] input plus 1, then written in place through every kind of view
/// (view, transpose, slice, select, as_strided) and read through an expand:
/// the view-then-mutate scenario, traced with and without functionalization.
inline std::vector<at::Tensor> views_then_mutation(const std::vector<at::Tensor>& in) {
  at::Tensor y = in[0] + 1.0;
  y.view({-1}).add_(1.0);
  y.transpose(0, 1).mul_(2.0);
  y.slice(0, 0, 2).sub_(0.5);
  y.select(1, 3).fill_(7.0);
  y.as_strided({2, 2}, {1, 6}, 1).mul_(-1.0);
  at::Tensor z = y.select(0, 2).expand({3, 6}) * 2.0;
  return {y, z};
}

}  // namespace crucible::testing
