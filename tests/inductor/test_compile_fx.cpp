// compile_fx_inner against eager LibTorch: fused pointwise chains over
// several shapes and dtypes, extern kernels between them, inputs whose
// layout differs from the graph's, compiler failures, the kernel cache and
// the graph cache.
#include <crucible/inductor/compile_fx.h>
#include <crucible/inductor/error.h>
#include <crucible/ir/graph.h>
#include <crucible/ir/interpreter.h>
#include <crucible/ir/propagate_meta.h>
#include <crucible/runtime/instruments.h>
#include <crucible/tracer/make_fx.h>

#include "catch.h"
#include "graph_testing.h"
#include "testing.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <random>
#include <sstream>
#include <tuple>

using namespace crucible;
namespace fs = std::filesystem;

namespace {

// One cache directory per test run: kernels compiled by one test case are
// reused by the others.
const std::string& test_cache() {
  static const std::string dir = crucible::testing::temp_dir("crucible-inductor-test");
  return dir;
}

inductor::InductorOptions options() {
  inductor::InductorOptions o;
  o.cache_dir = test_cache();
  return o;
}

// Fused code may contract a*b+c into one FMA (GCC's default -ffp-contract=fast)
// and uses libm's exp/tanh where ATen uses its vectorized ones; both differ
// from eager by a few units in the last place, so the tolerance is a few
// ulps of the dtype at the values' scale.
double rtol(c10::ScalarType t) { return t == at::kDouble ? 1e-12 : 1e-5; }
double atol(c10::ScalarType t) { return t == at::kDouble ? 1e-12 : 1e-6; }

std::vector<at::Tensor> run(const ir::CompiledFn& fn, std::vector<at::Tensor> inputs) { return fn(inputs); }

// y = exp(tanh(relu(x * 3 + b * 0.5) - x) / (b*b + 1)), in one fused loop.
ir::Graph chain(const at::Tensor& x, const at::Tensor& b) {
  ir::Graph g;
  ir::Value* px = g.add_placeholder("x", ir::TensorMeta::of(x));
  ir::Value* pb = g.add_placeholder("b", ir::TensorMeta::of(b));
  ir::Value* m = g.add_call("aten::mul.Scalar", {px, c10::Scalar(3.0)})->result();
  ir::Value* a = g.add_call("aten::add.Tensor", {m, pb, c10::Scalar(0.5)})->result();
  ir::Value* r = g.add_call("aten::relu", {a})->result();
  ir::Value* s = g.add_call("aten::sub.Tensor", {r, px, c10::Scalar(1)})->result();
  ir::Value* t = g.add_call("aten::tanh", {s})->result();
  ir::Value* bb = g.add_call("aten::pow.Tensor_Scalar", {pb, c10::Scalar(2)})->result();
  ir::Value* d = g.add_call("aten::add.Scalar", {bb, c10::Scalar(1), c10::Scalar(1)})->result();
  ir::Value* q = g.add_call("aten::div.Tensor", {t, d})->result();
  ir::Value* e = g.add_call("aten::exp", {q})->result();
  g.set_output({e, r});
  ir::propagate_meta(g);
  return g;
}

std::vector<at::Tensor> chain_eager(const at::Tensor& x, const at::Tensor& b) {
  at::Tensor r = at::relu(x * 3.0 + b * 0.5);
  return {at::exp(at::tanh(r - x) / (b.pow(2) + 1)), r};
}

}  // namespace

TEST_CASE("a pointwise chain fuses into one loop and matches eager over shapes and dtypes", "[inductor]") {
  std::vector<std::vector<int64_t>> shapes = {{7, 5}, {1 << 16}, {1}, {}, {0}, {3, 0, 2}};
  for (auto dtype : {at::kFloat, at::kDouble}) {
    for (const auto& shape : shapes) {
      CAPTURE(dtype, shape);
      at::Tensor x = at::randn(shape, at::TensorOptions().dtype(dtype));
      at::Tensor b = at::randn(shape, at::TensorOptions().dtype(dtype));
      ir::Graph g = chain(x, b);
      std::string code = inductor::generate_code(g).source;
      REQUIRE(code.find("// kernel_0 (") != std::string::npos);
      REQUIRE(code.find("kernel_1") == std::string::npos);  // one loop for all nine nodes
      ir::CompiledFn fn = inductor::compile_fx_inner(g, {x, b}, options());
      auto got = run(fn, {x, b});
      auto want = chain_eager(x, b);
      REQUIRE(got.size() == 2);
      REQUIRE_CLOSE(got[0], want[0], rtol(dtype), atol(dtype));
      REQUIRE_CLOSE(got[1], want[1], rtol(dtype), atol(dtype));
    }
  }
}

TEST_CASE("the per-step profile times every step and reports when the compiled function goes", "[inductor]") {
  at::Tensor x = at::randn({6, 4}), b = at::randn({6, 4});
  ir::Graph g = chain(x, b);
  inductor::InductorOptions o = options();
  o.profile = true;
  std::ostringstream err;
  std::streambuf* saved = std::cerr.rdbuf(err.rdbuf());
  {
    ir::CompiledFn fn = inductor::compile_fx_inner(g, {x, b}, o);
    const auto want = chain_eager(x, b);
    for (int call = 0; call < 3; ++call)  // profiled, and still right
      REQUIRE_CLOSE(run(fn, {x, b})[0], want[0], rtol(at::kFloat), atol(at::kFloat));
  }
  std::cerr.rdbuf(saved);
  INFO(err.str());
  REQUIRE(err.str().find("inductor profile") != std::string::npos);
  REQUIRE(err.str().find("2 calls after the first") != std::string::npos);  // the warm-up left out
  REQUIRE(err.str().find("kernel_0: ") != std::string::npos);               // the kernel, named with what it fuses
}

TEST_CASE("inputs laid out unlike the graph's metadata are made contiguous first", "[inductor]") {
  at::Tensor x = at::randn({6, 4});
  at::Tensor b = at::randn({6, 4});
  ir::CompiledFn fn = inductor::compile_fx_inner(chain(x, b), {x, b}, options());
  at::Tensor xt = at::randn({4, 6}).t();  // same sizes, transposed strides
  auto got = run(fn, {xt, b});
  auto want = chain_eager(xt, b);
  REQUIRE_CLOSE(got[0], want[0], 1e-5, 1e-6);
}

TEST_CASE("broadcast, transposed and 0-dim operands are read through index expressions", "[inductor]") {
  at::Tensor x = at::randn({5, 3});
  at::Tensor row = at::randn({3});
  at::Tensor s = at::randn({});
  at::Tensor w = at::randn({3, 4});
  ir::Graph g;
  ir::Value* px = g.add_placeholder("x", ir::TensorMeta::of(x));
  ir::Value* prow = g.add_placeholder("row", ir::TensorMeta::of(row));
  ir::Value* ps = g.add_placeholder("s", ir::TensorMeta::of(s));
  ir::Value* pw = g.add_placeholder("w", ir::TensorMeta::of(w));
  ir::Value* a = g.add_call("aten::add.Tensor", {px, prow, c10::Scalar(1)})->result();  // broadcast row
  ir::Value* m = g.add_call("aten::mul.Tensor", {a, ps})->result();                     // 0-dim
  ir::Value* sg = g.add_call("aten::sigmoid", {m})->result();
  ir::Value* mm = g.add_call("aten::mm", {sg, pw})->result();  // extern between loops
  ir::Value* t = g.add_call("aten::t", {mm})->result();        // a view: an index map
  ir::Value* n = g.add_call("aten::neg", {t})->result();       // reads mm transposed
  ir::Value* sb = g.add_call("aten::sigmoid_backward", {mm, mm})->result();
  ir::Value* tb = g.add_call("aten::threshold_backward", {sb, mm, c10::Scalar(0.1)})->result();
  g.set_output({n, tb, sg});
  ir::propagate_meta(g);
  std::string code = inductor::generate_code(g).source;
  REQUIRE(code.find("kernel_0") != std::string::npos);
  REQUIRE(code.find("kernel_1") != std::string::npos);  // the mm runs between the two
  REQUIRE(code.find("%add (aten::add.Tensor)") != std::string::npos);
  REQUIRE(code.find("%neg (aten::neg)") != std::string::npos);
  ir::CompiledFn fn = inductor::compile_fx_inner(g, {x, row, s, w}, options());
  auto got = run(fn, {x, row, s, w});
  at::Tensor sg_e = at::sigmoid((x + row) * s);
  at::Tensor mm_e = at::mm(sg_e, w);
  REQUIRE_CLOSE(got[0], -mm_e.t(), 1e-5, 1e-6);
  REQUIRE_CLOSE(got[1], at::threshold_backward(at::sigmoid_backward(mm_e, mm_e), mm_e, 0.1), 1e-5, 1e-6);
  REQUIRE_CLOSE(got[2], sg_e, 1e-5, 1e-6);
}

