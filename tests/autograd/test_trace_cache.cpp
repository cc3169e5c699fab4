// The trace cache across processes (Note [AOT trace cache] in
// autograd/src/trace_cache.h): a compilation that finds the graph an earlier
// one traced skips the trace and still computes what eager computes (input
// mutation, aliased outputs, duplicated and aliased written inputs, random
// ops, tensors read from outside the function); entries that are corrupt, of
// another function, or of unknown compilers are never served. A new process
// is stood in for by new callables with no in-memory graph cache (the CLI
// test runs two processes).
#include <crucible/autograd/aot_function.h>
#include <crucible/autograd/aot_module.h>
#include <crucible/ir/instrument.h>
#include <crucible/ir/interpreter.h>
#include <crucible/runtime/instruments.h>
#include <crucible/tracer/make_fx.h>

#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>

#include "catch.h"
#include "testing.h"

#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <fstream>

using crucible::testing::kGradAtol;
using crucible::testing::kGradRtol;
using namespace crucible;
using Tensors = std::vector<at::Tensor>;
namespace fs = std::filesystem;

namespace {

int64_t counted(std::string_view key) { return runtime::default_counters().get("aot_autograd", key); }

// A function that counts its calls: 3 per compilation (the fingerprint on
// fake tensors, the metadata analysis, the trace), 1 when the fingerprint
// stands for the analysis and the trace comes from the cache (Note [Fake
// fingerprints]), 2 when only the trace does.
struct Counted {
  std::shared_ptr<std::atomic<int>> calls = std::make_shared<std::atomic<int>>(0);
  tracer::TensorFn fn;
  Tensors operator()(const Tensors& in) const {
    ++*calls;
    return fn(in);
  }
};

// A process's worth of compilation state: no graph shared in memory, the
// disk cache in `dir`. Real-mode traces, which Note [Fake fingerprints]
// serves (TraceMode::Auto needs no fingerprint: its own test below).
autograd::AotConfig config(const std::string& dir, std::string key = "interpreter;trace-cache-test",
                           tracer::TraceMode mode = tracer::TraceMode::Real) {
  autograd::AotConfig c;
  c.trace_mode = mode;
  c.cache = nullptr;
  c.compiler_key = std::move(key);
  c.disk_cache_dir = dir;
  return c;
}

std::vector<fs::path> entries(const std::string& dir) {
  std::vector<fs::path> r;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().starts_with("a")) r.push_back(e.path());
  return r;
}

// Writes into its first input and returns a view of its second and a new
// tensor: the wrappers' epilogues must still run on a hit.
Tensors mutating(const Tensors& in) {
  in[0].mul_(2);
  return {in[1].view({-1}), at::tanh(in[0] + in[1]).sum(0)};
}

Tensors layer(const Tensors& in) { return {at::tanh(at::addmm(in[2], in[0], in[1].t())).sum(1)}; }
Tensors other_layer(const Tensors& in) { return {at::sigmoid(at::addmm(in[2], in[0], in[1].t())).sum(1)}; }

Tensors layer_data() { return {at::randn({4, 3}), at::randn({5, 3}), at::randn({5})}; }

Tensors clones(const Tensors& ts, bool requires_grad = false) {
  Tensors r;
  for (const at::Tensor& t : ts) r.push_back(t.detach().clone().requires_grad_(requires_grad));
  return r;
}

}  // namespace

TEST_CASE("trace cache: a new compilation skips the trace; input mutation and aliased outputs as eager",
          "[autograd][cache]") {
  at::manual_seed(0);
  const std::string dir = testing::temp_dir("trace-cache");
  const Tensors data = {at::randn({3, 4}), at::randn({3, 4})};
  const int64_t hits = counted("trace_cache_hit"), misses = counted("trace_cache_miss");
  Tensors eager_in = clones(data);
  const Tensors eager_out = mutating(eager_in);
  for (int process = 0; process < 2; ++process) {
    const Counted f{.fn = mutating};
    const autograd::AotFunction compiled = autograd::aot_function(f, config(dir));
    Tensors in = clones(data);
    const Tensors out = compiled(in);
    CHECK(*f.calls == (process == 0 ? 3 : 1));
    REQUIRE_EQUAL_TENSORS(in[0], eager_in[0]);  // the write reached the caller's tensor
    REQUIRE_EQUAL_TENSORS(out[0], eager_out[0]);
    REQUIRE_EQUAL_TENSORS(out[1], eager_out[1]);
    CHECK(out[0].data_ptr() == in[1].data_ptr());  // still a view of the input, as eager's
  }
  CHECK(counted("trace_cache_miss") == misses + 1);
  CHECK(counted("trace_cache_hit") == hits + 1);
  CHECK(entries(dir).size() == 1);
}

