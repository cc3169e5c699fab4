// Aliasing through aot_function against eager: outputs that are or view
// inputs, intermediates or other outputs; duplicated inputs; inputs sharing a
// storage with one of them written (synthetic bases).
#include <crucible/autograd/aot_function.h>
#include <crucible/autograd/error.h>

#include <ATen/ATen.h>

#include "catch.h"
#include "testing.h"

using crucible::testing::kGradAtol;
using crucible::testing::kGradRtol;
using namespace crucible;
using Tensors = std::vector<at::Tensor>;

TEST_CASE("outputs aliasing an input alias the caller's tensor, with eager's gradients", "[autograd][alias]") {
  auto f = [](const Tensors& in) { return Tensors{in[0].t(), in[0].slice(0, 1, 3), in[0], (in[0] * in[1]).sum()}; };
  auto compiled = autograd::aot_function(f);
  at::manual_seed(50);
  const auto x = at::randn({3, 4}), w = at::randn({3, 4});
  const auto cx = x.clone().requires_grad_(), cw = w.clone().requires_grad_();
  const auto ex = x.clone().requires_grad_(), ew = w.clone().requires_grad_();
  const auto c = compiled({cx, cw});
  const auto e = f({ex, ew});
  for (size_t i = 0; i < e.size(); ++i) REQUIRE_EQUAL_TENSORS(c[i].detach(), e[i].detach());
  // Views of the caller's x, with its geometry; the input itself is returned.
  REQUIRE(c[0].is_alias_of(cx));
  REQUIRE(c[0].strides() == e[0].strides());
  REQUIRE(c[1].is_alias_of(cx));
  REQUIRE(c[1].storage_offset() == e[1].storage_offset());
  REQUIRE(c[2].is_same(cx));
  (c[0].pow(2).sum() + c[1].sin().sum() + c[3]).backward();
  (e[0].pow(2).sum() + e[1].sin().sum() + e[3]).backward();
  // Several contributions per leaf, accumulated in the engine's order.
  REQUIRE_CLOSE(cx.grad(), ex.grad(), kGradRtol, kGradAtol);
  REQUIRE_CLOSE(cw.grad(), ew.grad(), kGradRtol, kGradAtol);
  // On the inference path a write through the returned view reaches x, as in eager.
  const auto y = x.clone(), ey = x.clone();
  compiled({y, w})[1].mul_(10);
  f({ey, w})[1].mul_(10);
  REQUIRE_EQUAL_TENSORS(y, ey);
}

TEST_CASE("outputs aliasing an intermediate are views autograd knows, with eager's gradients", "[autograd][alias]") {
  auto f = [](const Tensors& in) {
    const auto h = in[0] * in[1];
    return Tensors{h.view({-1}), h.t()};
  };
  auto compiled = autograd::aot_function(f);
  at::manual_seed(51);
  const auto x = at::randn({3, 4}), w = at::randn({3, 4});
  const auto cx = x.clone().requires_grad_(), cw = w.clone().requires_grad_();
  const auto ex = x.clone().requires_grad_(), ew = w.clone().requires_grad_();
  const auto c = compiled({cx, cw});
  const auto e = f({ex, ew});
  REQUIRE_EQUAL_TENSORS(c[0].detach(), e[0].detach());
  REQUIRE_EQUAL_TENSORS(c[1].detach(), e[1].detach());
  // Both are views of one base, as in eager: a write through one shows in the other.
  REQUIRE(c[0].is_view());
  REQUIRE(c[0].is_alias_of(c[1]));
  REQUIRE(c[1].strides() == e[1].strides());
  (c[0].sin().sum() + c[1].pow(2).sum()).backward();
  (e[0].sin().sum() + e[1].pow(2).sum()).backward();
  REQUIRE_CLOSE(cx.grad(), ex.grad(), kGradRtol, kGradAtol);
  REQUIRE_CLOSE(cw.grad(), ew.grad(), kGradRtol, kGradAtol);
}

TEST_CASE("an output that views another output, and one returned twice", "[autograd][alias]") {
  auto f = [](const Tensors& in) {
    const auto g = in[0].exp();
    return Tensors{g.select(1, 1), g, g};
  };
  auto compiled = autograd::aot_function(f);
  at::manual_seed(52);
  const auto x = at::randn({2, 3});
  const auto cx = x.clone().requires_grad_(), ex = x.clone().requires_grad_();
  const auto c = compiled({cx});
  const auto e = f({ex});
  for (size_t i = 0; i < 3; ++i) REQUIRE_EQUAL_TENSORS(c[i].detach(), e[i].detach());
  REQUIRE(c[0].is_alias_of(c[1]));
  REQUIRE(c[2].is_alias_of(c[1]));
  (c[0].sum() * 2 + c[1].pow(2).sum() + c[2].sum()).backward();
  (e[0].sum() * 2 + e[1].pow(2).sum() + e[2].sum()).backward();
  REQUIRE_CLOSE(cx.grad(), ex.grad(), kGradRtol, kGradAtol);
}

