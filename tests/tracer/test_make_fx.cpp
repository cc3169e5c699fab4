// make_fx on plain functions: every test interprets the traced graph and
// compares it with eager LibTorch on the same inputs.
#include "catch.h"
#include "testing.h"
#include "tracer_testing.h"

#include <crucible/ir/printer.h>
#include <crucible/runtime/autocast.h>
#include <crucible/tracer/error.h>
#include <crucible/tracer/make_fx.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>

using crucible::testing::clones;
using crucible::testing::count_calls;
using crucible::testing::run_traced;
using crucible::tracer::make_fx;
using crucible::tracer::TraceError;
using crucible::tracer::TraceOptions;
using Tensors = std::vector<at::Tensor>;

// Tolerances: the interpreter runs the same kernels in the same order as
// eager, so results are bitwise equal unless stated otherwise.

TEST_CASE("make_fx records a function's ops and replays them", "[tracer]") {
  at::manual_seed(0);
  auto fn = [](const Tensors& in) {
    auto h = at::matmul(in[0], in[1]).relu();
    return Tensors{h.sum(1), h * 2.0};
  };
  Tensors inputs = {at::randn({4, 3}), at::randn({3, 5})};
  auto r = make_fx(fn, inputs);
  REQUIRE(r.graph.placeholders().size() == 2);
  REQUIRE(r.graph.outputs().size() == 2);
  REQUIRE(r.graph.placeholders()[0]->meta().sizes == std::vector<int64_t>{4, 3});
  REQUIRE(count_calls(r.graph, "aten::relu") == 1);
  auto expected = fn(inputs);
  auto actual = run_traced(r, inputs);
  REQUIRE_EQUAL_TENSORS(actual[0], expected[0]);
  REQUIRE_EQUAL_TENSORS(actual[1], expected[1]);
  // The example inputs are not written to, and results carry metadata.
  REQUIRE(r.graph.outputs()[0]->meta().sizes == std::vector<int64_t>{4});
}

TEST_CASE("make_fx sees composite ops decomposed and factory ops with no tensor argument", "[tracer]") {
  auto fn = [](const Tensors& in) { return Tensors{at::linear(in[0], in[1]) + at::ones({2}, at::kFloat)}; };
  Tensors inputs = {at::randn({3, 4}), at::randn({2, 4})};
  auto r = make_fx(fn, inputs);
  REQUIRE(count_calls(r.graph, "aten::linear") == 0);  // CompositeImplicitAutograd: decomposed above the tracer
  REQUIRE(count_calls(r.graph, "aten::ones") == 1);
  REQUIRE_EQUAL_TENSORS(run_traced(r, inputs)[0], fn(inputs)[0]);
}

TEST_CASE("make_fx: softmax and cross-entropy", "[tracer]") {
  at::manual_seed(1);
  auto fn = [](const Tensors& in) {
    auto logits = at::matmul(in[0], in[1]);
    return Tensors{at::softmax(logits, 1), at::cross_entropy_loss(logits, in[2])};
  };
  Tensors inputs = {at::randn({6, 5}), at::randn({5, 4}), at::randint(0, 4, {6}, at::kLong)};
  auto r = make_fx(fn, inputs);
  auto expected = fn(inputs);
  auto actual = run_traced(r, inputs);
  REQUIRE_EQUAL_TENSORS(actual[0], expected[0]);
  REQUIRE_EQUAL_TENSORS(actual[1], expected[1]);
}