TEST_CASE("the guard of at::equal runs as an extern kernel and fails with its own message", "[inductor]") {
  // Note [Guarded equal]: traced where the tensors differ, the graph computes
  // that branch; a call whose tensors are equal would need the other.
  auto fn = [](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{at::equal(in[0], in[1]) ? in[0] + 1 : in[0] * 2};
  };
  const at::Tensor a = at::randn({6, 4}), b = at::randn({6, 4});
  const auto traced = tracer::make_fx(fn, {a, b});
  ir::CompiledFn compiled = inductor::compile_fx_inner(traced.graph, {a, b}, options());
  std::vector<at::Tensor> in = {b, a};
  REQUIRE_EQUAL_TENSORS(compiled(in)[0], b * 2);
  std::vector<at::Tensor> same = {a, a.clone()};
  REQUIRE_THROWS_WITH(compiled(same), CRUCIBLE_HAS_SUBSTR("extern kernel crucible::assert_equal failed") &&
                                          CRUCIBLE_HAS_SUBSTR("Compile the function again"));
}

TEST_CASE("integer and bool results: lowered exactly", "[inductor]") {
  at::Tensor i = at::arange(10, at::kLong);
  ir::Graph g;
  ir::Value* pi = g.add_placeholder("i", ir::TensorMeta::of(i));
  ir::Value* a = g.add_call("aten::add.Tensor", {pi, pi, c10::Scalar(2)})->result();
  ir::Value* c = g.add_call("aten::gt.Scalar", {a, c10::Scalar(7)})->result();
  g.set_output({a, c});
  ir::propagate_meta(g);
  REQUIRE(inductor::generate_code(g).source.find("%gt (aten::gt.Scalar)") != std::string::npos);
  auto got = run(inductor::compile_fx_inner(g, {i}, options()), {i});
  REQUIRE_EQUAL_TENSORS(got[0], i * 3);
  REQUIRE_EQUAL_TENSORS(got[1], i * 3 > 7);
}

TEST_CASE("a compiler failure names the generated source and the compiler's message, or falls back", "[inductor]") {
  at::Tensor x = at::randn({8});
  at::Tensor b = at::randn({8});
  ir::Graph g = chain(x, b);
  inductor::InductorOptions o = options();
  o.flags = {"-O2", "-fthis-flag-does-not-exist"};
  try {
    inductor::compile_fx_inner(g, {x, b}, o);
    FAIL("the compiler should have failed");
  } catch (const inductor::InductorError& e) {
    std::string what = e.what();
    CHECK(what.find(".cpp") != std::string::npos);
    CHECK(what.find("this-flag-does-not-exist") != std::string::npos);
  }
  o.fallback_to_eager = true;
  auto got = run(inductor::compile_fx_inner(g, {x, b}, o), {x, b});
  REQUIRE_CLOSE(got[0], chain_eager(x, b)[0], 1e-5, 1e-6);
}

namespace {

// g++ behind a script that counts its runs, in a fresh directory (0700)
// under the test cache, with an empty cache directory `cache` beside it.
struct CountingCompiler {
  explicit CountingCompiler(const std::string& name) : dir(fs::path(test_cache()) / name) {
    fs::create_directory(dir);
    fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace);
    std::ofstream(script()) << "#!/bin/sh\necho run >> '" << (dir / "runs").string() << "'\nexec g++ \"$@\"\n";
    fs::permissions(script(), fs::perms::owner_all, fs::perm_options::replace);
  }
  fs::path script() const { return dir / "counting-g++"; }
  std::string cache() const { return (dir / "cache").string(); }
  int64_t runs() const {
    std::ifstream f(dir / "runs");
    return std::count(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>(), '\n');
  }
  fs::path dir;
};

}  // namespace

TEST_CASE("the kernel cache: a second compile loads the library without running the compiler", "[inductor]") {
  const CountingCompiler cc("counted");
  inductor::InductorOptions o;
  o.cache_dir = cc.cache();
  o.compiler = cc.script().string();
  at::Tensor x = at::randn({9});
  at::Tensor b = at::randn({9});
  ir::Graph g = chain(x, b);
  auto runs = [&] { return cc.runs(); };
  run(inductor::compile_fx_inner(g, {x, b}, o), {x, b});
  REQUIRE(runs() == 1);
  auto got = run(inductor::compile_fx_inner(g, {x, b}, o), {x, b});
  REQUIRE(runs() == 1);
  REQUIRE_CLOSE(got[0], chain_eager(x, b)[0], 1e-5, 1e-6);
  // A truncated library is detected (it does not load) and rebuilt.
  for (const auto& e : fs::directory_iterator(o.cache_dir))
    if (e.path().extension() == ".so") fs::resize_file(e.path(), 100);
  got = run(inductor::compile_fx_inner(g, {x, b}, o), {x, b});
  REQUIRE(runs() == 2);
  REQUIRE_CLOSE(got[0], chain_eager(x, b)[0], 1e-5, 1e-6);
}

namespace {

// The shapes of a sequence model's step: x [B, T, C], a position table
// [16, C] and a causal mask [16, 16] sliced to T, a layer norm, masked
// softmax attention (the matmuls are extern kernels), a reshape to
// [B*T, C] and a sum over the rows.
std::vector<at::Tensor> sequence_step(const std::vector<at::Tensor>& in) {
  const at::Tensor& x = in[0];
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
  const at::Tensor h = x + in[1].slice(0, 0, t);
  const at::Tensor n = (h - h.mean(-1, true)) * at::rsqrt(h.var(-1, /*unbiased=*/false, true) + 1e-5);
  at::Tensor s = at::matmul(n, n.transpose(1, 2)) / std::sqrt(static_cast<double>(c));
  s = s.masked_fill(in[2].slice(0, 0, t).slice(1, 0, t) == 0, -std::numeric_limits<double>::infinity());
  const at::Tensor y = at::matmul(at::softmax(s, -1), n).reshape({b * t, c});
  return {y, y.sum(0)};
}

}  // namespace

TEST_CASE("dynamic sizes: after a second sequence length, every later length reuses the kernels compiled for it",
          "[inductor][dynamic]") {
  const CountingCompiler cc("dynamic");
  inductor::InductorOptions o;
  o.cache_dir = cc.cache();
  o.compiler = cc.script().string();
  const at::Tensor pos = at::randn({16, 16}, at::kDouble), mask = at::ones({16, 16}, at::kDouble).tril();
  // Each (batch, length) is traced and compiled on its own, as every new
  // shape is; the kernels' text is what is shared. Expected C++ compiles:
  // the first graph's static kernels, then one build once T varies, one
  // more once B does too (a smaller last batch), then none.
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {{5, 6, 1},  {5, 9, 2}, {5, 11, 2}, {5, 7, 2},
                                                                     {5, 13, 2}, {3, 9, 3}, {3, 12, 3}, {4, 14, 3}};
  for (const auto& [b, t, builds] : shapes) {
    CAPTURE(b, t);
    const std::vector<at::Tensor> in = {at::randn({b, t, 16}, at::kDouble), pos, mask};
    const auto traced = tracer::make_fx(sequence_step, in);
    ir::CompiledFn fn = inductor::compile_fx_inner(traced.graph, in, o);
    const std::vector<at::Tensor> got = run(fn, in), want = sequence_step(in);
    REQUIRE_CLOSE(got[0], want[0], rtol(at::kDouble), atol(at::kDouble));
    REQUIRE_CLOSE(got[1], want[1], rtol(at::kDouble), atol(at::kDouble));
    CHECK(cc.runs() == builds);
  }
}

TEST_CASE("dynamic sizes: off, each sequence length compiles its own kernels", "[inductor][dynamic]") {
  const CountingCompiler cc("static");
  inductor::InductorOptions o;
  o.cache_dir = cc.cache();
  o.compiler = cc.script().string();
  o.automatic_dynamic_shapes = false;
  const at::Tensor pos = at::randn({16, 16}, at::kDouble), mask = at::ones({16, 16}, at::kDouble).tril();
  for (int64_t t : {4, 8, 10}) {
    const std::vector<at::Tensor> in = {at::randn({2, t, 16}, at::kDouble), pos, mask};
    ir::CompiledFn fn = inductor::compile_fx_inner(tracer::make_fx(sequence_step, in).graph, in, o);
    REQUIRE_CLOSE(run(fn, in)[0], sequence_step(in)[0], rtol(at::kDouble), atol(at::kDouble));
  }
  CHECK(cc.runs() == 3);
}

TEST_CASE("dynamic sizes: a length of 1, or one equal to a static size, still computes what eager does",
          "[inductor][dynamic]") {
  // Sizes 0 and 1 are never symbols, and a length equal to the width (16)
  // is a value two spellings claim: both compile kernels of their own,
  // whose results must still be eager's.
  inductor::InductorOptions o = options();
  const at::Tensor pos = at::randn({16, 16}, at::kDouble), mask = at::ones({16, 16}, at::kDouble).tril();
  for (int64_t t : {3, 5, 1, 16, 2}) {
    CAPTURE(t);
    const std::vector<at::Tensor> in = {at::randn({6, t, 16}, at::kDouble), pos, mask};
    ir::CompiledFn fn = inductor::compile_fx_inner(tracer::make_fx(sequence_step, in).graph, in, o);
    const std::vector<at::Tensor> got = run(fn, in), want = sequence_step(in);
    REQUIRE_CLOSE(got[0], want[0], rtol(at::kDouble), atol(at::kDouble));
    REQUIRE_CLOSE(got[1], want[1], rtol(at::kDouble), atol(at::kDouble));
  }
}

