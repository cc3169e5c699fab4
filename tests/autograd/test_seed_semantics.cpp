// Semantics of the seed's AOTAutograd that compiled functions keep, each
// against eager LibTorch: autocast, double backward, outputs that view their
// base with another dtype, exports of aliased written inputs.
#include <crucible/autograd/aot_export.h>
#include <crucible/autograd/aot_function.h>
#include <crucible/autograd/error.h>
#include <crucible/runtime/autocast.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/module.h>

#include <optional>

#include "catch.h"
#include "testing.h"

using crucible::testing::kGradAtol;
using crucible::testing::kGradRtol;
using namespace crucible;
using Tensors = std::vector<at::Tensor>;

namespace {

Tensors mlp(const Tensors& in) {
  const at::Tensor h = at::relu(at::linear(in[0], in[1], in[2]));
  return {at::log_softmax(at::linear(h, in[3]), 1).sum()};
}

}  // namespace

TEST_CASE("autocast: a compiled call under bf16 autocast computes what eager does, and compiles again without it",
          "[autograd][autocast]") {
  at::manual_seed(0);
  const Tensors data = {at::randn({8, 16}), at::randn({32, 16}), at::randn({32}), at::randn({10, 32})};
  auto leaves = [&] {
    Tensors t;
    for (size_t i = 0; i < data.size(); ++i) t.push_back(data[i].clone().requires_grad_(i > 0));
    return t;
  };
  auto compiled = autograd::aot_function(mlp);
  for (bool autocast : {true, false, true}) {
    INFO("autocast " << autocast);
    const Tensors c_in = leaves(), e_in = leaves();
    std::optional<runtime::AutocastGuard> on;
    if (autocast) on.emplace(at::kCPU, at::kBFloat16);
    const at::Tensor got = compiled(c_in)[0];
    const at::Tensor expected = mlp(e_in)[0];
    on.reset();
    // The graph holds the casts autocast made while tracing and runs the
    // same bf16 kernels: bitwise.
    REQUIRE(got.scalar_type() == expected.scalar_type());
    REQUIRE_EQUAL_TENSORS(got.detach(), expected.detach());
    got.backward();
    expected.backward();
    for (size_t i = 1; i < data.size(); ++i) REQUIRE_CLOSE(c_in[i].grad(), e_in[i].grad(), kGradRtol, kGradAtol);
  }
  REQUIRE(compiled.num_compilations() == 2);  // one per autocast state
}

TEST_CASE("double backward through a compiled function raises, as the seed does", "[autograd]") {
  auto compiled = autograd::aot_function([](const Tensors& in) { return Tensors{(in[0] * in[0]).sum()}; });
  const at::Tensor x = at::randn({3}).requires_grad_();
  const at::Tensor y = compiled({x})[0];
  const auto g = torch::autograd::grad({y}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true);
  // The first derivative is right; differentiating it again is refused.
  REQUIRE_CLOSE(g[0].detach(), (2 * x).detach(), 0.0, 0.0);
  REQUIRE_THROWS_WITH(torch::autograd::grad({g[0].sum()}, {x}), CRUCIBLE_HAS_SUBSTR("double backward"));
}

TEST_CASE("outputs that view an input or an intermediate with another dtype alias as in eager", "[autograd]") {
  auto fn = [](const Tensors& in) {
    at::Tensor h = in[0] * 2.0;
    return Tensors{in[1].slice(0, 2).view(at::kInt), h.view(at::kHalf), h};
  };
  auto compiled = autograd::aot_function(fn);
  const at::Tensor x = at::randn({4, 6}), y = at::randn({10});
  const Tensors got = compiled({x, y});
  const Tensors expected = fn({x, y});
  for (size_t k = 0; k < 3; ++k) REQUIRE_EQUAL_TENSORS(got[k], expected[k]);
  // Output 0 is a view of the caller's y: writing y shows through it.
  REQUIRE(got[0].is_alias_of(y));
  REQUIRE(got[0].storage_offset() == expected[0].storage_offset());
  y.fill_(0.0);
  REQUIRE_EQUAL_TENSORS(got[0], at::zeros({8}, at::kInt));
  // Output 1 views output 2's storage, as eager's does.
  REQUIRE(got[1].is_alias_of(got[2]));
}

TEST_CASE("aot_export_module refuses a written input that aliases another input", "[autograd][export]") {
  torch::nn::Module m;
  const at::Tensor base = at::randn({6});
  auto fn = [](torch::nn::Module&, const Tensors& in) {
    in[0].add_(1.0);
    return Tensors{in[1] * 2.0};
  };
  REQUIRE_THROWS_WITH(autograd::aot_export_module(m, fn, {base.slice(0, 0, 3), base.slice(0, 2, 5)}, {}),
                      CRUCIBLE_HAS_SUBSTR("shares storage"));
}