TEST_CASE("make_fx: causal self-attention (matmul, masked_fill, softmax)", "[tracer]") {
  at::manual_seed(2);
  const int64_t T = 5, C = 8;
  auto fn = [&](const Tensors& in) {
    auto qkv = at::matmul(in[0], in[1]);  // [T, 3C]
    auto parts = qkv.split(C, 1);
    auto att = at::matmul(parts[0], parts[1].transpose(0, 1)) / std::sqrt(static_cast<double>(C));
    auto mask = at::ones({T, T}, at::kBool).triu(1);
    att = att.masked_fill(mask, -std::numeric_limits<float>::infinity()).softmax(-1);
    return Tensors{at::matmul(att, parts[2])};
  };
  Tensors inputs = {at::randn({T, C}), at::randn({C, 3 * C})};
  auto r = make_fx(fn, inputs);
  REQUIRE(count_calls(r.graph, "aten::split.Tensor") == 1);  // a Tensor[] result
  REQUIRE_EQUAL_TENSORS(run_traced(r, inputs)[0], fn(inputs)[0]);
}

TEST_CASE("make_fx: embedding", "[tracer]") {
  at::manual_seed(3);
  auto fn = [](const Tensors& in) { return Tensors{at::embedding(in[0], in[1]).sum(-1)}; };
  Tensors inputs = {at::randn({10, 4}), at::tensor({1, 3, 3, 9}, at::kLong)};
  auto r = make_fx(fn, inputs);
  REQUIRE_EQUAL_TENSORS(run_traced(r, inputs)[0], fn(inputs)[0]);
}

TEST_CASE("make_fx: dropout replays eager's randomness when the generator is re-seeded", "[tracer]") {
  // The graph holds the RNG op itself (aten::native_dropout / bernoulli), which
  // draws from the default CPU generator when it runs; seeding that generator
  // the same way before the eager run and before the interpreted run makes
  // both draw the same mask.
  auto fn = [](const Tensors& in) { return Tensors{at::dropout(in[0] * 3.0, 0.5, /*train=*/true)}; };
  Tensors inputs = {at::randn({16, 16})};
  auto r = make_fx(fn, inputs);
  bool has_rng = false;
  for (auto* n : r.graph.nodes()) has_rng |= n->is_nondeterministic();
  REQUIRE(has_rng);
  at::manual_seed(42);
  auto expected = fn(inputs);
  at::manual_seed(42);
  auto actual = run_traced(r, inputs);
  REQUIRE_EQUAL_TENSORS(actual[0], expected[0]);
}

TEST_CASE("make_fx: in-place ops on intermediates and on inputs", "[tracer]") {
  at::manual_seed(4);
  auto fn = [](const Tensors& in) {
    auto x = in[0];
    auto y = x * 2.0;
    y.add_(1.0).relu_();
    x.mul_(3.0);  // an input written in place
    return Tensors{y * x};
  };
  Tensors inputs = {at::randn({3, 4})};
  const at::Tensor before = inputs[0].clone();
  auto r = make_fx(fn, inputs);
  // Reads after an in-place op depend on it: the output reads the mul_'s result.
  REQUIRE(count_calls(r.graph, "aten::mul_.Scalar") == 1);
  Tensors eager_in = clones(inputs), graph_in = clones(inputs);
  auto expected = fn(eager_in);
  auto actual = run_traced(r, graph_in);
  REQUIRE_EQUAL_TENSORS(actual[0], expected[0]);
  REQUIRE_EQUAL_TENSORS(graph_in[0], eager_in[0]);  // the graph writes the input, as eager did
  // Tracing worked on a copy: the example input itself is unchanged.
  REQUIRE_EQUAL_TENSORS(inputs[0], before);
}

TEST_CASE("make_fx: views followed by mutation", "[tracer]") {
  at::manual_seed(5);
  const auto fn = crucible::testing::views_then_mutation;
  Tensors inputs = {at::randn({4, 6})};
  auto r = make_fx(fn, inputs);
  auto expected = fn(clones(inputs));
  auto actual = run_traced(r, clones(inputs));
  REQUIRE_EQUAL_TENSORS(actual[0], expected[0]);
  REQUIRE_EQUAL_TENSORS(actual[1], expected[1]);
}

