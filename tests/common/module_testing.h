// Helpers for tests that trace or compile torch::nn modules.
#pragma once

#include <torch/nn/module.h>

#include <vector>

namespace crucible::testing {

/// The placeholders of a graph traced with the module's state lifted
/// (tracer::functional_call order): clones of every parameter, then of every
/// buffer, then of `inputs`, so running the graph never touches the module.
inline std::vector<at::Tensor> module_graph_inputs(torch::nn::Module& m, const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> r;
  for (const auto& p : m.named_parameters()) r.push_back(p.value().detach().clone());
  for (const auto& b : m.named_buffers()) r.push_back(b.value().detach().clone());
  for (const auto& t : inputs) r.push_back(t.detach().clone());
  return r;
}

}  // namespace crucible::testing