// Real mode: 3 calls a compilation (the fingerprint, the analysis, the
// trace), 1 on a hit (the fingerprint). TraceMode::Auto (the default): 2,
// both on fake tensors (the analysis, the trace), and 1 on a hit (the
// analysis), with no fingerprint taken.
TEST_CASE("trace cache: the joint graph of a hit gives eager's values and gradients, in real and in Auto mode",
          "[autograd][cache]") {
  at::manual_seed(1);
  const Tensors data = layer_data();
  Tensors e_in = clones(data, true);
  const Tensors e_out = layer(e_in);
  e_out[0].sum().backward();
  for (const tracer::TraceMode mode : {tracer::TraceMode::Real, tracer::TraceMode::Auto}) {
    const bool real = mode == tracer::TraceMode::Real;
    INFO((real ? "real mode" : "auto mode"));
    const std::string dir = testing::temp_dir("trace-cache");
    const int64_t hits = counted("trace_cache_hit"), fingerprints = counted("fingerprint_miss");
    for (int process = 0; process < 2; ++process) {
      auto on_meta = std::make_shared<std::atomic<int>>(0);
      const Counted f{.fn = [on_meta](const Tensors& in) {
        *on_meta += crucible::tracer::is_fake(in[0]) ? 1 : 0;
        return layer(in);
      }};
      const autograd::AotFunction compiled =
          autograd::aot_function(f, config(dir, "interpreter;trace-cache-test", mode));
      Tensors in = clones(data, true);
      const Tensors out = compiled(in);
      CHECK(*f.calls == (process == 0 ? (real ? 3 : 2) : 1));
      if (!real) CHECK(*on_meta == *f.calls);
      REQUIRE_CLOSE(out[0].detach(), e_out[0].detach(), kGradRtol, kGradAtol);
      out[0].sum().backward();
      for (size_t i = 0; i < in.size(); ++i) REQUIRE_CLOSE(in[i].grad(), e_in[i].grad(), kGradRtol, kGradAtol);
    }
    CHECK(counted("trace_cache_hit") == hits + 1);
    CHECK(counted("fingerprint_miss") == fingerprints + (real ? 1 : 0));
  }
}

TEST_CASE("trace cache: another function over the same inputs, or other input metadata, misses", "[autograd][cache]") {
  at::manual_seed(2);
  const std::string dir = testing::temp_dir("trace-cache");
  const Tensors data = layer_data();
  const int64_t hits = counted("trace_cache_hit");
  REQUIRE_EQUAL_TENSORS(autograd::aot_function(layer, config(dir))(data)[0], layer(data)[0]);
  REQUIRE_EQUAL_TENSORS(autograd::aot_function(other_layer, config(dir))(data)[0], other_layer(data)[0]);
  const Tensors wider = {at::randn({6, 3}), at::randn({5, 3}), at::randn({5})};
  REQUIRE_EQUAL_TENSORS(autograd::aot_function(layer, config(dir))(wider)[0], layer(wider)[0]);
  CHECK(counted("trace_cache_hit") == hits);
  CHECK(entries(dir).size() == 3);
}

