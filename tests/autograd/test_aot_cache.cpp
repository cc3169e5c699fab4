// The graph cache shared between callables (Note [AOT graph cache]): the
// same computation compiled by two callables calls the backend once and
// still equals eager; different graphs, compilers or example metadata never
// share; what AotCache keeps and counts.
#include <crucible/autograd/aot_cache.h>
#include <crucible/autograd/aot_function.h>
#include <crucible/autograd/aot_module.h>
#include <crucible/autograd/error.h>
#include <crucible/ir/interpreter.h>
#include <crucible/ir/parser.h>
#include <crucible/runtime/metrics.h>

#include <torch/nn/module.h>
#include <torch/utils.h>

#include "catch.h"
#include "module_testing.h"
#include "testing.h"

#include <atomic>
#include <thread>

using crucible::testing::kGradAtol;
using crucible::testing::kGradRtol;
using namespace crucible;
using Tensors = std::vector<at::Tensor>;

namespace {

// The interpreter, counting its calls per kind of graph.
struct CountingBackend {
  std::shared_ptr<std::atomic<int>> calls = std::make_shared<std::atomic<int>>(0);
  ir::Backend backend() const {
    return [calls = calls](const ir::Graph& g, const Tensors& examples) {
      ++*calls;
      return ir::interpret(g, examples);
    };
  }
  int count() const { return calls->load(); }
};

autograd::AotConfig counted(const CountingBackend& b, std::string key, std::shared_ptr<autograd::AotCache> cache) {
  autograd::AotConfig config;
  config.fw_compiler = config.bw_compiler = config.inference_compiler = b.backend();
  config.compiler_key = std::move(key);
  config.cache = std::move(cache);
  return config;
}

// One computation written twice, as two unrelated callables would.
Tensors layer(const Tensors& in) { return {at::tanh(at::addmm(in[2], in[0], in[1].t())).sum(1)}; }
struct Layer {
  Tensors operator()(const Tensors& in) const {
    const at::Tensor h = at::addmm(in[2], in[0], in[1].t());
    return {at::tanh(h).sum(1)};
  }
};
// Another computation over inputs of the same metadata.
Tensors other_layer(const Tensors& in) { return {at::sigmoid(at::addmm(in[2], in[0], in[1].t())).sum(1)}; }

Tensors data() { return {at::randn({4, 3}), at::randn({5, 3}), at::randn({5})}; }

Tensors leaves(const Tensors& ts, bool requires_grad) {
  Tensors out;
  for (const at::Tensor& t : ts) out.push_back(t.detach().clone().requires_grad_(requires_grad));
  return out;
}

// Runs `fn` compiled and eagerly on copies of `in`, with a backward through
// the sum of the outputs, and checks values and gradients.
void check_against_eager(const autograd::AotFunction& compiled, const tracer::TensorFn& fn, const Tensors& in) {
  const Tensors c_in = leaves(in, true), e_in = leaves(in, true);
  const Tensors c_out = compiled(c_in), e_out = fn(e_in);
  REQUIRE_EQUAL_TENSORS(c_out[0].detach(), e_out[0].detach());
  c_out[0].sum().backward();
  e_out[0].sum().backward();
  for (size_t i = 0; i < in.size(); ++i) REQUIRE_CLOSE(c_in[i].grad(), e_in[i].grad(), kGradRtol, kGradAtol);
}

}  // namespace