TEST_CASE("make_fx: multi-result ops", "[tracer]") {
  at::manual_seed(6);
  auto fn = [](const Tensors& in) {
    auto [values, indices] = at::max(in[0], 1);
    auto [top, top_idx] = at::topk(in[0], 2);
    auto [out, mean, rstd] = at::native_layer_norm(in[0], {5}, {}, {}, 1e-5);
    auto chunks = in[0].chunk(2, 0);
    return Tensors{values, indices, top, top_idx, out, mean, rstd, chunks[1] * 2.0};
  };
  Tensors inputs = {at::randn({4, 5})};
  auto r = make_fx(fn, inputs);
  auto expected = fn(inputs);
  auto actual = run_traced(r, inputs);
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) REQUIRE_EQUAL_TENSORS(actual[i], expected[i]);
}

TEST_CASE("make_fx rejects data-dependent ops, naming them", "[tracer]") {
  at::Tensor x = at::randn({4});
  REQUIRE_THROWS_WITH(make_fx([](const at::Tensor& t) { return t * t.sum().item<float>(); }, x),
                      CRUCIBLE_HAS_SUBSTR("aten::_local_scalar_dense"));
  // The tensor read is named, through the in-place ops that wrote it (a
  // BatchNorm without momentum reads its num_batches_tracked after += 1).
  auto counter = [](const at::Tensor& t) {
    at::Tensor c = t.sum();
    c.add_(1);
    return t / c.item<float>();
  };
  REQUIRE_THROWS_WITH(make_fx(counter, x), CRUCIBLE_HAS_SUBSTR("aten::_local_scalar_dense (of %sum)"));
  REQUIRE_THROWS_WITH(make_fx([](const at::Tensor& t) { return at::nonzero(t); }, x),
                      CRUCIBLE_HAS_SUBSTR("aten::nonzero"));
  REQUIRE_THROWS_WITH(make_fx([](const at::Tensor& t) { return t.sum().is_nonzero() ? t : -t; }, x),
                      CRUCIBLE_HAS_SUBSTR("data-dependent"));  // is_nonzero decomposes to _local_scalar_dense
  TraceOptions fake;
  fake.mode = crucible::tracer::TraceMode::Fake;
  REQUIRE_THROWS_WITH(make_fx([](const at::Tensor& t) { return at::equal(t, t.abs()) ? t : -t; }, x, fake),
                      CRUCIBLE_HAS_SUBSTR("aten::equal") && CRUCIBLE_HAS_SUBSTR("data-dependent"));
  REQUIRE_THROWS_AS(make_fx([](const at::Tensor& t) { return t.masked_select(t > 0); }, x), TraceError);
  // aten::index.Tensor: a boolean mask's result has a data-dependent shape;
  // integer indices give a static one.
  REQUIRE_THROWS_WITH(make_fx([](const at::Tensor& t) { return t.index({t > 0}); }, x),
                      CRUCIBLE_HAS_SUBSTR("aten::index.Tensor"));
  auto rows = [](const at::Tensor& t) { return t.index({at::arange(3).flip(0)}) * 2; };
  REQUIRE_EQUAL_TENSORS(run_traced(make_fx(rows, x), {x})[0], rows(x));
}

TEST_CASE("make_fx: at::equal of a tensor and itself is the identity test multi-head attention means", "[tracer]") {
  // Note [equal of one tensor]: true, and nothing recorded.
  auto fn = [](const at::Tensor& t) {
    const at::Tensor h = t * 2;
    return at::equal(h, h) ? h + 1 : h - 1;
  };
  at::Tensor x = at::randn({4});
  auto r = make_fx(fn, x);
  REQUIRE(count_calls(r.graph, "aten::equal") == 0);
  REQUIRE_EQUAL_TENSORS(run_traced(r, {x})[0], fn(x));
  // Tensors of other sizes (a decoder's queries and its memory) are unequal
  // whatever their values; of the same sizes, their values decide.
  auto cross = [](const Tensors& in) { return Tensors{at::equal(in[0], in[1]) ? in[0] : in[0] * 2}; };
  const Tensors q_m = {at::randn({5, 2, 8}), at::randn({4, 2, 8})};
  auto rc = make_fx(cross, q_m);
  REQUIRE(count_calls(rc.graph, "aten::equal") == 0);
  REQUIRE_EQUAL_TENSORS(run_traced(rc, q_m)[0], cross(q_m)[0]);
}