TEST_CASE("trace cache: a corrupt or truncated entry is traced again and rewritten", "[autograd][cache]") {
  at::manual_seed(3);
  const std::string dir = testing::temp_dir("trace-cache");
  const Tensors data = layer_data();
  REQUIRE_EQUAL_TENSORS(autograd::aot_function(layer, config(dir))(data)[0], layer(data)[0]);
  REQUIRE(entries(dir).size() == 1);
  const fs::path entry = entries(dir)[0];
  const auto size = fs::file_size(entry);
  // One character of the graph changed (tanh -> tanx): the digest no longer matches.
  std::string text;
  {
    std::ifstream f(entry, std::ios::binary);
    text.assign(std::istreambuf_iterator<char>(f), {});
  }
  const size_t at = text.find("tanh");
  REQUIRE(at != std::string::npos);
  for (const std::string& broken : {text.substr(0, at) + "tanx" + text.substr(at + 4), text.substr(0, size / 2)}) {
    std::ofstream(entry, std::ios::binary | std::ios::trunc) << broken;
    const int64_t misses = counted("trace_cache_miss");
    const Counted f{.fn = layer};
    REQUIRE_EQUAL_TENSORS(autograd::aot_function(f, config(dir))(data)[0], layer(data)[0]);
    CHECK(*f.calls == 2);  // the fingerprint hits, the trace does not
    CHECK(counted("trace_cache_miss") == misses + 1);
    // Rewritten whole: the next compilation hits it.
    const Counted g{.fn = layer};
    REQUIRE_EQUAL_TENSORS(autograd::aot_function(g, config(dir))(data)[0], layer(data)[0]);
    CHECK(*g.calls == 1);
  }
}

TEST_CASE("trace cache: nothing is kept without a directory or a compiler key; an unsafe directory is skipped",
          "[autograd][cache]") {
  at::manual_seed(4);
  const std::string dir = testing::temp_dir("trace-cache");
  const Tensors data = layer_data();
  autograd::AotConfig no_dir = config(dir);
  no_dir.disk_cache_dir.reset();
  REQUIRE_EQUAL_TENSORS(autograd::aot_function(layer, no_dir)(data)[0], layer(data)[0]);
  REQUIRE_EQUAL_TENSORS(autograd::aot_function(layer, config(dir, ""))(data)[0], layer(data)[0]);
  CHECK(entries(dir).empty());
  // Others may write it: another user could plant graphs, so it is not used.
  const std::string shared = dir + "/shared";
  fs::create_directory(shared);
  ::chmod(shared.c_str(), 0777);
  const int64_t bypasses = counted("trace_cache_bypass");
  REQUIRE_EQUAL_TENSORS(autograd::aot_function(layer, config(shared))(data)[0], layer(data)[0]);
  CHECK(entries(shared).empty());
  CHECK(counted("trace_cache_bypass") == bypasses + 1);
}

TEST_CASE("trace cache: instruments see the trace stage of a hit as cached, with its graph", "[autograd][cache]") {
  struct Stages : ir::Instrument {
    std::vector<std::string> seen;
    void after_stage(const ir::StageEvent& e) override {
      if (e.stage == "trace_inference")
        seen.push_back(std::string(e.cached ? "cached " : "traced ") + std::to_string(e.graphs.size()));
    }
  };
  at::manual_seed(5);
  const std::string dir = testing::temp_dir("trace-cache");
  const Tensors data = layer_data();
  auto stages = std::make_shared<Stages>();
  for (int process = 0; process < 2; ++process) {
    autograd::AotConfig c = config(dir);
    c.instruments = {stages};
    REQUIRE_EQUAL_TENSORS(autograd::aot_function(layer, c)(data)[0], layer(data)[0]);
  }
  CHECK(stages->seen == std::vector<std::string>{"traced 1", "cached 1"});
}