TEST_CASE("the graph cache: a graph compiled before skips lowering; a corrupt entry is compiled again", "[inductor]") {
  fs::path dir = fs::path(test_cache()) / "graphs";
  fs::create_directory(dir);
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace);
  inductor::InductorOptions o;
  o.cache_dir = dir.string();
  // relu(x @ w + b) * 2 and a sum: generated kernels around an extern one.
  auto graph = [](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    ir::Graph g;
    ir::Value* px = g.add_placeholder("x", ir::TensorMeta::of(x));
    ir::Value* pw = g.add_placeholder("w", ir::TensorMeta::of(w));
    ir::Value* pb = g.add_placeholder("b", ir::TensorMeta::of(b));
    ir::Value* mm = g.add_call("aten::mm", {px, pw})->result();
    ir::Value* r =
        g.add_call("aten::relu", {g.add_call("aten::add.Tensor", {mm, pb, c10::Scalar(1)})->result()})->result();
    ir::Value* y = g.add_call("aten::mul.Scalar", {r, c10::Scalar(2.0)})->result();
    g.set_output({y, g.add_call("aten::sum", {y, c10::IValue()})->result()});
    ir::propagate_meta(g);
    return g;
  };
  auto check = [&](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    const ir::Graph g = graph(x, w, b);
    const std::vector<at::Tensor> got = run(inductor::compile_fx_inner(g, {x, w, b}, o), {x, w, b});
    const at::Tensor y = at::relu(at::mm(x, w) + b) * 2;
    REQUIRE_CLOSE(got.at(0), y, 1e-5, 1e-6);
    REQUIRE_CLOSE(got.at(1), y.sum(), 1e-5, 1e-5);
  };
  runtime::Counters& counters = runtime::default_counters();
  auto hits = [&] { return counters.get("inductor", "fxgraph_cache_hit"); };
  auto misses = [&] { return counters.get("inductor", "fxgraph_cache_miss"); };
  const at::Tensor x = at::randn({5, 7}), w = at::randn({7, 3}), b = at::randn({3});
  const int64_t hit0 = hits(), miss0 = misses();
  check(x, w, b);
  CHECK((hits() == hit0 && misses() == miss0 + 1));
  // Other values of the same layout: the entry serves them (fresh inputs).
  check(at::randn({5, 7}), at::randn({7, 3}), at::randn({3}));
  CHECK((hits() == hit0 + 1 && misses() == miss0 + 1));
  // Other sizes are another graph.
  check(at::randn({4, 7}), w, b);
  CHECK((hits() == hit0 + 1 && misses() == miss0 + 2));
  // A truncated entry misses, compiles again, and is written whole again;
  // so does one whose source (after the header line) was altered.
  auto entries = [&](const std::function<void(const fs::path&)>& damage) {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".entry") damage(e.path());
  };
  entries([](const fs::path& p) { fs::resize_file(p, fs::file_size(p) / 2); });
  check(x, w, b);
  CHECK((hits() == hit0 + 1 && misses() == miss0 + 3));
  check(x, w, b);
  CHECK((hits() == hit0 + 2 && misses() == miss0 + 3));
  entries([](const fs::path& p) {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-2, std::ios::end);  // the last line of the source: a kernel's closing brace
    f.put('#');
  });
  check(x, w, b);
  CHECK((hits() == hit0 + 2 && misses() == miss0 + 4));
  check(x, w, b);
  CHECK((hits() == hit0 + 3 && misses() == miss0 + 4));
}

TEST_CASE(
    "the caches across processes: two compiling one graph at once both succeed, a third hits without the compiler",
    "[inductor]") {
  const char* worker = std::getenv("CRUCIBLE_COMPILE_WORKER");
  if (worker == nullptr) CRUCIBLE_SKIP("CRUCIBLE_COMPILE_WORKER is not set (meson test sets it)");
  const CountingCompiler cc("processes");
  auto command = [&](int i) {
    return "'" + std::string(worker) + "' '" + cc.cache() + "' '" + cc.script().string() + "' > '" +
           (cc.dir / ("out" + std::to_string(i))).string() + "'";
  };
  auto outcome = [&](int i) {
    std::ifstream f(cc.dir / ("out" + std::to_string(i)));
    std::string word;
    f >> word;
    return word;
  };
  // Both write the same entries at once (temporary names renamed over the
  // final ones): each computes eager's values, and neither sees half a file.
  const std::string both = command(0) + " & a=$!; " + command(1) + " & b=$!; wait $a && wait $b";
  REQUIRE(std::system(both.c_str()) == 0);
  CHECK((outcome(0) == "miss" || outcome(1) == "miss"));
  const int64_t compiled = cc.runs();
  CHECK((compiled == 1 || compiled == 2));
  // A new process finds the schedule and the library: no lowering, no compiler.
  REQUIRE(std::system(command(2).c_str()) == 0);
  CHECK(outcome(2) == "hit");
  CHECK(cc.runs() == compiled);
}

TEST_CASE("a cache directory others can write is refused", "[inductor]") {
  fs::path dir = fs::path(test_cache()) / "shared";
  fs::create_directory(dir);
  ::chmod(dir.c_str(), 0777);
  inductor::InductorOptions o;
  o.cache_dir = dir.string();
  at::Tensor x = at::randn({4});
  at::Tensor b = at::randn({4});
  REQUIRE_THROWS_WITH(inductor::compile_fx_inner(chain(x, b), {x, b}, o),
                      CRUCIBLE_HAS_SUBSTR("writable by group or others"));
}

// Note [In-place write-backs] and [Trailing write-backs] in
// src/lowering/write_backs.cpp:
// an SGD-with-momentum step's write-backs, in the order a traced step has
// them (momentum first, whose old value the parameter's update reads).
TEST_CASE("trailing write-backs: new values written in place into the inputs, in an order that keeps old values",
          "[inductor]") {
  at::Tensor w0 = at::randn({6, 5}), m0 = at::randn({6, 5}), g = at::randn({6, 5});
  ir::Graph graph;
  ir::Value* pw = graph.add_placeholder("w", ir::TensorMeta::of(w0));
  ir::Value* pm = graph.add_placeholder("m", ir::TensorMeta::of(m0));
  ir::Value* pg = graph.add_placeholder("g", ir::TensorMeta::of(g));
  ir::Value* decayed = graph.add_call("aten::mul.Scalar", {pm, c10::Scalar(0.9)})->result();
  ir::Value* new_m = graph.add_call("aten::add.Tensor", {decayed, pg, c10::Scalar(1)})->result();
  ir::Value* new_w = graph.add_call("aten::sub.Tensor", {pw, new_m, c10::Scalar(0.1)})->result();
  ir::Value* loss = graph.add_call("aten::sum", {pg, c10::IValue()})->result();
  graph.add_call("aten::copy_", {pm, new_m, false});
  graph.add_call("aten::copy_", {pw, new_w, false});
  graph.set_output({loss});
  ir::propagate_meta(graph);
  std::string code = inductor::generate_code(graph).source;
  REQUIRE(code.find("(aten::copy_)") != std::string::npos);  // at least one write-back fused, not an extern copy
  const at::Tensor want_m = m0 * 0.9 + g, want_w = w0 - 0.1 * want_m;
  ir::CompiledFn fn = inductor::compile_fx_inner(graph, {}, options());
  SECTION("contiguous inputs are written in place") {
    at::Tensor w = w0.clone(), m = m0.clone();
    const void* w_data = w.data_ptr();
    auto out = run(fn, {w, m, g});
    REQUIRE(w.data_ptr() == w_data);
    REQUIRE_CLOSE(w, want_w, 1e-6, 1e-6);
    REQUIRE_CLOSE(m, want_m, 1e-6, 1e-6);
    REQUIRE_CLOSE(out[0], g.sum(), 1e-5, 1e-5);
  }
  SECTION("an input laid out unlike the graph's is written through a copy, then copied back") {
    at::Tensor w = w0.t().contiguous().t(), m = m0.clone();  // same sizes, transposed strides
    run(fn, {w, m, g});
    REQUIRE_CLOSE(w, want_w, 1e-6, 1e-6);
    REQUIRE_CLOSE(m, want_m, 1e-6, 1e-6);
  }
}

TEST_CASE("a write-back that reads its input at other elements is not done in place", "[inductor]") {
  at::Tensor w0 = at::randn({5, 5});
  ir::Graph graph;
  ir::Value* pw = graph.add_placeholder("w", ir::TensorMeta::of(w0));
  ir::Value* t = graph.add_call("aten::t", {pw})->result();
  ir::Value* v = graph.add_call("aten::add.Scalar", {t, c10::Scalar(1), c10::Scalar(1)})->result();
  ir::Value* s = graph.add_call("aten::sum", {pw, c10::IValue()})->result();
  graph.add_call("aten::copy_", {pw, v, false});
  graph.set_output({s});
  ir::propagate_meta(graph);
  REQUIRE(inductor::generate_code(graph).source.find("(aten::copy_)") == std::string::npos);
  at::Tensor w = w0.clone();
  auto out = run(inductor::compile_fx_inner(graph, {}, options()), {w});
  REQUIRE_CLOSE(w, w0.t() + 1, 1e-6, 1e-6);  // every element from the old w, as eager's copy_ of a temporary
  REQUIRE_CLOSE(out[0], w0.sum(), 1e-5, 1e-5);
}