TEST_CASE("make_fx: at::equal of two tensors of the same sizes takes the traced answer, guarded", "[tracer]") {
  // Note [Guarded equal]: a cross-attention whose target is as long as its
  // memory. The graph follows the branch taken at trace time and checks at
  // every call that at::equal still answers the same.
  auto cross = [](const Tensors& in) { return Tensors{at::equal(in[0], in[1]) ? in[0] + 1 : in[0] * 2}; };
  const Tensors unequal = {at::randn({4, 3}), at::randn({4, 3})};
  auto r = make_fx(cross, unequal);
  REQUIRE(count_calls(r.graph, "aten::equal") == 0);
  REQUIRE(count_calls(r.graph, "crucible::assert_equal") == 1);
  const Tensors other = {at::randn({4, 3}), at::randn({4, 3})};
  REQUIRE_EQUAL_TENSORS(run_traced(r, other)[0], cross(other)[0]);
  // Equal tensors would take the other branch: the guard says so.
  const at::Tensor same = at::randn({4, 3});
  REQUIRE_THROWS_WITH(run_traced(r, {same, same.clone()}), CRUCIBLE_HAS_SUBSTR("crucible::assert_equal") &&
                                                               CRUCIBLE_HAS_SUBSTR("was false") &&
                                                               CRUCIBLE_HAS_SUBSTR("Compile the function again"));
  // Traced on equal values, the other way round.
  const at::Tensor v = at::randn({4, 3});
  auto e = make_fx(cross, Tensors{v, v.clone()});
  REQUIRE_EQUAL_TENSORS(run_traced(e, {same, same.clone()})[0], cross({same, same.clone()})[0]);
  REQUIRE_THROWS_WITH(run_traced(e, other), CRUCIBLE_HAS_SUBSTR("was true"));
  // In fake mode there are no values to decide by.
  TraceOptions fake;
  fake.mode = crucible::tracer::TraceMode::Fake;
  REQUIRE_THROWS_WITH(make_fx(cross, unequal, fake), CRUCIBLE_HAS_SUBSTR("data-dependent"));
}

TEST_CASE("make_fx: expanded inputs and expanded tensors read from outside, lifted or frozen", "[tracer]") {
  // Their elements share memory (stride 0): the trace's copies hold the
  // same values in the same layout, as elementwise copy_ cannot write them.
  at::manual_seed(3);
  const at::Tensor x = at::randn({1, 4}).expand({3, 4});
  const at::Tensor bias = at::randn({4, 1}).expand({4, 3}).t();
  auto fn = [&](const Tensors& in) { return Tensors{in[0] * 2 + bias, in[0].sum(0)}; };
  const Tensors expected = fn({x});
  for (bool freeze : {false, true}) {
    CAPTURE(freeze);
    TraceOptions o;
    o.freeze = freeze;
    auto r = make_fx(fn, Tensors{x}, o);
    Tensors inputs = {x};
    for (const auto& l : r.lifted) inputs.push_back(l.tensor);
    REQUIRE(inputs.size() == (freeze ? 1 : 2));
    const auto actual = run_traced(r, inputs);
    REQUIRE_EQUAL_TENSORS(actual[0], expected[0]);
    REQUIRE_EQUAL_TENSORS(actual[1], expected[1]);
  }
}