TEST_CASE("trace cache: duplicated inputs, aliased inputs that are written, and dropout, on a hit as eager",
          "[autograd][cache]") {
  const std::string dir = testing::temp_dir("trace-cache");
  // f(x, x) writing one of them (the dedupe wrapper), two views of one
  // storage, one written (a synthetic base), and dropout, drawing from the
  // default generator or from Philox: each compiled twice on one directory,
  // the second a hit, and each against eager from the same state (Philox's
  // draws are not eager's: its forward and backward must keep one mask).
  auto duplicated = [](const Tensors& in) {
    in[0].mul_(2);
    return Tensors{in[0] + in[1]};
  };
  auto aliased = [](const Tensors& in) {
    in[0].mul_(2);
    return Tensors{(in[1] * in[1]).sum()};
  };
  auto dropout = [](const Tensors& in) { return Tensors{(at::dropout(in[0], 0.5, /*train=*/true) * in[1]).sum()}; };
  at::manual_seed(6);
  const at::Tensor a = at::randn({4}), base = at::randn({3, 4}), x = at::randn({64}), w = at::randn({64});
  const int64_t hits = counted("trace_cache_hit");
  for (int process = 0; process < 2; ++process) {
    INFO("process " << process);
    {
      const Counted f{.fn = duplicated};
      const autograd::AotFunction compiled = autograd::aot_function(f, config(dir));
      const at::Tensor ca = a.clone().requires_grad_(), ea = a.clone().requires_grad_();
      const at::Tensor cx = ca * 1.0, ex = ea * 1.0;
      const at::Tensor c = compiled({cx, cx})[0], e = duplicated({ex, ex})[0];
      REQUIRE_EQUAL_TENSORS(c.detach(), e.detach());
      REQUIRE_EQUAL_TENSORS(cx.detach(), ex.detach());
      (c.sum() + cx.sum()).backward();
      (e.sum() + ex.sum()).backward();
      REQUIRE_CLOSE(ca.grad(), ea.grad(), kGradRtol, kGradAtol);
    }
    {
      const autograd::AotFunction compiled = autograd::aot_function(aliased, config(dir));
      const at::Tensor cleaf = base.clone().requires_grad_(), eleaf = base.clone().requires_grad_();
      const at::Tensor cb = cleaf * 1.0, eb = eleaf * 1.0;
      const at::Tensor c = compiled({cb.slice(0, 0, 2), cb.view({12})})[0];
      const at::Tensor e = aliased({eb.slice(0, 0, 2), eb.view({12})})[0];
      REQUIRE_EQUAL_TENSORS(c.detach(), e.detach());
      REQUIRE_EQUAL_TENSORS(cb.detach(), eb.detach());
      c.backward();
      e.backward();
      REQUIRE_CLOSE(cleaf.grad(), eleaf.grad(), kGradRtol, kGradAtol);
    }
    for (const bool philox : {false, true}) {  // the default generator, or Philox draws (its own wrapper)
      autograd::AotConfig c_config = config(dir);
      c_config.functionalize_rng_ops = philox;
      const autograd::AotFunction compiled = autograd::aot_function(dropout, c_config);
      const at::Tensor cx = x.clone().requires_grad_(), ex = x.clone().requires_grad_();
      const at::Tensor cw = w.clone().requires_grad_(), ew = w.clone().requires_grad_();
      at::manual_seed(100);
      const at::Tensor e = dropout({ex, ew})[0];
      at::manual_seed(100);
      const at::Tensor c = compiled({cx, cw})[0];
      c.backward();
      e.backward();
      if (!philox) {  // eager's own draws
        REQUIRE_EQUAL_TENSORS(c.detach(), e.detach());
        REQUIRE_EQUAL_TENSORS(cx.grad(), ex.grad());
        REQUIRE_EQUAL_TENSORS(cw.grad(), ew.grad());
      } else {  // Philox's draws: forward and backward agree on the mask
        const at::Tensor kept = cx.grad() != 0;
        REQUIRE_CLOSE(c.detach(), (x * w * kept).sum() * 2, 1e-5, 1e-5);
        REQUIRE_CLOSE(cw.grad(), x * kept * 2, 1e-6, 1e-6);
      }
    }
  }
  CHECK(counted("trace_cache_hit") == hits + 4);
}

TEST_CASE("trace cache: tensors read from outside the function are read afresh on a hit", "[autograd][cache]") {
  // Note [Lifting in AOTAutograd]: the captured weight and bias are lifted
  // to inputs; a hit's graph takes them as such, so the compiled call sees
  // their values of the moment and fills the weight's .grad, as an eager
  // twin reading its own copies does.
  at::manual_seed(7);
  const std::string dir = testing::temp_dir("trace-cache");
  at::Tensor w = at::randn({4, 3}).requires_grad_(), b = at::randn({3});
  at::Tensor twin_w = w.detach().clone().requires_grad_(), twin_b = b.clone();
  auto reading = [](const at::Tensor& weight, const at::Tensor& bias) {
    return [&weight, &bias](const Tensors& in) { return Tensors{at::tanh(at::matmul(in[0], weight) + bias).sum()}; };
  };
  const at::Tensor x = at::randn({5, 4});
  const int64_t hits = counted("trace_cache_hit"), fingerprints = counted("fingerprint_hit");
  for (int process = 0; process < 2; ++process) {
    const autograd::AotFunction compiled = autograd::aot_function(reading(w, b), config(dir));
    const at::Tensor got = compiled({x})[0], expected = reading(twin_w, twin_b)({x})[0];
    got.backward();
    expected.backward();
    REQUIRE_EQUAL_TENSORS(got.detach(), expected.detach());
    REQUIRE_CLOSE(w.grad(), twin_w.grad(), kGradRtol, kGradAtol);
    at::NoGradGuard no_grad;  // an SGD step on both before the hit, which must see it
    for (at::Tensor* p : {&w, &twin_w}) {
      p->sub_(p->grad() * 0.1);
      p->mutable_grad().reset();
    }
    b.mul_(0.5);
    twin_b.mul_(0.5);
  }
  CHECK(counted("trace_cache_hit") == hits + 1);
  // Both analyses stood for by fingerprints: the one that finds the tensors, the one after lifting them.
  CHECK(counted("fingerprint_hit") == fingerprints + 2);
}