namespace {

// An optimizer-like step: w (a parameter) and m (its state) written in
// place, x (a user input, new at every call) read, loss = sum((x·w)²) and
// the new m returned: the shape of a training step for Note [CUDA graphs].
ir::Graph state_step(const at::Tensor& w, const at::Tensor& m, const at::Tensor& x) {
  ir::Graph g;
  ir::Value* pw = g.add_placeholder("w", ir::TensorMeta::of(w), {ir::InputKind::Parameter, "w", std::nullopt});
  ir::Value* pm = g.add_placeholder("m", ir::TensorMeta::of(m), {ir::InputKind::State, "w.m", std::nullopt});
  ir::Value* px = g.add_placeholder("x", ir::TensorMeta::of(x));
  ir::Value* y = g.add_call("aten::mm", {px, pw})->result();
  ir::Value* y2 = g.add_call("aten::mul.Tensor", {y, y})->result();
  ir::Value* loss = g.add_call("aten::sum", {y2, c10::IValue()})->result();
  ir::Value* grad = g.add_call("aten::mm", {g.add_call("aten::t", {px})->result(), y})->result();
  ir::Value* decayed = g.add_call("aten::mul.Scalar", {pm, c10::Scalar(0.9)})->result();
  ir::Value* new_m = g.add_call("aten::add.Tensor", {decayed, grad, c10::Scalar(1)})->result();
  ir::Value* new_w = g.add_call("aten::sub.Tensor", {pw, new_m, c10::Scalar(1e-3)})->result();
  g.add_call("aten::copy_", {pm, new_m, false});
  g.add_call("aten::copy_", {pw, new_w, false});
  g.set_output({loss, new_m});
  ir::propagate_meta(g);
  return g;
}

}  // namespace

TEST_CASE("cuda_graph_blocker: what keeps a graph from being captured, read from its metadata", "[inductor]") {
  const at::Tensor w = at::randn({4, 3}), m = at::randn({4, 3}), x = at::randn({5, 4});
  ir::Graph g = state_step(w, m, x);
  CHECK_THAT(inductor::cuda_graph_blocker(g), CRUCIBLE_HAS_SUBSTR("runs on cpu"));
  crucible::testing::relabel_device(g, c10::Device(c10::kCUDA, 0));
  CHECK(inductor::cuda_graph_blocker(g).empty());
  SECTION("an input on the host (a learning rate) would be baked into the capture") {
    ir::Value* state = g.placeholders()[1];
    ir::TensorMeta meta = state->meta();
    meta.device = c10::kCPU;
    state->set_meta(meta);
    CHECK_THAT(inductor::cuda_graph_blocker(g),
               CRUCIBLE_HAS_SUBSTR("input %m is a tensor on cpu") && CRUCIBLE_HAS_SUBSTR("capturable"));
  }
  SECTION("an op that reads a value back to the host") {
    ir::Graph h = state_step(w, m, x);
    ir::Value* s = h.add_call("aten::sum", {h.placeholders()[2], c10::IValue()})->result();
    h.add_call("aten::_local_scalar_dense", {s});
    ir::propagate_meta(h);
    crucible::testing::relabel_device(h, c10::Device(c10::kCUDA, 0));
    CHECK_THAT(inductor::cuda_graph_blocker(h), CRUCIBLE_HAS_SUBSTR("aten::_local_scalar_dense"));
  }
  SECTION("the guard of at::equal (Note [Guarded equal]), which reads both tensors on the host") {
    ir::Graph h = state_step(w, m, x);
    h.add_call("crucible::assert_equal", {h.placeholders()[0], h.placeholders()[1], false});
    crucible::testing::relabel_device(h, c10::Device(c10::kCUDA, 0));
    CHECK_THAT(inductor::cuda_graph_blocker(h), CRUCIBLE_HAS_SUBSTR("crucible::assert_equal"));
  }
  SECTION("a collective of any kind (ir::is_collective), which c10d tracks on the host") {
    ir::Graph h = state_step(w, m, x);
    crucible::testing::relabel_device(h, c10::Device(c10::kCUDA, 0));
    h.add_call("_c10d_functional_autograd::all_gather_into_tensor", {h.placeholders()[2], int64_t{2}, "0"});
    CHECK_THAT(inductor::cuda_graph_blocker(h),
               CRUCIBLE_HAS_SUBSTR("_c10d_functional_autograd::all_gather_into_tensor") &&
                   CRUCIBLE_HAS_SUBSTR("is a collective"));
  }
}

// Note [CUDA graphs]: replays agree with the same graph compiled without
// CUDA graphs (bit for bit: the same kernels in the same order) and with
// eager ATen (within a few ulps: the fused sum adds in another order), call
// after call, on new user inputs, with the state written in place; outputs
// are not overwritten by later replays; state at a new address is captured
// again.
TEST_CASE("CUDA graphs: replays compute what the compiled graph computes, call after call", "[inductor][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  const at::Tensor w0 = at::randn({64, 32}, cuda), m0 = at::zeros({64, 32}, cuda);
  std::vector<at::Tensor> xs;
  for (int i = 0; i < 6; ++i) xs.push_back(at::randn({128, 64}, cuda));
  const ir::Graph g = state_step(w0, m0, xs[0]);
  REQUIRE(inductor::cuda_graph_blocker(g).empty());
  inductor::InductorOptions with = options();
  with.cuda_graphs = true;
  const ir::CompiledFn graphed = inductor::compile_fx_inner(g, {}, with);
  const ir::CompiledFn plain = inductor::compile_fx_inner(g, {}, options());
  at::Tensor w = w0.clone(), m = m0.clone(), rw = w0.clone(), rm = m0.clone(), ew = w0.clone(), em = m0.clone();
  const void* w_data = w.data_ptr();
  std::vector<at::Tensor> kept;  // every call's outputs, checked after the later calls
  std::vector<at::Tensor> want;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i == 4) {  // the state moves: a new capture on the new addresses
      w = w.clone();
      m = m.clone();
    }
    auto out = run(graphed, {w, m, xs[i]});
    auto ref = run(plain, {rw, rm, xs[i]});
    // Same kernels, same order: the same values, bit for bit.
    REQUIRE(at::equal(out[0], ref[0]));
    REQUIRE(at::equal(out[1], ref[1]));
    REQUIRE(at::equal(w, rw));
    REQUIRE(at::equal(m, rm));
    const at::Tensor y = xs[i].mm(ew);
    em = em * 0.9 + xs[i].t().mm(y);
    ew = ew - 1e-3 * em;
    REQUIRE_CLOSE(out[0], (y * y).sum(), 1e-5, 1e-5);
    // A gradient element sums 128 products whose terms may cancel: a few
    // ulps of the largest sum of their magnitudes. w moves by 1e-3 m, so
    // m's error reaches it a thousandth as large, beside w's own ulps.
    const double m_atol = 1e-6 * xs[i].abs().t().mm(y.abs()).max().item<double>();
    REQUIRE_CLOSE(m, em, 1e-5, m_atol);
    REQUIRE_CLOSE(w, ew, 1e-5, 1e-6 + 1e-2 * m_atol);
    kept.push_back(out[0]);
    want.push_back(ref[0].clone());
  }
  for (size_t i = 0; i < kept.size(); ++i) CHECK(at::equal(kept[i], want[i]));
  CHECK(w.data_ptr() != w_data);
}

TEST_CASE("CUDA graphs: a graph that reads a host value runs uncaptured, with eager's values", "[inductor][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  const at::Tensor x = at::randn({1000}, cuda), lr = at::scalar_tensor(0.5, at::kDouble);  // lr on the CPU
  ir::Graph g;
  ir::Value* px = g.add_placeholder("x", ir::TensorMeta::of(x));
  ir::Value* plr = g.add_placeholder("lr", ir::TensorMeta::of(lr), {ir::InputKind::State, "lr", std::nullopt});
  ir::Value* y = g.add_call("aten::mul.Tensor", {px, plr})->result();
  g.set_output({g.add_call("aten::exp", {y})->result()});
  ir::propagate_meta(g);
  REQUIRE_THAT(inductor::cuda_graph_blocker(g), CRUCIBLE_HAS_SUBSTR("input %lr"));
  inductor::InductorOptions with = options();
  with.cuda_graphs = true;
  const ir::CompiledFn fn = inductor::compile_fx_inner(g, {}, with);
  for (double rate : {0.5, 0.25, 2.0}) {  // a new rate each call: nothing baked
    lr.fill_(rate);
    REQUIRE_CLOSE(run(fn, {x, lr})[0], at::exp(x * rate), 1e-5, 1e-6);
  }
}

