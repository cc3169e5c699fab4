// A program of its own that uses Crucible as a Meson subproject, as a user
// would: a LibTorch module's loss compiled ahead of time with the builder
// (tracer, AOTAutograd, partitioner, passes, backend), and a plain function
// with aot_function, each checked against eager LibTorch on the same inputs.
// Exit code 0 when they agree.
#include <crucible/autograd/aot_function.h>
#include <crucible/autograd/aot_module.h>
#include <crucible/pipeline/builder.h>

#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <iostream>
#include <memory>
#include <vector>

namespace {

// Gradients of the compiled and the eager copy: the same kernels, summed in
// the same order except where the partitioned backward accumulates a
// gradient in another order, so agreement within float rounding.
bool close(const at::Tensor& a, const at::Tensor& b) { return at::allclose(a, b, /*rtol=*/1e-5, /*atol=*/1e-6); }

}  // namespace

int main() {
  using namespace crucible;
  torch::manual_seed(0);
  auto make = [] {
    return torch::nn::Sequential(torch::nn::Linear(16, 32), torch::nn::ReLU(), torch::nn::Linear(32, 4));
  };
  torch::nn::Sequential compiled = make(), eager = make();
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < compiled->parameters().size(); ++i) eager->parameters()[i].copy_(compiled->parameters()[i]);
  }
  auto loss = [](torch::nn::Module& m, const std::vector<at::Tensor>& in) {
    auto& seq = dynamic_cast<torch::nn::SequentialImpl&>(m);
    return std::vector<at::Tensor>{torch::nn::functional::cross_entropy(seq.forward(in[0]), in[1])};
  };
  const std::vector<at::Tensor> batch = {at::randn({8, 16}), at::randint(0, 4, {8}, at::kLong)};

  // The module's loss through the builder: forward and backward compiled.
  const autograd::AotModule step = pipeline::Builder().compile(compiled.ptr(), loss);
  const at::Tensor got = step(batch).at(0);
  got.backward();
  const at::Tensor expected = loss(*eager, batch).at(0);
  expected.backward();
  bool ok = at::equal(got.detach(), expected.detach());  // the same kernels: bitwise
  for (size_t i = 0; i < eager->parameters().size(); ++i)
    ok = ok && close(compiled->parameters()[i].grad(), eager->parameters()[i].grad());

  // A plain function through aot_function.
  auto fn = [](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{at::tanh(in[0] * in[1]).sum()}; };
  const autograd::AotFunction f = autograd::aot_function(fn);
  const at::Tensor x = at::randn({5}).requires_grad_(), y = at::randn({5});
  const at::Tensor x_eager = x.detach().clone().requires_grad_();
  f({x, y}).at(0).backward();
  fn({x_eager, y}).at(0).backward();
  ok = ok && close(x.grad(), x_eager.grad());

  std::cout << step.num_compilations() << " compilation(s) of the module's loss; "
            << (ok ? "consumer: the compiled loss and gradients equal eager LibTorch's\n" : "consumer: MISMATCH\n");
  return ok ? 0 : 1;
}