TEST_CASE("trace cache: a fake-mode fingerprint stands for the real analysis, and the real trace is served",
          "[autograd][cache]") {
  // The function takes another path on fake tensors: the fingerprint is of
  // the tanh path, the graph a hit serves is the real trace's (sigmoid),
  // with eager's values and gradients.
  auto two_paths = [](const Tensors& in) {
    return Tensors{(crucible::tracer::is_fake(in[0]) ? at::tanh(in[0]) : at::sigmoid(in[0])).sum(0)};
  };
  at::manual_seed(8);
  const std::string dir = testing::temp_dir("trace-cache");
  const at::Tensor x = at::randn({4, 3});
  const at::Tensor ex = x.clone().requires_grad_();
  const at::Tensor e = two_paths({ex})[0];
  e.sum().backward();
  const int64_t hits = counted("fingerprint_hit"), misses = counted("fingerprint_miss");
  for (int process = 0; process < 2; ++process) {
    const Counted f{.fn = two_paths};
    const autograd::AotFunction compiled = autograd::aot_function(f, config(dir));
    const at::Tensor cx = x.clone().requires_grad_();
    const at::Tensor c = compiled({cx})[0];
    CHECK(*f.calls == (process == 0 ? 3 : 1));
    REQUIRE_EQUAL_TENSORS(c.detach(), e.detach());
    c.sum().backward();
    REQUIRE_CLOSE(cx.grad(), ex.grad(), kGradRtol, kGradAtol);
  }
  CHECK(counted("fingerprint_miss") == misses + 1);
  CHECK(counted("fingerprint_hit") == hits + 1);
}

TEST_CASE("trace cache: no fingerprint where fake and real analyses disagree, fail, or the device switches change",
          "[autograd][cache]") {
  at::manual_seed(9);
  const std::string dir = testing::temp_dir("trace-cache");
  const at::Tensor x = at::randn({4, 3});
  // On fake tensors the output aliases the input; on real ones it does not:
  // a hit would return the wrong metadata, so nothing is stored.
  auto aliasing_on_fake = [](const Tensors& in) {
    return Tensors{crucible::tracer::is_fake(in[0]) ? in[0].view({-1}) : (in[0] * 2).view({-1})};
  };
  // Fails on fake tensors: analysed for real every time.
  auto refusing_fake = [](const Tensors& in) {
    if (crucible::tracer::is_fake(in[0])) throw std::runtime_error("no fake tensors here");
    return Tensors{at::tanh(in[0])};
  };
  const int64_t differs = counted("fingerprint_differs"), bypasses = counted("fingerprint_bypass");
  for (int process = 0; process < 2; ++process) {
    const Counted f{.fn = aliasing_on_fake};
    const at::Tensor out = autograd::aot_function(f, config(dir))({x})[0];
    REQUIRE_EQUAL_TENSORS(out, (x * 2).view({-1}));
    CHECK_FALSE(out.is_alias_of(x));
    CHECK(*f.calls == (process == 0 ? 3 : 2));  // the analysis runs again; the trace hits
    const Counted g{.fn = refusing_fake};
    REQUIRE_EQUAL_TENSORS(autograd::aot_function(g, config(dir))({x})[0], at::tanh(x));
  }
  CHECK(counted("fingerprint_differs") == differs + 2);
  CHECK(counted("fingerprint_bypass") == bypasses + 2);
  // A switch by which ATen routes composite ops to a device's kernel is in
  // the key: a trace under another setting is not stood for.
  const Tensors data = layer_data();
  REQUIRE_EQUAL_TENSORS(autograd::aot_function(layer, config(dir))(data)[0], layer(data)[0]);  // stored
  at::Context& ctx = at::globalContext();
  const bool mkldnn = ctx.userEnabledMkldnn();
  const int64_t misses = counted("fingerprint_miss");
  ctx.setUserEnabledMkldnn(!mkldnn);
  const Tensors out = autograd::aot_function(layer, config(dir))(data);
  ctx.setUserEnabledMkldnn(mkldnn);
  REQUIRE_EQUAL_TENSORS(out[0], layer(data)[0]);
  CHECK(counted("fingerprint_miss") == misses + 1);
}