namespace {

// Sets the float32 matmul precision for a scope (TF32 decides the padding
// alignment of fp32 matmuls: Note [Padding matmuls]).
struct MatmulPrecision {
  explicit MatmulPrecision(const std::string& p) : saved(at::globalContext().float32MatmulPrecision()) {
    at::globalContext().setFloat32MatmulPrecision(p);
  }
  ~MatmulPrecision() {
    at::globalContext().setFloat32MatmulPrecision(saved == at::Float32MatmulPrecision::HIGHEST ? "highest"
                                                  : saved == at::Float32MatmulPrecision::HIGH  ? "high"
                                                                                               : "medium");
  }
  at::Float32MatmulPrecision saved;
};

// GPT-2's lm head and its gradients: logits = x·Wᵀ (N = 50257 columns, not
// a multiple of 4), dx = g·W (K = 50257), dW = gᵀ·x (M = 50257).
ir::Graph lm_head(const at::Tensor& x, const at::Tensor& w, const at::Tensor& g) {
  ir::Graph graph;
  ir::Value* px = graph.add_placeholder("x", ir::TensorMeta::of(x));
  ir::Value* pw = graph.add_placeholder("w", ir::TensorMeta::of(w));
  ir::Value* pg = graph.add_placeholder("g", ir::TensorMeta::of(g));
  ir::Value* logits = graph.add_call("aten::mm", {px, graph.add_call("aten::t", {pw})->result()})->result();
  ir::Value* dx = graph.add_call("aten::mm", {pg, pw})->result();
  ir::Value* dw = graph.add_call("aten::mm", {graph.add_call("aten::t", {pg})->result(), px})->result();
  // Reduced, so that no padded product is a graph output.
  graph.set_output({graph.add_call("aten::amax", {logits, std::vector<int64_t>{1}, false})->result(),
                    graph.add_call("aten::mul.Scalar", {dx, c10::Scalar(2)})->result(),
                    graph.add_call("aten::mul.Scalar", {dw, c10::Scalar(2)})->result()});
  ir::propagate_meta(graph);
  return graph;
}

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("padded matmuls: large fp32 matmuls on a GPU get operands padded to 4 columns when TF32 is on",
          "[inductor]") {
  // Metadata only (meta tensors): the graph as a GPU trace would give it.
  const auto meta = at::TensorOptions().device(at::kMeta);
  ir::Graph g = lm_head(at::empty({1024, 768}, meta), at::empty({50257, 768}, meta), at::empty({1024, 50257}, meta));
  crucible::testing::relabel_device(g, c10::Device(c10::kCUDA, 0));
  {
    MatmulPrecision tf32("high");
    const std::string ir = inductor::loop_ir(g);
    // w padded once for logits (through the transpose) and dx; g once for dx
    // and dw (each pad a loop of the lowered graph).
    INFO(ir);
    CHECK(occurrences(ir, "constant_pad_nd") == 2);
    INFO(ir);
    CHECK(occurrences(ir, "= aten::mm") == 3);
    // The logits are read through the slice of the padded product, rows of 50260.
    CHECK(occurrences(ir, "50260*o + r)") == 1);
  }
  {
    MatmulPrecision exact("highest");  // plain fp32: no tensor cores, nothing to gain
    CHECK(occurrences(inductor::loop_ir(g), "constant_pad_nd") == 0);
  }
  crucible::testing::relabel_device(g, c10::kCPU);
  MatmulPrecision tf32("high");
  CHECK(occurrences(inductor::loop_ir(g), "constant_pad_nd") == 0);  // a CPU graph
}

TEST_CASE("padded matmuls: a product the graph returns through a view is left alone", "[inductor]") {
  // GPT-2's logits: the lm head's product viewed as [B, T, V]. Padded, the
  // view would have the padded product's row stride, not eager's (Note
  // [Eager's strides at the outputs]).
  const auto meta = at::TensorOptions().device(at::kMeta);
  ir::Graph g;
  ir::Value* px = g.add_placeholder("x", ir::TensorMeta::of(at::empty({1024, 768}, meta)));
  ir::Value* pw = g.add_placeholder("w", ir::TensorMeta::of(at::empty({50257, 768}, meta)));
  ir::Value* logits = g.add_call("aten::mm", {px, g.add_call("aten::t", {pw})->result()})->result();
  g.set_output({g.add_call("aten::view", {logits, std::vector<int64_t>{8, 128, 50257}})->result()});
  ir::propagate_meta(g);
  crucible::testing::relabel_device(g, c10::Device(c10::kCUDA, 0));
  MatmulPrecision tf32("high");
  CHECK(occurrences(inductor::loop_ir(g), "constant_pad_nd") == 0);
}

TEST_CASE("padded matmuls: the padded products are eager's on the GPU", "[inductor][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  MatmulPrecision tf32("high");
  // Small integers: every product and sum is exact in TF32 and fp32, so any
  // kernel gives the same bits and a misplaced pad or slice shows at once.
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  const at::Tensor x = at::randint(-3, 4, {1024, 768}, cuda).to(at::kFloat);
  const at::Tensor w = at::randint(-3, 4, {50257, 768}, cuda).to(at::kFloat);
  const at::Tensor g = at::randint(-3, 4, {1024, 50257}, cuda).to(at::kFloat);
  const ir::Graph graph = lm_head(x, w, g);
  REQUIRE(occurrences(inductor::loop_ir(graph), "constant_pad_nd") == 2);
  auto out = run(inductor::compile_fx_inner(graph, {}, options()), {x, w, g});
  REQUIRE_EQUAL_TENSORS(out[0], at::amax(at::mm(x, w.t()), {1}));
  REQUIRE_EQUAL_TENSORS(out[1], at::mm(g, w) * 2);
  REQUIRE_EQUAL_TENSORS(out[2], at::mm(g.t(), x) * 2);
}

TEST_CASE("channels-last convolutions: a GPU graph's convolution operands are copied to channels-last once",
          "[inductor]") {
  // conv(x, w1) -> relu -> conv(., w2) -> sum, traced on meta tensors and
  // moved to cuda:0: the images and both weights are copied to
  // channels-last (Note [Channels-last convolutions]); the second
  // convolution's input is channels-last already (the first's result,
  // through the ReLU), so nothing copies it.
  const auto meta = at::TensorOptions().device(at::kMeta);
  const at::Tensor x = at::empty({2, 3, 16, 16}, meta), w1 = at::empty({8, 3, 3, 3}, meta),
                   w2 = at::empty({8, 8, 3, 3}, meta);
  ir::Graph g;
  ir::Value* px = g.add_placeholder("x", ir::TensorMeta::of(x));
  ir::Value* p1 = g.add_placeholder("w1", ir::TensorMeta::of(w1));
  ir::Value* p2 = g.add_placeholder("w2", ir::TensorMeta::of(w2));
  auto conv = [&](ir::Value* in, ir::Value* w) {
    return g
        .add_call("aten::convolution", {in, w, c10::IValue(), std::vector<int64_t>{1, 1}, std::vector<int64_t>{1, 1},
                                        std::vector<int64_t>{1, 1}, false, std::vector<int64_t>{0, 0}, int64_t{1}})
        ->result();
  };
  ir::Value* y = conv(g.add_call("aten::relu", {conv(px, p1)})->result(), p2);
  g.set_output({g.add_call("aten::sum", {y, c10::IValue()})->result()});
  ir::propagate_meta(g);
  CHECK(occurrences(inductor::loop_ir(g), "_clone") == 0);  // on the CPU: left alone
  crucible::testing::relabel_device(g, c10::Device(c10::kCUDA, 0));
  const std::string ir = inductor::loop_ir(g);
  INFO(ir);
  CHECK(occurrences(ir, "_clone") == 3);
  // The ReLU between the convolutions is computed channels-last.
  CHECK(occurrences(ir, "Float[2, 8, 16, 16] stride=[2048, 1, 128, 8]") >= 1);
}

namespace {

// conv(x, w1) -> relu -> conv(., w2), returning what a caller reads of it:
// the features, a flattening view of them, a slice of the ReLU (a view
// with gaps), the features permuted to NHWC, their sum, and the ReLU as a
// saved value (for a backward alone).
ir::Graph features(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2) {
  ir::Graph g;
  ir::Value* px = g.add_placeholder("x", ir::TensorMeta::of(x));
  ir::Value* p1 = g.add_placeholder("w1", ir::TensorMeta::of(w1));
  ir::Value* p2 = g.add_placeholder("w2", ir::TensorMeta::of(w2));
  auto conv = [&](ir::Value* in, ir::Value* w) {
    return g
        .add_call("aten::convolution", {in, w, c10::IValue(), std::vector<int64_t>{1, 1}, std::vector<int64_t>{1, 1},
                                        std::vector<int64_t>{1, 1}, false, std::vector<int64_t>{0, 0}, int64_t{1}})
        ->result();
  };
  ir::Value* r = g.add_call("aten::relu", {conv(px, p1)})->result();
  ir::Value* y = conv(r, p2);
  g.set_output({y, g.add_call("aten::view", {y, std::vector<int64_t>{x.size(0), -1}})->result(),
                g.add_call("aten::slice.Tensor", {r, int64_t{2}, int64_t{1}, int64_t{15}, int64_t{1}})->result(),
                g.add_call("aten::permute", {y, std::vector<int64_t>{0, 2, 3, 1}})->result(),
                g.add_call("aten::sum", {y, c10::IValue()})->result(), r});
  g.signature().outputs.back().kind = ir::OutputKind::SavedValue;
  ir::propagate_meta(g);
  return g;
}

std::vector<at::Tensor> features_eager(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2) {
  const at::Tensor r = at::relu(at::conv2d(x, w1, {}, 1, 1));
  const at::Tensor y = at::conv2d(r, w2, {}, 1, 1);
  return {y, y.view({x.size(0), -1}), r.slice(2, 1, 15), y.permute({0, 2, 3, 1}), y.sum(), r};
}

}  // namespace

TEST_CASE("channels-last convolutions: every output but a saved value keeps eager's sizes, strides and offset",
          "[inductor]") {
  // Note [Eager's strides at the outputs], run on the CPU with the rewrite
  // forced: the features come back NCHW, their views view them as in eager
  // (the flattening view works), and only the saved value stays as the
  // rewrite left it (channels-last, which proves the rewrite ran).
  at::manual_seed(0);
  const at::Tensor x = at::randn({2, 3, 16, 16}), w1 = at::randn({8, 3, 3, 3}), w2 = at::randn({8, 8, 3, 3});
  inductor::InductorOptions forced = options();
  forced.force_layout_optimization = true;
  const std::vector<at::Tensor> got = run(inductor::compile_fx_inner(features(x, w1, w2), {}, forced), {x, w1, w2});
  const std::vector<at::Tensor> expected = features_eager(x, w1, w2);
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i + 1 < got.size(); ++i) {
    INFO("output " << i);
    REQUIRE_LIKE_EAGER(got[i], expected[i], 1e-5, 1e-4);
  }
  CHECK(got[1].is_alias_of(got[0]));
  CHECK(got[3].is_alias_of(got[0]));
  CHECK(got.back().is_contiguous(at::MemoryFormat::ChannelsLast));
  REQUIRE_CLOSE(got.back(), expected.back(), 1e-5, 1e-4);
}

