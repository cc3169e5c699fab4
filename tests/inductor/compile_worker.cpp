// One process of the cache tests (test_compile_fx.cpp): compiles a fixed
// graph through compile_fx_inner with the cache directory and C++ compiler
// given, runs it on seeded inputs against eager LibTorch, and prints the
// graph cache's outcome ("hit", "miss" or "bypass").
//   compile_worker CACHE_DIR COMPILER
// Exit status 0 when the compiled graph computed what eager computes.
#include <crucible/inductor/compile_fx.h>
#include <crucible/ir/graph.h>
#include <crucible/ir/propagate_meta.h>
#include <crucible/runtime/instruments.h>

#include <ATen/ATen.h>

#include <iostream>

using namespace crucible;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: compile_worker CACHE_DIR COMPILER\n";
    return 2;
  }
  inductor::InductorOptions o;
  o.cache_dir = argv[1];
  o.compiler = argv[2];
  at::manual_seed(0);
  const at::Tensor x = at::randn({33, 17}), w = at::randn({17, 5});
  // softmax(x @ w) along rows, written out: a reduction kernel, a pointwise
  // one, and an extern matmul between the inputs and them.
  ir::Graph g;
  ir::Value* px = g.add_placeholder("x", ir::TensorMeta::of(x));
  ir::Value* pw = g.add_placeholder("w", ir::TensorMeta::of(w));
  ir::Value* mm = g.add_call("aten::mm", {px, pw})->result();
  ir::Value* e = g.add_call("aten::exp", {mm})->result();
  ir::Value* s = g.add_call("aten::sum.dim_IntList", {e, std::vector<int64_t>{1}, true, c10::IValue()})->result();
  g.set_output({g.add_call("aten::div.Tensor", {e, s})->result()});
  ir::propagate_meta(g);
  std::vector<at::Tensor> inputs{x, w};
  const at::Tensor got = inductor::compile_fx_inner(g, inputs, o)(inputs).at(0);
  const at::Tensor want = at::softmax(at::mm(x, w), 1);
  runtime::Counters& c = runtime::default_counters();
  std::cout << (c.get("inductor", "fxgraph_cache_hit")    ? "hit"
                : c.get("inductor", "fxgraph_cache_miss") ? "miss"
                                                          : "bypass")
            << "\n";
  // Fused sums round differently from ATen's: a few ulps at these scales.
  return at::allclose(got, want, 1e-5, 1e-6) ? 0 : 1;
}