TEST_CASE("make_fx with freeze: tensors read from outside become constants; large ones are refused", "[tracer]") {
  at::manual_seed(7);
  at::Tensor bias = at::randn({4});
  auto fn = [&](const at::Tensor& t) { return t + bias; };
  at::Tensor x = at::randn({3, 4});
  TraceOptions freeze;
  freeze.freeze = true;
  auto r = make_fx(fn, x, freeze);
  size_t constants = 0;
  for (auto* n : r.graph.nodes()) constants += n->is_constant();
  REQUIRE(constants == 1);
  REQUIRE(r.lifted.empty());
  REQUIRE(r.graph.placeholders().size() == 1);
  REQUIRE_EQUAL_TENSORS(run_traced(r, {x})[0], fn(x));

  at::Tensor big = at::randn({1024, 1024});  // 4 MiB
  REQUIRE_THROWS_WITH(make_fx([&](const at::Tensor& t) { return at::matmul(t, big); }, at::randn({2, 1024}), freeze),
                      CRUCIBLE_HAS_SUBSTR("max_constant_bytes"));
  freeze.max_constant_bytes = int64_t{8} << 20;
  REQUIRE_NOTHROW(make_fx([&](const at::Tensor& t) { return at::matmul(t, big); }, at::randn({2, 1024}), freeze));
}

TEST_CASE("make_fx: a joint trace of torch::autograd::grad tags the backward ops", "[tracer]") {
  at::manual_seed(8);
  auto fn = [](const Tensors& in) {
    auto w = in[1];
    auto loss = at::matmul(in[0], w).relu().pow(2).mean();
    auto grads = torch::autograd::grad({loss}, {w});
    return Tensors{loss.detach(), grads[0]};
  };
  Tensors inputs = {at::randn({8, 4}), at::randn({4, 3}).requires_grad_()};
  auto r = make_fx(fn, inputs);
  REQUIRE(r.graph.placeholders()[1]->meta().requires_grad);
  size_t backward = 0, forward = 0;
  for (auto* n : r.graph.nodes()) {
    if (!n->is_call()) continue;
    (n->has_tag("backward") ? backward : forward)++;
  }
  REQUIRE(backward > 0);
  REQUIRE(forward > 0);
  REQUIRE(count_calls(r.graph, "aten::threshold_backward") == 1);
  auto expected = fn(inputs);
  auto actual = run_traced(r, {inputs[0], inputs[1].detach()});
  REQUIRE_EQUAL_TENSORS(actual[0], expected[0]);
  REQUIRE_EQUAL_TENSORS(actual[1], expected[1]);
}
TEST_CASE("make_fx: ops run under no_grad in a function traced with grad on are tagged, and run so", "[tracer]") {
  // Note [Nodes traced under no_grad]: an in-place write to a leaf that
  // requires grad (embedding's max_norm renormalization) works under
  // no_grad only; interpreting the graph with grad on must do the same.
  auto fn = [](const Tensors& in) {
    {
      at::NoGradGuard no_grad;
      in[0].mul_(0.5);
    }
    return Tensors{(in[0] * in[1]).sum()};
  };
  at::AutoGradMode grad_on(true);
  const Tensors inputs = {at::randn({4}).requires_grad_(), at::randn({4})};
  auto r = make_fx(fn, clones(inputs));
  size_t tagged = 0;
  for (auto* n : r.graph.nodes()) tagged += n->has_tag("no_grad");
  REQUIRE(tagged == 1);
  Tensors run_in = clones(inputs);
  run_in[0] = run_in[0].detach().requires_grad_();
  const at::Tensor out = run_traced(r, run_in).at(0);  // mul_ on a leaf that requires grad: no_grad only
  out.backward();
  Tensors eager_in = clones(inputs);
  eager_in[0].requires_grad_();
  const at::Tensor expected = fn(eager_in).at(0);
  expected.backward();
  REQUIRE_EQUAL_TENSORS(out.detach(), expected.detach());
  REQUIRE_EQUAL_TENSORS(run_in[0].grad(), eager_in[0].grad());
  // Traced with grad off, nothing is tagged: the whole trace ran so.
  at::NoGradGuard off;
  auto quiet = make_fx(fn, clones(inputs));
  for (auto* n : quiet.graph.nodes()) REQUIRE_FALSE(n->has_tag("no_grad"));
}