TEST_CASE("channels-last convolutions on the GPU: outputs keep eager's layouts, with and without CUDA graphs",
          "[inductor][cuda]") {
  // The rewrite runs by itself on a GPU; a CUDA graph's replays return
  // copies of the outputs, which must keep their layouts and aliasing too
  // (Note [CUDA graphs]): warm-up, capture and a replay.
  CRUCIBLE_REQUIRE_CUDA();
  const crucible::testing::NoTf32Convolutions float32;
  at::manual_seed(0);
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  const at::Tensor x = at::randn({2, 3, 16, 16}, cuda), w1 = at::randn({8, 3, 3, 3}, cuda),
                   w2 = at::randn({8, 8, 3, 3}, cuda);
  const std::vector<at::Tensor> expected = features_eager(x, w1, w2);
  for (const bool cuda_graphs : {false, true}) {
    INFO((cuda_graphs ? "with CUDA graphs" : "without CUDA graphs"));
    inductor::InductorOptions o = options();
    o.cuda_graphs = cuda_graphs;
    const ir::CompiledFn fn = inductor::compile_fx_inner(features(x, w1, w2), {}, o);
    for (int call = 0; call < 3; ++call) {
      INFO("call " << call);
      const std::vector<at::Tensor> got = run(fn, {x, w1, w2});
      REQUIRE(got.size() == expected.size());
      for (size_t i = 0; i + 1 < got.size(); ++i) {
        INFO("output " << i);
        REQUIRE_LIKE_EAGER(got[i], expected[i], 1e-4, 1e-4);
      }
      CHECK(got[1].is_alias_of(got[0]));
      CHECK(got[3].is_alias_of(got[0]));
      CHECK(got.back().is_contiguous(at::MemoryFormat::ChannelsLast));
      REQUIRE_CLOSE(got.back(), expected.back(), 1e-4, 1e-4);
    }
  }
}

TEST_CASE("channels-last convolutions: a GPU graph's outputs are copied back to their layouts, its saved values not",
          "[inductor]") {
  // The same graph with CUDA metadata (no GPU needed): the features, and
  // the ReLU the slice views, are copied to NCHW for the outputs; the
  // saved value is not copied.
  const auto meta = at::TensorOptions().device(at::kMeta);
  ir::Graph g = features(at::empty({2, 3, 16, 16}, meta), at::empty({8, 3, 3, 3}, meta), at::empty({8, 8, 3, 3}, meta));
  crucible::testing::relabel_device(g, c10::Device(c10::kCUDA, 0));
  const std::string ir = inductor::loop_ir(g);
  INFO(ir);
  // Three copies to channels-last (x, w1, w2), two back (the features, the ReLU).
  CHECK(occurrences(ir, "_clone") == 5);
  CHECK(occurrences(ir, "Float[2, 8, 16, 16] stride=[2048, 1, 128, 8]") >= 1);
}

TEST_CASE("a large graph's CUDA code compiles as several NVRTC units, each kernel in one of them",
          "[inductor][nvrtc]") {
  // Note [Parallel NVRTC]: 60 pointwise kernels, kept apart by matmuls,
  // make more source than one unit holds. Compiled without a GPU.
  ir::Graph g;
  const at::Tensor x = at::randn({16, 16}), w = at::randn({16, 16});
  ir::Value* v = g.add_placeholder("x", ir::TensorMeta::of(x));
  ir::Value* pw = g.add_placeholder("w", ir::TensorMeta::of(w));
  for (int i = 0; i < 60; ++i) {
    ir::Value* scaled = g.add_call("aten::mul.Scalar", {v, c10::Scalar(1.0 + i)})->result();
    ir::Value* shifted = g.add_call("aten::tanh", {scaled})->result();
    v = g.add_call("aten::mm", {shifted, pw})->result();
  }
  g.set_output({v});
  ir::propagate_meta(g);
  crucible::testing::relabel_device(g, c10::Device(c10::kCUDA, 0));
  const std::string source = inductor::generate_code(g).source;
  std::vector<std::string> names;
  for (size_t at = source.find("__global__ void "); at != std::string::npos;
       at = source.find("__global__ void ", at + 1)) {
    const size_t start = source.find(") ", at) + 2;  // after __launch_bounds__(...)
    names.push_back(source.substr(start, source.find('(', start) - start));
  }
  REQUIRE(names.size() == 60);
  inductor::InductorOptions o;
  o.cache_dir = crucible::testing::temp_dir("crucible-nvrtc-units");
  const std::vector<std::string> cubins = inductor::compile_cuda(g, "sm_90", o);
  REQUIRE(cubins.size() >= 2);
  for (const std::string& cubin : cubins)
    REQUIRE(cubin.compare(0, 4,
                          "\x7f"
                          "ELF") == 0);
  for (const std::string& name : names) {  // the symbol table names it, NUL-terminated
    CAPTURE(name);
    const std::string symbol = name + std::string(1, '\0');
    CHECK(std::count_if(cubins.begin(), cubins.end(),
                        [&](const std::string& c) { return c.find(symbol) != std::string::npos; }) == 1);
  }
  // The same source splits the same way: the second compile is all cache hits.
  CHECK(inductor::compile_cuda(g, "sm_90", o) == cubins);
}

TEST_CASE("kernels equal up to their buffers are defined once and run on each one's buffers", "[inductor]") {
  // Note [Identical kernels]: the layers of a stack fuse into the same
  // kernel over other buffers. Layers 0-3 compute tanh(2v); layer 4 scales
  // by 3 and layer 5 squares v: other code, defined apart.
  const at::Tensor x = at::randn({16, 16}), w = at::randn({16, 16}) / 4;
  ir::Graph g;
  ir::Value* v = g.add_placeholder("x", ir::TensorMeta::of(x));
  ir::Value* pw = g.add_placeholder("w", ir::TensorMeta::of(w));
  at::Tensor expected = x;
  for (int i = 0; i < 6; ++i) {
    ir::Value* scaled = i == 5   ? g.add_call("aten::mul.Tensor", {v, v})->result()
                        : i == 4 ? g.add_call("aten::mul.Scalar", {v, c10::Scalar(3.0)})->result()
                                 : g.add_call("aten::mul.Scalar", {v, c10::Scalar(2.0)})->result();
    v = g.add_call("aten::mm", {g.add_call("aten::tanh", {scaled})->result(), pw})->result();
    expected = at::mm(at::tanh(i == 5 ? expected * expected : expected * (i == 4 ? 3.0 : 2.0)), w);
  }
  g.set_output({v});
  ir::propagate_meta(g);
  auto definitions = [](const std::string& source, const std::string& marker) {
    size_t n = 0;
    for (size_t at = source.find(marker); at != std::string::npos; at = source.find(marker, at + 1)) ++n;
    return n;
  };
  const std::string cpp = inductor::generate_code(g).source;
  INFO(cpp);
  CHECK(definitions(cpp, "void kernel_") == 3);  // kernel_0 (layers 0-3), layer 4's, layer 5's
  CHECK(definitions(cpp, "runs kernel_0's code") == 3);
  ir::CompiledFn fn = inductor::compile_fx_inner(g, {x, w}, options());
  // tanh is libm's in the kernel and Sleef's in eager, a few ulps apart,
  // carried through six matmuls of values below 1: well inside 1e-5.
  REQUIRE_CLOSE(run(fn, {x, w})[0], expected, 1e-5, 1e-6);

  ir::Graph on_gpu = g.clone();
  crucible::testing::relabel_device(on_gpu, c10::Device(c10::kCUDA, 0));
  const std::string cuda = inductor::generate_code(on_gpu).source;
  CHECK(definitions(cuda, "__global__") == 3);
  CHECK(definitions(cuda, "runs kernel_0's code") == 3);
}