TEST_CASE("aot graph cache: the same computation in two callables compiles once and equals eager",
          "[autograd][cache]") {
  at::manual_seed(0);
  const CountingBackend b;
  const auto cache = std::make_shared<autograd::AotCache>();
  runtime::default_metrics_log().clear();
  const auto first = autograd::aot_function(layer, counted(b, "counting", cache));
  const auto second = autograd::aot_function(Layer{}, counted(b, "counting", cache));
  const Tensors in = data();
  check_against_eager(first, layer, in);
  REQUIRE(b.count() == 2);  // forward, then backward
  check_against_eager(second, Layer{}, in);
  REQUIRE(b.count() == 2);  // both reused
  // Other values of the same metadata: still eager's.
  check_against_eager(second, Layer{}, data());
  REQUIRE(b.count() == 2);
  REQUIRE(first.num_compilations() == 1);
  REQUIRE(second.num_compilations() == 1);
  const autograd::AotCache::Stats s = cache->stats();
  REQUIRE(s.misses == 2);
  REQUIRE(s.hits == 2);
  REQUIRE(cache->size() == 2);
  // The metrics say which backend calls were skipped.
  std::vector<std::string> seen;
  for (const runtime::CompilationMetrics& m : runtime::default_metrics_log().records())
    seen.push_back(m.kind + " " + m.graph_cache);
  REQUIRE(seen == std::vector<std::string>{"forward miss", "backward miss", "forward hit", "backward hit"});

  // The inference path has a graph of its own, shared the same way.
  const Tensors x = data();
  REQUIRE_EQUAL_TENSORS(first(x)[0], layer(x)[0]);
  REQUIRE_EQUAL_TENSORS(second(x)[0], layer(x)[0]);
  REQUIRE(b.count() == 3);
}

TEST_CASE("aot graph cache: different computations over the same metadata do not share", "[autograd][cache]") {
  at::manual_seed(1);
  const CountingBackend b;
  const auto cache = std::make_shared<autograd::AotCache>();
  const auto tanh_fn = autograd::aot_function(layer, counted(b, "counting", cache));
  const auto sigmoid_fn = autograd::aot_function(other_layer, counted(b, "counting", cache));
  const Tensors in = data();
  check_against_eager(tanh_fn, layer, in);
  check_against_eager(sigmoid_fn, other_layer, in);
  REQUIRE(b.count() == 4);
  REQUIRE(cache->stats().hits == 0);
  // Each still runs its own graph afterwards.
  REQUIRE_EQUAL_TENSORS(tanh_fn(in)[0], layer(in)[0]);
  REQUIRE_EQUAL_TENSORS(sigmoid_fn(in)[0], other_layer(in)[0]);
}

TEST_CASE("aot graph cache: another compiler_key, an empty one, or no cache does not share", "[autograd][cache]") {
  at::manual_seed(2);
  const Tensors in = data();
  auto compile_twice = [&](const CountingBackend& b, autograd::AotConfig c1, autograd::AotConfig c2) {
    REQUIRE_EQUAL_TENSORS(autograd::aot_function(layer, std::move(c1))(in)[0], layer(in)[0]);
    REQUIRE_EQUAL_TENSORS(autograd::aot_function(Layer{}, std::move(c2))(in)[0], layer(in)[0]);
    return b.count();
  };
  const auto cache = std::make_shared<autograd::AotCache>();
  const CountingBackend b1, b2, b3, b4;
  REQUIRE(compile_twice(b1, counted(b1, "interpreter", cache), counted(b1, "interpreter;dce", cache)) == 2);
  REQUIRE(compile_twice(b2, counted(b2, "", cache), counted(b2, "", cache)) == 2);
  REQUIRE(compile_twice(b3, counted(b3, "k", nullptr), counted(b3, "k", nullptr)) == 2);
  REQUIRE(compile_twice(b4, counted(b4, "k", cache), counted(b4, "k", std::make_shared<autograd::AotCache>())) == 2);
  REQUIRE(cache->stats().hits == 0);
  // Unset, the key keeps the default config out of every cache.
  REQUIRE(autograd::AotConfig{}.compiler_key.empty());
  REQUIRE(autograd::AotConfig{}.cache == autograd::default_aot_cache());
}