TEST_CASE("make_fx: tensors the function makes itself, real or fake, functionalized or not", "[tracer]") {
  // Note [Memory written outside the dispatcher]: what a traced op writes
  // (torch::tensor's element fills, fill_, normal_, an out= op) is in the
  // graph; at::tensor's copy through data_ptr() is not, and is refused by name.
  const std::vector<std::function<at::Tensor(const at::Tensor&)>> traced = {
      [](const at::Tensor& t) {
        return t * torch::tensor({5.0, 6.0, 7.0, 8.0}).to(t.dtype());
      },
      [](const at::Tensor& t) { return t * at::empty({4}).fill_(2) + at::arange(4); },
      [](const at::Tensor& t) { return t * at::empty({4}).normal_(); },
      [](const at::Tensor& t) {
        at::Tensor b = at::empty({4});
        at::mul_out(b, t, t);
        return b + 1;
      },
  };
  const std::vector<std::function<at::Tensor(const at::Tensor&)>> refused = {
      [](const at::Tensor& t) {
        return t * at::tensor(std::vector<double>{1, 2, 3, 4}).to(t.dtype());
      },
      [](const at::Tensor& t) {
        return t * at::tensor(std::vector<float>{1, 2, 3, 4}).add_(1);
      },
  };
  // A new tensor pointed at another tensor's Storage by set_ (cuDNN's RNN
  // does it with its flattened weights): refused by name, not as a read of
  // memory written outside the dispatcher; functionalized, the Storage is a
  // functional tensor's, and in fake mode a meta tensor's, neither with any
  // data (ATen would point the tensor at nothing and crash in the next
  // kernel).
  auto set_storage = [](const Tensors& in) {
    at::Tensor w = at::empty({0}, in[0].options()).set_(in[0].storage(), 0, {4}, {1});
    return Tensors{w * 2};
  };
  const at::Tensor x = at::randn({4});
  for (auto mode : {crucible::tracer::TraceMode::Real, crucible::tracer::TraceMode::Fake}) {
    for (bool functionalize : {false, true}) {
      crucible::tracer::TraceOptions o;
      o.mode = mode;
      o.functionalize = functionalize;
      INFO("fake " << (mode == crucible::tracer::TraceMode::Fake) << ", functionalize " << functionalize);
      for (size_t f = 0; f < traced.size(); ++f) {
        INFO("function " << f);
        auto r = make_fx(traced[f], x, o);
        const at::Tensor y = at::randn({4});
        at::manual_seed(1);
        const at::Tensor actual = run_traced(r, {y})[0];
        at::manual_seed(1);
        REQUIRE_EQUAL_TENSORS(actual, traced[f](y));
      }
      for (const auto& fn : refused) REQUIRE_THROWS_WITH(make_fx(fn, x, o), CRUCIBLE_HAS_SUBSTR("at::tensor"));
      REQUIRE_THROWS_WITH(make_fx(set_storage, {x}, o),
                          CRUCIBLE_HAS_SUBSTR(functionalize ? "inside a functionalized trace, which holds no memory"
                                              : mode == crucible::tracer::TraceMode::Fake
                                                  ? "at the Storage of a fake or meta tensor, which holds no data"
                                                  : "at a Storage, which a graph cannot hold"));
      // Its own type where functionalizing would hold it: the pre-grad
      // passes' trace goes on without them (pipeline/builder.cpp).
      if (!functionalize && mode == crucible::tracer::TraceMode::Real)
        REQUIRE_THROWS_AS(make_fx(set_storage, {x}, o), crucible::tracer::NeedsFunctionalizationError);
    }
  }
}