TEST_CASE("a kernel's output takes the memory of a dead buffer of the same size", "[inductor]") {
  // Note [Buffer reuse]: tanh's output is read only by the next matmul, so
  // the next tanh, of the same size, writes into its memory; a buffer
  // still held by a view the graph returns is never taken.
  const at::Tensor x = at::randn({32, 32}), w = at::randn({32, 32}) / 8;
  ir::Graph g;
  ir::Value* v = g.add_placeholder("x", ir::TensorMeta::of(x));
  ir::Value* pw = g.add_placeholder("w", ir::TensorMeta::of(w));
  at::Tensor expected = x;
  ir::Value* kept = nullptr;
  for (int i = 0; i < 4; ++i) {
    ir::Value* t =
        g.add_call("aten::tanh", {g.add_call("aten::mul.Scalar", {v, c10::Scalar(1.0 + i)})->result()})->result();
    if (i == 1) kept = g.add_call("aten::t", {t})->result();  // an alias returned by the graph
    v = g.add_call("aten::mm", {t, pw})->result();
    expected = at::mm(at::tanh(expected * (1.0 + i)), w);
  }
  g.set_output({v, kept});
  ir::propagate_meta(g);
  const int64_t before = runtime::default_counters().get("inductor", "buffer_reuse");
  inductor::InductorOptions no_arenas = options();
  no_arenas.memory_planning = false;  // Note [Arena] would place these buffers instead
  ir::CompiledFn fn = inductor::compile_fx_inner(g, {x, w}, no_arenas);
  CHECK(runtime::default_counters().get("inductor", "buffer_reuse") - before >= 2);
  // tanh: libm's in the kernels, Sleef's in eager, a few ulps apart.
  for (int call = 0; call < 2; ++call) {
    std::vector<at::Tensor> got = run(fn, {x, w});
    REQUIRE_CLOSE(got[0], expected, 1e-5, 1e-6);
    at::Tensor t1 = at::tanh(at::mm(at::tanh(x), w) * 2.0);
    REQUIRE_CLOSE(got[1], t1.t(), 1e-5, 1e-6);
  }
}

TEST_CASE("estimated_ms: a step's roofline time, the longer of its bytes and its FLOPs", "[inductor]") {
  // Note [Roofline estimate], the CPU's figures (20 GB/s, 200 GFLOP/s):
  // tanh's kernel moves x and its result, 2 x 256 KiB, in 26.2 us; the
  // matmul moves 3 x 256 KiB but does 2 x 256^3 FLOPs, 167.8 us.
  const at::Tensor x = at::randn({256, 256}), w = at::randn({256, 256});
  ir::Graph g;
  ir::Value* px = g.add_placeholder("x", ir::TensorMeta::of(x));
  ir::Value* pw = g.add_placeholder("w", ir::TensorMeta::of(w));
  ir::Value* t = g.add_call("aten::tanh", {px})->result();
  g.set_output({g.add_call("aten::mm", {t, pw})->result()});
  ir::propagate_meta(g);
  const double bytes = 2.0 * 256 * 256 * 4, flops = 2.0 * 256 * 256 * 256;
  CHECK_THAT(inductor::estimated_ms(g, options()),
             Catch::Matchers::WithinRel((bytes / 2e10 + flops / 2e11) * 1e3, 1e-9));
}

TEST_CASE("buffers whose lives the plan sees lie in arenas, apart while both live", "[inductor][memory_plan]") {
  // Note [Arena]: the tanh outputs (generated kernels) and the matmul
  // results (written by mm.out) may lie in arenas; every tanh output lives
  // to the final sum, so a wrong offset would mix two of them there. The
  // graph also returns a view of one tanh output, which must stay out of
  // the arenas: it would be overwritten by the next call. On the test
  // device (CRUCIBLE_TEST_DEVICE=cuda: CUDA kernels, cuBLAS's mm.out).
  if (crucible::testing::compile_only()) CRUCIBLE_SKIP("CUDA asked for and no GPU here");
  const at::Device dev = crucible::testing::test_device();
  at::manual_seed(0);
  const at::Tensor x = at::randn({32, 48}, dev), w = at::randn({48, 48}, dev) / 8;
  ir::Graph g;
  ir::Value* v = g.add_placeholder("x", ir::TensorMeta::of(x));
  ir::Value* pw = g.add_placeholder("w", ir::TensorMeta::of(w));
  std::vector<ir::Value*> kept;
  at::Tensor t = x, expected = at::zeros({32, 48}, dev);
  ir::Value* view = nullptr;
  for (int i = 0; i < 6; ++i) {
    if (i > 0) v = g.add_call("aten::mm", {v, pw})->result();
    const double scale = 1.0 + 0.2 * i;
    v = g.add_call("aten::tanh", {g.add_call("aten::mul.Scalar", {v, c10::Scalar(scale)})->result()})->result();
    kept.push_back(v);
    t = at::tanh((i > 0 ? at::mm(t, w) : t) * scale);
    expected = expected + t * static_cast<double>(i + 1);
    if (i == 2) view = g.add_call("aten::t", {v})->result();
  }
  ir::Value* sum = nullptr;
  for (size_t i = 0; i < kept.size(); ++i) {
    ir::Value* term = g.add_call("aten::mul.Scalar", {kept[i], c10::Scalar(static_cast<double>(i + 1))})->result();
    sum = sum ? g.add_call("aten::add.Tensor", {sum, term, c10::Scalar(1)})->result() : term;
  }
  g.set_output({sum, view});
  ir::propagate_meta(g);
  const at::Tensor third = at::tanh(at::mm(at::tanh(at::mm(at::tanh(x), w) * 1.2), w) * 1.4);

  inductor::InductorOptions on = options();
  on.memory_planning = true;  // the default on the CPU, not on a GPU
  const runtime::PlannedMemory planned = inductor::plan_memory(g, on);
  inductor::InductorOptions off = options();
  off.memory_planning = false;
  const runtime::PlannedMemory unplanned = inductor::plan_memory(g, off);
  INFO("peak " << planned.peak_bytes << " bytes with " << planned.in_arena << " buffers in " << planned.arenas
               << " arenas, " << unplanned.peak_bytes << " without");
  CHECK(planned.arenas >= 1);
  CHECK(planned.in_arena >= 4);
  CHECK(planned.arena_bytes > 0);
  CHECK(unplanned.arenas == 0);
  CHECK(planned.peak_bytes <= unplanned.peak_bytes);

  const int64_t before = runtime::default_counters().get("inductor", "arena_buffers");
  ir::CompiledFn fn = inductor::compile_fx_inner(g, {x, w}, on);
  CHECK(runtime::default_counters().get("inductor", "arena_buffers") - before ==
        static_cast<int64_t>(planned.in_arena));
  // tanh: libm's (or CUDA's) in the kernels, Sleef's in eager, a few ulps
  // apart, through five matmuls of values below 1 (TF32 is off) and a sum
  // of six terms weighted up to 6. Without arenas the same kernels run in
  // the same order on other memory: the same bits.
  const std::vector<at::Tensor> first = run(fn, {x, w});
  const std::vector<at::Tensor> second = run(fn, {x, w});  // the same arenas' offsets again
  const std::vector<at::Tensor> apart = run(inductor::compile_fx_inner(g, {x, w}, off), {x, w});
  for (const std::vector<at::Tensor>* got : {&first, &second}) {
    REQUIRE_CLOSE((*got)[0], expected, 1e-5, 1e-5);
    REQUIRE_CLOSE((*got)[1], third.t(), 1e-5, 1e-6);
    CHECK(at::equal((*got)[0], apart[0]));
    CHECK(at::equal((*got)[1], apart[1]));
  }
  if (!dev.is_cuda()) return;
  // Captured as a CUDA graph: the warm-up, the capture and a replay each
  // allocate or reuse the arenas in the graph's pool, and compute what the
  // plain call did, bit for bit (same kernels, same order).
  on.cuda_graphs = true;
  ir::CompiledFn graphed = inductor::compile_fx_inner(g, {x, w}, on);
  std::vector<std::vector<at::Tensor>> calls;
  for (int call = 0; call < 3; ++call) calls.push_back(run(graphed, {x, w}));
  for (const std::vector<at::Tensor>& got : calls) {
    CHECK(at::equal(got[0], first[0]));
    CHECK(at::equal(got[1], first[1]));
  }
}

namespace {

// softmax(x) over the last dim, decomposed as the core table traces it.
ir::Value* softmax_rows(ir::Graph& g, ir::Value* x) {
  const std::vector<int64_t> last{-1};
  ir::Value* m = g.add_call("aten::amax", {x, last, true})->result();
  ir::Value* e = g.add_call("aten::exp", {g.add_call("aten::sub.Tensor", {x, m, c10::Scalar(1)})->result()})->result();
  ir::Value* s = g.add_call("aten::sum.dim_IntList", {e, last, true, c10::IValue()})->result();
  return g.add_call("aten::div.Tensor", {e, s})->result();
}

// softmax(softmax(x) @ w): two row kernels of the same text over other buffers.
ir::Graph two_softmaxes(const at::Tensor& x, const at::Tensor& w) {
  ir::Graph g;
  ir::Value* px = g.add_placeholder("x", ir::TensorMeta::of(x));
  ir::Value* pw = g.add_placeholder("w", ir::TensorMeta::of(w));
  ir::Value* y = g.add_call("aten::mm", {softmax_rows(g, px), pw})->result();
  g.set_output({softmax_rows(g, y)});
  ir::propagate_meta(g);
  return g;
}

}  // namespace