TEST_CASE("aot graph cache: new input metadata misses", "[autograd][cache]") {
  at::manual_seed(3);
  const CountingBackend b;
  const auto cache = std::make_shared<autograd::AotCache>();
  const auto f = autograd::aot_function(layer, counted(b, "counting", cache));
  const auto g = autograd::aot_function(Layer{}, counted(b, "counting", cache));
  const Tensors in = data();
  REQUIRE_EQUAL_TENSORS(f(in)[0], layer(in)[0]);
  int expected = 1;
  for (const Tensors& changed : {
           Tensors{at::randn({6, 3}), in[1], in[2]},                                      // sizes
           Tensors{in[0].to(at::kDouble), in[1].to(at::kDouble), in[2].to(at::kDouble)},  // dtype
           Tensors{in[0].t().contiguous().t(), in[1], in[2]},                             // strides
       }) {
    REQUIRE_EQUAL_TENSORS(g(changed)[0], layer(changed)[0]);
    REQUIRE(b.count() == ++expected);
  }
  // requires_grad: the autograd path's forward graph, not the inference graph.
  const Tensors grads = leaves(in, true);
  REQUIRE_EQUAL_TENSORS(g(grads)[0].detach(), layer(in)[0]);
  REQUIRE(b.count() == ++expected);
  REQUIRE(cache->stats().hits == 0);
  REQUIRE(cache->stats().misses == static_cast<size_t>(expected));
}

TEST_CASE("aot graph cache: the process-wide cache shares between callables by default", "[autograd][cache]") {
  at::manual_seed(4);
  const CountingBackend b;
  autograd::AotConfig config;
  config.fw_compiler = config.bw_compiler = config.inference_compiler = b.backend();
  config.compiler_key = "counting interpreter, process-wide test";
  const Tensors in = data();
  {
    const auto gone = autograd::aot_function(layer, config);
    REQUIRE_EQUAL_TENSORS(gone(in)[0], layer(in)[0]);
  }
  // The first callable is gone; its compiled graph is not.
  REQUIRE_EQUAL_TENSORS(autograd::aot_function(Layer{}, config)(in)[0], layer(in)[0]);
  REQUIRE(b.count() == 1);
}

namespace {

using crucible::testing::Mlp;

Tensors mlp_forward(torch::nn::Module& m, const Tensors& in) { return {static_cast<Mlp&>(m).forward(in[0])}; }

}  // namespace

TEST_CASE("aot graph cache: two instances of one module share graphs, each with its own weights", "[autograd][cache]") {
  at::manual_seed(5);
  const CountingBackend b;
  const auto cache = std::make_shared<autograd::AotCache>();
  auto m1 = std::make_shared<Mlp>(3, 8, 2), m2 = std::make_shared<Mlp>(3, 8, 2);
  auto e1 = std::make_shared<Mlp>(3, 8, 2), e2 = std::make_shared<Mlp>(3, 8, 2);
  for (auto [from, to] : {std::pair{m1, e1}, std::pair{m2, e2}}) {
    torch::NoGradGuard no_grad;
    const auto src = from->parameters(), dst = to->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  const auto c1 = autograd::aot_module(m1, mlp_forward, counted(b, "counting", cache));
  const auto c2 = autograd::aot_module(m2, mlp_forward, counted(b, "counting", cache));
  const at::Tensor x = at::randn({4, 3});
  for (auto [compiled, module, eager] : {std::tuple{&c1, m1, e1}, std::tuple{&c2, m2, e2}}) {
    const at::Tensor out = (*compiled)({x})[0];
    const at::Tensor ref = eager->forward(x);
    REQUIRE_EQUAL_TENSORS(out.detach(), ref.detach());
    out.pow(2).sum().backward();
    ref.pow(2).sum().backward();
    const auto got = module->parameters(), want = eager->parameters();
    for (size_t i = 0; i < got.size(); ++i) REQUIRE_CLOSE(got[i].grad(), want[i].grad(), kGradRtol, kGradAtol);
  }
  REQUIRE(b.count() == 2);  // one forward and one backward for both modules
}

TEST_CASE("aot graph cache: callables compiling at once on several threads agree with eager", "[autograd][cache]") {
  at::manual_seed(6);
  const CountingBackend b;
  const auto cache = std::make_shared<autograd::AotCache>();
  const Tensors in = data();
  const at::Tensor ref = layer(in)[0];
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      const auto f = autograd::aot_function(Layer{}, counted(b, "counting", cache));
      for (int k = 0; k < 3; ++k) wrong += !f(in)[0].equal(ref);
    });
  for (std::thread& t : threads) t.join();
  REQUIRE(wrong == 0);
  REQUIRE(cache->size() == 1);
  REQUIRE(b.count() >= 1);
  REQUIRE(cache->stats().hits + cache->stats().misses == 4);
}