// Note [Auto trace mode]: the default traces on fake tensors where it can.
TEST_CASE("make_fx: by default (TraceMode::Auto) the function runs once, on fake tensors, and the graph is eager's",
          "[tracer]") {
  int calls = 0, on_meta = 0;
  auto fn = [&](const Tensors& in) {
    ++calls;
    on_meta += crucible::tracer::is_fake(in[0]) ? 1 : 0;
    return Tensors{at::relu(in[0].matmul(in[1])) * 2.0 + 1.0};
  };
  const Tensors inputs = {at::randn({4, 5}), at::randn({5, 3})};
  const auto r = make_fx(fn, inputs);
  CHECK(r.mode == crucible::tracer::TraceMode::Fake);
  CHECK(r.fake_mode_abandoned.empty());
  CHECK(calls == 1);
  CHECK(on_meta == 1);
  REQUIRE_EQUAL_TENSORS(run_traced(r, clones(inputs))[0], fn(inputs)[0]);
}

TEST_CASE("make_fx: TraceMode::Auto traces at::equal in real mode, guarded, and keeps only the real run's warnings",
          "[tracer]") {
  int calls = 0;
  auto fn = [&](const Tensors& in) {
    ++calls;
    TORCH_WARN("a warning of the traced function");
    return Tensors{at::equal(in[0], in[1]) ? in[0] * 2.0 : in[0] * 3.0};
  };
  const Tensors same = {at::ones({3}), at::ones({3})};
  crucible::testing::CollectWarnings warnings;
  const auto r = make_fx(fn, same);
  CHECK(r.mode == crucible::tracer::TraceMode::Real);
  CHECK_THAT(r.fake_mode_abandoned, CRUCIBLE_HAS_SUBSTR("aten::equal"));
  CHECK(calls == 2);  // the fake attempt, then the real trace
  CHECK(std::count(warnings.messages.begin(), warnings.messages.end(), "a warning of the traced function") == 1);
  REQUIRE_EQUAL_TENSORS(run_traced(r, clones(same))[0], fn(same)[0]);
  // The real trace's guard: other values than the trace's answer are refused.
  CHECK_THROWS(run_traced(r, {at::ones({3}), at::zeros({3})}));
}

TEST_CASE("make_fx: TraceMode::Auto keeps a fake trace's warnings when it keeps the trace", "[tracer]") {
  auto fn = [](const Tensors& in) {
    TORCH_WARN("a warning of the traced function");
    return Tensors{in[0] + 1.0};
  };
  crucible::testing::CollectWarnings warnings;
  const auto r = make_fx(fn, {at::ones({3})});
  CHECK(r.mode == crucible::tracer::TraceMode::Fake);
  CHECK(std::count(warnings.messages.begin(), warnings.messages.end(), "a warning of the traced function") == 1);
}

// Note [Fake tensors]: a fake tensor reports its device and carries its
// autocast key, so autocast casts it as it casts the real tensor.
TEST_CASE("make_fx: under autocast a fake-mode trace records eager's casts, the graph a real trace records",
          "[tracer]") {
  // mm casts both operands to bf16.
  auto fn = [](const Tensors& in) { return Tensors{at::softmax(at::mm(in[0], in[1]).relu(), 1)}; };
  const Tensors inputs = {at::randn({8, 16}), at::randn({16, 4})};
  crucible::tracer::TraceResult fake, real;
  Tensors expected;
  {
    crucible::runtime::AutocastGuard autocast(at::kCPU, at::kBFloat16);
    fake = make_fx(fn, inputs);
    TraceOptions real_mode;
    real_mode.mode = crucible::tracer::TraceMode::Real;
    real = make_fx(fn, inputs, real_mode);
    expected = fn(inputs);
  }
  CHECK(fake.mode == crucible::tracer::TraceMode::Fake);
  CHECK(fake.fake_mode_abandoned.empty());
  REQUIRE(count_calls(fake.graph, "aten::_to_copy") == 2);
  REQUIRE(crucible::ir::to_text(fake.graph) == crucible::ir::to_text(real.graph));
  REQUIRE_EQUAL_TENSORS(run_traced(fake, clones(inputs))[0], expected[0]);
}