TEST_CASE("a CUDA row kernel is rendered in two block sizes, shared by identical rows; one writing in place in one",
          "[inductor][nvrtc]") {
  // Note [Autotuning]: rows of 1000 take 128 threads (row_block), and 256 in
  // the variant. Compiled without a GPU.
  ir::Graph g = two_softmaxes(at::randn({16, 1000}), at::randn({1000, 1000}));
  crucible::testing::relabel_device(g, c10::Device(c10::kCUDA, 0));
  const std::string source = inductor::generate_code(g).source;
  INFO(source);
  CHECK(occurrences(source, "__global__") == 2);
  CHECK(occurrences(source, "__launch_bounds__(128) kernel_0(") == 1);
  CHECK(occurrences(source, "__launch_bounds__(256) kernel_0_b256(") == 1);
  CHECK(occurrences(source, "runs kernel_0's code") == 1);
  inductor::InductorOptions o = options();
  const std::vector<std::string> cubins = inductor::compile_cuda(g, "sm_90", o);
  for (const char* name : {"kernel_0", "kernel_0_b256"}) {
    CAPTURE(name);
    const std::string symbol = std::string(name) + std::string(1, '\0');
    CHECK(std::count_if(cubins.begin(), cubins.end(),
                        [&](const std::string& c) { return c.find(symbol) != std::string::npos; }) == 1);
  }
  // The softmax written back into its input (an optimizer's in-place
  // update, in shape): run twice, the second run would read the first's
  // output, so the kernel has one configuration.
  ir::Graph in_place;
  const at::Tensor x = at::randn({16, 1000});
  ir::Value* px = in_place.add_placeholder("x", ir::TensorMeta::of(x));
  ir::Value* y = softmax_rows(in_place, px);
  ir::Value* total =
      in_place.add_call("aten::sum.dim_IntList", {y, std::vector<int64_t>{-1}, false, c10::IValue()})->result();
  in_place.add_call("aten::copy_", {px, y, false});
  in_place.set_output({total});
  ir::propagate_meta(in_place);
  crucible::testing::relabel_device(in_place, c10::Device(c10::kCUDA, 0));
  const std::string written = inductor::generate_code(in_place).source;
  INFO(written);
  REQUIRE(occurrences(written, "__global__") == 1);  // the write-back fused into the rows
  CHECK(occurrences(written, "(aten::copy_)") == 1);
}

TEST_CASE("autotuning: row kernels are timed at their first call, the choice is stored, a new compile reads it",
          "[inductor][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  // Note [Autotuning]. A cache directory of its own: no earlier choice.
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  const at::Tensor x = 3 * at::randn({512, 1000}, cuda), w = at::randn({1000, 1000}, cuda) / 32;
  const ir::Graph g = two_softmaxes(x, w);
  inductor::InductorOptions o;
  o.cache_dir = crucible::testing::temp_dir("crucible-autotune");
  runtime::Counters& counters = runtime::default_counters();
  const int64_t tuned = counters.get("inductor", "autotuned"), hits = counters.get("inductor", "autotune_cache_hit");
  const ir::CompiledFn first = inductor::compile_fx_inner(g, {}, o);
  const at::Tensor a = run(first, {x, w})[0];
  // The two softmaxes run one kernel's code: timed once.
  CHECK(counters.get("inductor", "autotuned") - tuned == 1);
  const at::Tensor again = run(first, {x, w})[0];
  CHECK(counters.get("inductor", "autotuned") - tuned == 1);
  // A softmax row sums 1000 positive terms in another order than ATen's:
  // within 1e-5 relative (a few ulps of f32 per term, well inside); the
  // matmul between them is cuBLAS's on both sides.
  const at::Tensor want = at::softmax(at::mm(at::softmax(x, -1), w), -1);
  REQUIRE_CLOSE(a, want, 1e-5, 1e-7);
  // Every later call runs the chosen configuration, which the first call ran last.
  REQUIRE_EQUAL_TENSORS(again, a);
  // A new compile (a new plan, as a new process makes) reads the choice.
  const ir::CompiledFn second = inductor::compile_fx_inner(g, {}, o);
  REQUIRE_EQUAL_TENSORS(run(second, {x, w})[0], a);
  CHECK(counters.get("inductor", "autotuned") - tuned == 1);
  CHECK(counters.get("inductor", "autotune_cache_hit") - hits == 1);
}

TEST_CASE("horizontal fusion: a loop joins an earlier group it shares a read with, unless what lies between forbids",
          "[inductor]") {
  // Note [Horizontal fusion]: tanh(x) feeds a matmul, which closes its
  // group; sigmoid(x) comes after the matmul and does not read it, so it
  // joins tanh's kernel and x is read once. sigmoid of the matmul's result
  // cannot move before the matmul; nor can anything move back across a
  // mutating extern kernel.
  const at::Tensor x = at::randn({16, 16}), w = at::randn({16, 16}) / 4;
  auto graph = [&](bool reads_product, bool mutation_between) {
    ir::Graph g;
    ir::Value* px = g.add_placeholder("x", ir::TensorMeta::of(x));
    ir::Value* pw = g.add_placeholder("w", ir::TensorMeta::of(w));
    ir::Value* y = g.add_call("aten::mm", {g.add_call("aten::tanh", {px})->result(), pw})->result();
    if (mutation_between) g.add_call("aten::copy_", {pw, y, false});
    ir::Value* s = g.add_call("aten::sigmoid", {reads_product ? y : px})->result();
    g.set_output({y, s});
    ir::propagate_meta(g);
    return g;
  };
  auto kernels = [](const ir::Graph& g) { return occurrences(inductor::generate_code(g).source, "void kernel_"); };
  CHECK(kernels(graph(false, false)) == 1);
  CHECK(kernels(graph(true, false)) == 2);
  CHECK(kernels(graph(false, true)) == 2);
  // Values: the fused kernel's, against eager (tanh and sigmoid a few ulps
  // apart from Sleef's; the matmul is ATen's on both sides).
  for (bool reads_product : {false, true}) {
    CAPTURE(reads_product);
    const ir::CompiledFn fn = inductor::compile_fx_inner(graph(reads_product, false), {x, w}, options());
    const std::vector<at::Tensor> got = run(fn, {x, w});
    const at::Tensor y = at::mm(at::tanh(x), w);
    REQUIRE_CLOSE(got[0], y, 1e-5, 1e-6);
    REQUIRE_CLOSE(got[1], at::sigmoid(reads_product ? y : x), 1e-5, 1e-6);
  }
  // Across the mutation: w written with the product after the matmul read it.
  at::Tensor w2 = w.clone();
  const std::vector<at::Tensor> got = run(inductor::compile_fx_inner(graph(false, true), {x, w2}, options()), {x, w2});
  REQUIRE_CLOSE(w2, at::mm(at::tanh(x), w), 1e-5, 1e-6);
  REQUIRE_CLOSE(got[1], at::sigmoid(x), 1e-5, 1e-6);
}

TEST_CASE("on a GPU, independent loops stay apart unless they share an operand larger than a scalar", "[inductor]") {
  // Note [Independent loops on a GPU]: tanh(a)·s and tanh(b)·s read a shared
  // scalar only; sigmoid(a) shares a with the first. On the CPU the three
  // make one kernel; on a GPU the second is a part of its own in a
  // combined launch, and the graph's values are the same.
  const at::Tensor a = at::randn({1000}), b = at::randn({1000}), s = at::randn({});
  ir::Graph g;
  ir::Value* pa = g.add_placeholder("a", ir::TensorMeta::of(a));
  ir::Value* pb = g.add_placeholder("b", ir::TensorMeta::of(b));
  ir::Value* ps = g.add_placeholder("s", ir::TensorMeta::of(s));
  ir::Value* first = g.add_call("aten::mul.Tensor", {g.add_call("aten::tanh", {pa})->result(), ps})->result();
  ir::Value* second = g.add_call("aten::mul.Tensor", {g.add_call("aten::tanh", {pb})->result(), ps})->result();
  ir::Value* third = g.add_call("aten::sigmoid", {pa})->result();
  g.set_output({first, second, third});
  ir::propagate_meta(g);
  const std::string cpp = inductor::generate_code(g).source;
  INFO(cpp);
  CHECK(occurrences(cpp, "void kernel_") == 1);

  ir::Graph on_gpu = g.clone();
  crucible::testing::relabel_device(on_gpu, c10::Device(c10::kCUDA, 0));
  const std::string cuda = inductor::generate_code(on_gpu).source;
  INFO(cuda);
  CHECK(occurrences(cuda, "__global__") == 1);
  CHECK(occurrences(cuda, "_part0(") == 2);  // defined and called
  CHECK(occurrences(cuda, "_part1(") == 2);
  CHECK(occurrences(cuda, "_part2(") == 0);
  // The part with sigmoid reads a once, as the CPU kernel does.
  CHECK(occurrences(cuda, "(aten::sigmoid)") == 1);

  const std::vector<at::Tensor> expected = {at::tanh(a) * s, at::tanh(b) * s, at::sigmoid(a)};
  for (bool gpu : {false, true}) {
    if (gpu && (!crucible::testing::test_device().is_cuda() || crucible::testing::compile_only())) continue;
    CAPTURE(gpu);
    const c10::Device d = gpu ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
    const std::vector<at::Tensor> in = {a.to(d), b.to(d), s.to(d)};
    const std::vector<at::Tensor> got = run(inductor::compile_fx_inner(gpu ? on_gpu : g, in, options()), in);
    // tanh and sigmoid a few ulps from ATen's.
    for (size_t i = 0; i < expected.size(); ++i) REQUIRE_CLOSE(got[i].cpu(), expected[i], 1e-5, 1e-6);
  }
}