TEST_CASE("duplicated inputs f(x, x): the gradient of two uses of one leaf", "[autograd][alias]") {
  auto f = [](const Tensors& in) { return Tensors{(in[0] * in[1].sin()).sum()}; };
  auto compiled = autograd::aot_function(f);
  at::manual_seed(53);
  const auto data = at::randn({6});
  const auto cx = data.clone().requires_grad_(), ex = data.clone().requires_grad_();
  const auto c_out = compiled({cx, cx});
  const auto e_out = f({ex, ex});
  REQUIRE_EQUAL_TENSORS(c_out[0].detach(), e_out[0].detach());
  c_out[0].backward();
  e_out[0].backward();
  // d/dx sum(x sin x) = sin x + x cos x: equal to the sum of the gradients of
  // two distinct leaves, accumulated in an order the engine picks.
  REQUIRE_CLOSE(cx.grad(), ex.grad(), kGradRtol, kGradAtol);
  REQUIRE_CLOSE(cx.grad(), data.sin() + data * data.cos(), kGradRtol, kGradAtol);
  // Two distinct tensors are another specialization (Note [AOT cache guards]).
  const auto y = data.clone().requires_grad_();
  compiled({cx, y});
  REQUIRE(compiled.num_compilations() == 2);
}

TEST_CASE("duplicated inputs f(x, x) where f writes one of them: the write is seen through the other",
          "[autograd][alias]") {
  auto f = [](const Tensors& in) {
    in[0].mul_(2);
    return Tensors{in[0] + in[1]};  // eager: 2x + 2x
  };
  auto compiled = autograd::aot_function(f);
  at::manual_seed(54);
  const auto a = at::randn({4});
  const auto ca = a.clone().requires_grad_(), ea = a.clone().requires_grad_();
  const auto cx = ca * 1.0, ex = ea * 1.0;
  const auto c = compiled({cx, cx})[0];
  const auto e = f({ex, ex})[0];
  REQUIRE_EQUAL_TENSORS(c.detach(), e.detach());
  REQUIRE_EQUAL_TENSORS(cx.detach(), ex.detach());
  (c.sum() + cx.sum()).backward();
  (e.sum() + ex.sum()).backward();
  REQUIRE_CLOSE(ca.grad(), ea.grad(), kGradRtol, kGradAtol);
}

TEST_CASE("two inputs viewing one storage, one written: a synthetic base carries the write and the gradient",
          "[autograd][alias]") {
  auto f = [](const Tensors& in) {
    in[0].mul_(2);                          // a: rows 0-1 of the base
    return Tensors{(in[1] * in[1]).sum()};  // b: the whole base, read after the write
  };
  auto compiled = autograd::aot_function(f);
  at::manual_seed(55);
  const auto data = at::randn({3, 4});
  const auto cleaf = data.clone().requires_grad_(), eleaf = data.clone().requires_grad_();
  const auto cbase = cleaf * 1.0, ebase = eleaf * 1.0;  // views of a leaf may not be written: use a non-leaf
  const auto c = compiled({cbase.slice(0, 0, 2), cbase.view({12})})[0];
  const auto e = f({ebase.slice(0, 0, 2), ebase.view({12})})[0];
  REQUIRE_EQUAL_TENSORS(c.detach(), e.detach());
  REQUIRE_EQUAL_TENSORS(cbase.detach(), ebase.detach());
  c.backward();
  e.backward();
  REQUIRE_CLOSE(cleaf.grad(), eleaf.grad(), kGradRtol, kGradAtol);
}

TEST_CASE("inputs sharing a storage without gradients: a base over the storage; metadata writes re-applied",
          "[autograd][alias]") {
  auto f = [](const Tensors& in) {
    in[0].add_(1);           // writes rows 1-2 of the storage
    in[1].transpose_(0, 1);  // [2, 6] -> [6, 2], a view of the same storage
    return Tensors{in[1] * 3, in[0].sum()};
  };
  auto compiled = autograd::aot_function(f);
  at::manual_seed(56);
  const auto storage = at::randn({12});
  const auto cs = storage.clone(), es = storage.clone();
  const auto ca = cs.view({3, 4}).slice(0, 1, 3), ea = es.view({3, 4}).slice(0, 1, 3);
  const auto cb = cs.view({2, 6}), eb = es.view({2, 6});
  const auto c = compiled({ca, cb});
  const auto e = f({ea, eb});
  REQUIRE_EQUAL_TENSORS(c[0], e[0]);
  REQUIRE_EQUAL_TENSORS(c[1], e[1]);
  REQUIRE_EQUAL_TENSORS(cs, es);
  REQUIRE(cb.sizes() == eb.sizes());
  REQUIRE(cb.strides() == eb.strides());
  REQUIRE_EQUAL_TENSORS(cb, eb);
}

TEST_CASE("aliased written inputs that require grad without a common base are refused", "[autograd][alias]") {
  auto compiled = autograd::aot_function([](const Tensors& in) {
    in[0].mul_(2);
    return Tensors{in[0] + in[1]};
  });
  const auto leaf = at::randn({4}).requires_grad_();
  const auto x = leaf * 1.0;
  // A second tensor over x's storage, made outside autograd's view tracking.
  const auto y = at::empty({0}).set_(x.storage(), 0, {4}, {1}).requires_grad_();
  const auto before = x.detach().clone();
  REQUIRE_THROWS_WITH(compiled({x, y}), CRUCIBLE_HAS_SUBSTR("not views of one tensor"));
  // Compiling failed before anything was written.
  REQUIRE_EQUAL_TENSORS(x.detach(), before);
}