// scaled_dot_product_attention picks its kernel by its tensors' device (a
// DispatchStub, no op the tracer sees): a fake tensor reports the device,
// so a fake-mode trace records the kernel eager runs (on the CPU, flash
// attention for the CPU), forward and backward.
TEST_CASE("make_fx: scaled_dot_product_attention on fake tensors records eager's kernel, forward and backward",
          "[tracer]") {
  at::manual_seed(3);
  auto fn = [](const Tensors& in) {
    const at::Tensor q = in[0].requires_grad() ? in[0] : in[0].detach().requires_grad_();
    const at::Tensor out = at::scaled_dot_product_attention(q, in[1], in[2], {}, 0.0, /*is_causal=*/true);
    const at::Tensor grad = torch::autograd::grad({out.square().sum()}, {q})[0];
    return Tensors{out.detach(), grad};
  };
  const Tensors inputs = {at::randn({2, 3, 16, 8}), at::randn({2, 3, 16, 8}), at::randn({2, 16, 3, 8}).transpose(1, 2)};
  TraceOptions fake_mode, real_mode;
  fake_mode.mode = crucible::tracer::TraceMode::Fake;
  real_mode.mode = crucible::tracer::TraceMode::Real;
  const auto fake = make_fx(fn, inputs, fake_mode);
  const auto real = make_fx(fn, inputs, real_mode);
  CHECK(count_calls(fake.graph, "aten::_softmax") == 0);  // not the math path
  REQUIRE(crucible::ir::to_text(fake.graph) == crucible::ir::to_text(real.graph));
  const Tensors expected = fn(inputs);
  const Tensors actual = run_traced(fake, clones(inputs));
  for (size_t i = 0; i < expected.size(); ++i) REQUIRE_EQUAL_TENSORS(actual[i], expected[i]);
}

TEST_CASE("make_fx: fake tensors report the inputs' devices, alias as they do and take in-place metadata changes",
          "[tracer]") {
  bool fake_inside = false, real_inside = true;
  auto fn = [](const Tensors& in) {
    at::Tensor x = in[0] * 1.0;
    at::Tensor flat = x.view({-1});  // a view: its write reaches x
    flat.add_(1.0);
    at::Tensor y = x.clone();
    y.t_();  // an in-place change of sizes and strides
    at::Tensor z = in[1].clone();
    z.resize_({2, 3});
    z.fill_(2.0);
    return Tensors{x * 2.0, y.contiguous(), z};
  };
  const Tensors inputs = {at::randn({3, 4}), at::randn({6})};
  TraceOptions fake_mode, real_mode;
  fake_mode.mode = crucible::tracer::TraceMode::Fake;
  real_mode.mode = crucible::tracer::TraceMode::Real;
  auto probe = [&](bool& seen) {
    return [&, fn](const Tensors& in) {
      seen = crucible::tracer::is_fake(in[0]);
      CHECK(in[0].device().is_cpu());
      CHECK_FALSE(in[0].is_meta());
      return fn(in);
    };
  };
  const auto fake = make_fx(probe(fake_inside), inputs, fake_mode);
  const auto real = make_fx(probe(real_inside), inputs, real_mode);
  CHECK(fake_inside);
  CHECK_FALSE(real_inside);
  CHECK_FALSE(crucible::tracer::is_fake(inputs[0]));
  REQUIRE(crucible::ir::to_text(fake.graph) == crucible::ir::to_text(real.graph));
  const Tensors expected = fn(inputs);
  const Tensors actual = run_traced(fake, clones(inputs));
  for (size_t i = 0; i < expected.size(); ++i) REQUIRE_EQUAL_TENSORS(actual[i], expected[i]);
}