TEST_CASE("AotCache: the key holds kind, compiler_key and example metadata; LRU beyond capacity", "[autograd][cache]") {
  const CountingBackend b;
  autograd::AotCache cache(2);
  const ir::Graph g =
      ir::parse("%x : f32[2, 3] = placeholder()\n%y : f32[2, 3] = aten::mul.Scalar(%x, 2.0)\nreturn (%y)\n");
  const at::Tensor x = at::randn({2, 3});
  auto compile = [&](std::string_view key, std::string_view kind, const at::Tensor& example) {
    return cache.compile(b.backend(), key, kind, g, {example});
  };
  REQUIRE(compile("k", "inference", x).outcome == "miss");
  const autograd::AotCache::Compiled hit = compile("k", "inference", at::zeros({2, 3}));
  REQUIRE(hit.outcome == "hit");
  Tensors args{x};
  REQUIRE_EQUAL_TENSORS(hit.fn(args)[0], x * 2);
  // Example inputs of other strides, another kind, another key: the same graph misses.
  REQUIRE(compile("k", "inference", at::randn({3, 2}).t()).outcome == "miss");
  REQUIRE(compile("k", "forward", x).outcome == "miss");
  REQUIRE(compile("k2", "inference", x).outcome == "miss");
  REQUIRE(b.count() == 4);
  // Capacity 2: the two least recently used entries are gone.
  REQUIRE(cache.size() == 2);
  REQUIRE(cache.stats().evictions == 2);
  REQUIRE(compile("k2", "inference", x).outcome == "hit");
  REQUIRE(compile("k", "forward", x).outcome == "hit");
  REQUIRE(compile("k", "inference", x).outcome == "miss");
  cache.set_capacity(0);
  REQUIRE(cache.size() == 0);
  REQUIRE(compile("k", "inference", x).outcome == "miss");
  REQUIRE(cache.size() == 0);
  cache.set_capacity(4);
  compile("k", "inference", x);
  cache.clear();
  REQUIRE(cache.size() == 0);
  cache.reset_stats();
  REQUIRE(cache.stats().misses == 0);
  REQUIRE_THROWS_WITH(compile("", "inference", x), CRUCIBLE_HAS_SUBSTR("set AotConfig::compiler_key"));
}

TEST_CASE("AotCache: a graph that cannot be hashed compiles uncached (bypass)", "[autograd][cache]") {
  const CountingBackend b;
  autograd::AotCache cache;
  ir::Graph g;
  ir::Value* x = g.add_placeholder("x", ir::TensorMeta::contiguous({2}));
  ir::Node* add = g.add_call("aten::add.Tensor", {x, x, c10::IValue(c10::complex<double>(1, 0))});
  add->result()->set_meta(ir::TensorMeta::contiguous({2}));
  g.set_output({add->result()});
  for (int k = 0; k < 2; ++k) {
    const autograd::AotCache::Compiled c = cache.compile(b.backend(), "k", "inference", g, {at::ones({2})});
    INFO(c.outcome);
    REQUIRE(c.outcome.rfind("bypass: graph_hash: %add (aten::add.Tensor)", 0) == 0);
  }
  REQUIRE(b.count() == 2);
  REQUIRE(cache.size() == 0);
  REQUIRE(cache.stats().bypasses == 2);
}
