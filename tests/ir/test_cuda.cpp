// The ir library on CUDA: graphs whose metadata says cuda:0 parse, verify
// and run on the GPU exactly as the ATen calls they spell. Skipped where no
// CUDA device is usable.
#include "catch.h"
#include "testing.h"

#include <crucible/ir/interpreter.h>
#include <crucible/ir/parser.h>
#include <crucible/ir/printer.h>
#include <crucible/ir/verifier.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

// Nothing in Crucible names a symbol of libtorch_cuda, so a linker that drops
// unreferenced libraries (--as-needed) would leave a CUDA build with no CUDA
// kernels and every CUDA case below silently skipped. Loading the library is
// what registers them; this holds with or without a GPU.
TEST_CASE("a CUDA build registers LibTorch's CUDA kernels", "[ir][cuda]") {
#ifndef CRUCIBLE_HAVE_CUDA
  CRUCIBLE_SKIP("built without LibTorch's CUDA libraries");
#else
  const auto add = c10::Dispatcher::singleton().findSchema({"aten::add", "Tensor"});
  REQUIRE(add.has_value());
  INFO("libtorch_cuda.so is not loaded: check the link flags in meson.build");
  REQUIRE(add->hasKernelForDispatchKey(c10::DispatchKey::CUDA));
#endif
}

TEST_CASE("CUDA: a parsed graph on cuda:0 runs like the ATen calls it spells", "[ir][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  const char* text = R"(%x : f32[8, 16] @cuda:0 = placeholder()
%w : f32[16, 4] @cuda:0 = placeholder(kind=parameter, target="fc.weight")
%b : f32[4] @cuda:0 = placeholder(kind=parameter, target="fc.bias")
%mm : f32[8, 4] @cuda:0 = aten::addmm(%b, %x, %w, beta=1, alpha=1)
%g : f32[8, 4] @cuda:0 = aten::gelu(%mm, approximate="tanh")
%s : f32[8, 1] @cuda:0 = aten::sum.dim_IntList(%g, [1], True, dtype=None)
%ones : f32[8, 4] @cuda:0 = aten::ones_like(%g, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None)
%out : f32[8, 4] @cuda:0 = aten::add.Tensor(%g, %s, alpha=1)
return (%out, %ones)
)";
  const crucible::ir::Graph g = crucible::ir::parse(text);
  crucible::ir::verify(g);
  REQUIRE(crucible::ir::to_text(g) == text);
  at::manual_seed(3);
  const at::Tensor x = at::randn({8, 16}, at::kCUDA), w = at::randn({16, 4}, at::kCUDA), b = at::randn({4}, at::kCUDA);
  const auto out = crucible::ir::Interpreter(g)({x, w, b});
  const at::Tensor gelu = at::gelu(at::addmm(b, x, w), "tanh");
  // The same CUDA kernels on the same inputs: bitwise equal.
  REQUIRE_EQUAL_TENSORS(out[0], gelu + gelu.sum(1, true));
  REQUIRE(out[1].device().is_cuda());
  REQUIRE_EQUAL_TENSORS(out[1], at::ones_like(gelu));
}
