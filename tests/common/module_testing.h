// Helpers for tests that trace or compile torch::nn modules.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

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

/// in -> hidden -> out, ReLU between: the small MLP the autograd tests compile.
struct Mlp : torch::nn::Module {
  explicit Mlp(int64_t in = 8, int64_t hidden = 16, int64_t out = 4)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, out))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(at::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};

}  // namespace crucible::testing
