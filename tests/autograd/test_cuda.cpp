// aot_function on CUDA tensors against eager: values and gradients, dropout
// from the same generator state, functionalized RNG from the CUDA
// generator's seed and Philox offset. Skipped where no CUDA device is usable.
#include <crucible/autograd/aot_function.h>

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include "catch.h"
#include "testing.h"

using namespace crucible;
using Tensors = std::vector<at::Tensor>;

namespace {

Tensors mlp_fn(const Tensors& in) { return {at::relu(at::addmm(in[2], in[0], in[1].t())).sum()}; }

Tensors dropout_fn(const Tensors& in) { return {(at::dropout(in[0], 0.5, /*train=*/true) * in[1]).sum()}; }

}  // namespace

TEST_CASE("on CUDA: values and gradients equal eager", "[autograd][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  at::manual_seed(90);
  const auto opts = at::TensorOptions().device(at::kCUDA);
  const Tensors data{at::randn({8, 5}, opts), at::randn({4, 5}, opts), at::randn({4}, opts)};
  auto compiled = autograd::aot_function(mlp_fn);
  Tensors c_in, e_in;
  for (const auto& t : data) {
    c_in.push_back(t.clone().requires_grad_());
    e_in.push_back(t.clone().requires_grad_());
  }
  const auto c = compiled(c_in)[0];
  const auto e = mlp_fn(e_in)[0];
  // The interpreter launches eager's kernels in eager's order.
  REQUIRE_EQUAL_TENSORS(c.detach(), e.detach());
  c.backward();
  e.backward();
  // cuBLAS may pick another algorithm for the backward's shapes: float rounding.
  for (size_t i = 0; i < 3; ++i) REQUIRE_CLOSE(c_in[i].grad(), e_in[i].grad(), 1e-5, 1e-5);
}

TEST_CASE("on CUDA: dropout equals eager from the same generator state", "[autograd][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  const auto opts = at::TensorOptions().device(at::kCUDA);
  auto compiled = autograd::aot_function(dropout_fn);
  at::manual_seed(91);
  const auto x = at::randn({1024}, opts), w = at::randn({1024}, opts);
  for (int call = 0; call < 2; ++call) {  // compiling, then cached
    const auto cx = x.clone().requires_grad_(), ex = x.clone().requires_grad_();
    at::manual_seed(200 + call);
    const auto e = dropout_fn({ex, w})[0];
    at::manual_seed(200 + call);
    const auto c = compiled({cx, w})[0];
    // Compiling restored the CUDA generator (Note [RNG during compilation]).
    REQUIRE_EQUAL_TENSORS(c.detach(), e.detach());
    c.backward();
    e.backward();
    REQUIRE_EQUAL_TENSORS(cx.grad(), ex.grad());
  }
}

TEST_CASE("on CUDA: functionalized RNG takes the CUDA generator's seed and offset", "[autograd][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  const auto opts = at::TensorOptions().device(at::kCUDA);
  autograd::AotConfig config;
  config.functionalize_rng_ops = true;
  auto compiled = autograd::aot_function(dropout_fn, config);
  at::manual_seed(92);
  const auto x = at::randn({512}, opts), w = at::randn({512}, opts);
  at::Generator gen = at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, 0));
  auto run = [&](uint64_t seed) {
    at::manual_seed(seed);
    const uint64_t offset_before = gen.get_offset();
    const auto cx = x.clone().requires_grad_();
    const auto out = compiled({cx, w})[0];
    out.backward();
    // One random op: the offset advances by 4 (Note [Functionalized RNG]).
    REQUIRE(gen.get_offset() == offset_before + 4);
    return std::pair{out.detach(), cx.grad()};
  };
  const auto [out, g] = run(13);
  const auto mask = (g != 0).to(at::kFloat);
  // d out / d x = w * mask * 2 with the compiled forward's mask.
  REQUIRE_EQUAL_TENSORS(g, w * mask * 2.0);
  // The forward drew that same mask; sum() may add in another order.
  REQUIRE_CLOSE(out, (x * mask * 2.0 * w).sum(), 1e-5, 1e-5);
  REQUIRE_EQUAL_TENSORS(run(13).second, g);
  REQUIRE_FALSE(at::equal(run(14).second, g));
}