TEST_CASE("trace cache: a module's buffers are updated on a hit as eager updates them", "[autograd][cache]") {
  // aot_module over conv -> BatchNorm (train mode: its running statistics
  // and batch count are module state the step writes) -> ReLU. The second
  // compilation's fingerprint stands for its analysis and its joint graph
  // comes from the cache; both give eager's outputs, buffers and gradients.
  auto net = [] {
    at::manual_seed(10);
    return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 3, 3).padding(1)),
                                 torch::nn::BatchNorm2d(3), torch::nn::ReLU());
  };
  const std::string dir = testing::temp_dir("trace-cache");
  const int64_t fingerprints = counted("fingerprint_hit"), hits = counted("trace_cache_hit");
  for (int process = 0; process < 2; ++process) {
    INFO("process " << process);
    torch::nn::Sequential compiled_net = net(), eager_net = net();
    const autograd::AotModule compiled = autograd::aot_module(
        compiled_net.ptr(),
        [](torch::nn::Module& m, const Tensors& in) {
          return Tensors{static_cast<torch::nn::SequentialImpl&>(m).forward(in[0])};
        },
        config(dir));
    at::manual_seed(11);
    for (int step = 0; step < 2; ++step) {
      const at::Tensor x = at::randn({4, 2, 5, 5});
      const at::Tensor c = compiled({x})[0], e = eager_net->forward(x);
      // The interpreter runs eager's kernels in eager's order: bitwise.
      REQUIRE_EQUAL_TENSORS(c.detach(), e.detach());
      c.sum().backward();
      e.sum().backward();
    }
    const auto cb = compiled_net->named_buffers(), eb = eager_net->named_buffers();
    REQUIRE(cb.size() == 3);
    for (size_t i = 0; i < cb.size(); ++i) REQUIRE_EQUAL_TENSORS(cb[i].value(), eb[i].value());
    const auto cp = compiled_net->named_parameters(), ep = eager_net->named_parameters();
    for (size_t i = 0; i < cp.size(); ++i) {
      INFO(cp[i].key());
      REQUIRE_CLOSE(cp[i].value().grad(), ep[i].value().grad(), kGradRtol, kGradAtol);
    }
  }
  CHECK(counted("fingerprint_hit") > fingerprints);
  CHECK(counted("trace_cache_hit") == hits + 1);
}

TEST_CASE("trace cache: frozen tensors of other values in a later process are not served the earlier constants",
          "[autograd][cache]") {
  // AotConfig::freeze makes the captured weight a constant of the graph:
  // another process whose weight holds other values (another checkpoint)
  // must compile its own values in, fingerprint or not.
  at::manual_seed(12);
  const std::string dir = testing::temp_dir("trace-cache");
  const at::Tensor x = at::randn({5, 4});
  const int64_t hits = counted("trace_cache_hit");
  for (int process = 0; process < 2; ++process) {
    const at::Tensor w = at::randn({4, 3});
    auto reading = [&w](const Tensors& in) { return Tensors{at::tanh(at::matmul(in[0], w))}; };
    autograd::AotConfig c = config(dir);
    c.freeze = true;
    at::NoGradGuard no_grad;
    REQUIRE_EQUAL_TENSORS(autograd::aot_function(reading, c)({x})[0], reading({x})[0]);
  }
  CHECK(counted("trace_cache_hit") == hits);  // each process traced its own constants
}
