// min_cut_rematerialization_partition through AOTAutograd against eager
// LibTorch: every zoo model's loss and gradients, saved bytes never above
// the default partition's, and each heuristic of Note [Min-cut partition]
// on a small function whose best cut is known.
#include <crucible/autograd/aot_function.h>
#include <crucible/autograd/aot_module.h>
#include <crucible/ir/parser.h>
#include <crucible/models/zoo.h>
#include <crucible/partitioner/default_partition.h>
#include <crucible/partitioner/min_cut_partition.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "catch.h"
#include "graph_testing.h"
#include "testing.h"

using namespace crucible;
using Tensors = std::vector<at::Tensor>;

namespace {

// What a partition made: its saved values, their bytes, the backward graph.
struct Record {
  std::vector<std::string> saved_values;
  double bytes = 0;
  ir::Graph backward;
};

// A partition function that keeps a Record of what it made.
struct Recorded {
  partitioner::MinCutOptions options;
  bool min_cut = true;
  std::shared_ptr<Record> result = std::make_shared<Record>();
  std::shared_ptr<partitioner::MinCutReport> report = std::make_shared<partitioner::MinCutReport>();
  partitioner::PartitionFn fn() const {
    return [*this](const ir::Graph& joint, size_t n) {
      partitioner::PartitionResult r =
          min_cut ? partitioner::min_cut_rematerialization_partition(joint, n, options, report.get())
                  : partitioner::default_partition(joint, n);
      result->saved_values = r.saved_values;
      result->bytes = partitioner::saved_bytes(r);
      result->backward = r.backward.clone();
      return r;
    };
  }
};

// fn's value and input gradients, compiled with `partition` and eagerly, on
// copies of `inputs`; checked equal within the gradient tolerance (the
// backward recomputes with the forward's own kernels, so values agree; sums
// of gradients may run in another order).
void check_against_eager(const tracer::TensorFn& fn, const Tensors& inputs, const Recorded& partition) {
  autograd::AotConfig config;
  config.partition_fn = partition.fn();
  config.cache = nullptr;
  const autograd::AotFunction compiled = autograd::aot_function(fn, config);
  Tensors c_in, e_in;
  for (const at::Tensor& t : inputs) {
    c_in.push_back(t.detach().clone().requires_grad_(t.is_floating_point()));
    e_in.push_back(t.detach().clone().requires_grad_(t.is_floating_point()));
  }
  at::manual_seed(7);
  const at::Tensor got = compiled(c_in).at(0);
  got.backward();
  at::manual_seed(7);
  const at::Tensor expected = fn(e_in).at(0);
  expected.backward();
  REQUIRE_EQUAL_TENSORS(got.detach(), expected.detach());
  for (size_t i = 0; i < inputs.size(); ++i)
    if (e_in[i].grad().defined()) REQUIRE_CLOSE(c_in[i].grad(), e_in[i].grad(), testing::kGradRtol, testing::kGradAtol);
}

// A zoo model's loss through aot_module with `partition`, and its eager
// copy from the same weights, in train mode: the same loss (the same
// kernels), gradients within the gradient tolerance. Returns the bytes the
// partition saved.
double zoo_against_eager(const std::string& name, const Recorded& partition) {
  torch::manual_seed(0);
  models::Model compiled = models::make_model(name), eager = models::make_model(name);
  models::copy_state(*compiled.module, *eager.module);
  compiled.module->train();
  eager.module->train();
  const data::Batch batch = compiled.example_batch(4, 0);
  autograd::AotConfig config;
  config.partition_fn = partition.fn();
  config.cache = nullptr;
  const autograd::AotModule f = autograd::aot_module(
      compiled.module,
      [loss = models::loss_of(compiled)](torch::nn::Module& m, const Tensors& in) { return Tensors{loss(m, in)}; },
      config);
  const at::Tensor loss = f({batch.inputs, batch.targets}).at(0);
  loss.backward();
  const at::Tensor eager_loss = models::loss_of(eager)(*eager.module, {batch.inputs, batch.targets});
  eager_loss.backward();
  REQUIRE_EQUAL_TENSORS(loss.detach(), eager_loss.detach());
  auto eager_params = eager.module->named_parameters();
  for (const auto& p : compiled.module->named_parameters()) {
    INFO(p.key());
    REQUIRE_CLOSE(p.value().grad(), eager_params[p.key()].grad(), testing::kGradRtol, testing::kGradAtol);
  }
  return partition.result->bytes;
}

}  // namespace

TEST_CASE("min-cut: a pointwise chain is recomputed from its input instead of saved", "[partitioner][min_cut]") {
  // exp(sin(x)).sum(): the backward reads exp's result and x; sin(x) and
  // exp(sin(x)) are pointwise, so saving x alone suffices.
  auto fn = [](const Tensors& in) { return Tensors{at::exp(at::sin(in[0])).sum()}; };
  const Tensors in = {at::randn({64})};
  Recorded min_cut, by_default;
  by_default.min_cut = false;
  check_against_eager(fn, in, min_cut);
  check_against_eager(fn, in, by_default);
  CHECK(min_cut.result->saved_values.size() == 1);
  CHECK(by_default.result->saved_values.size() == 2);
  CHECK(min_cut.result->bytes == 64 * 4);
  CHECK(testing::count_calls(min_cut.result->backward, "aten::sin") == 1);
  CHECK(testing::count_calls(min_cut.result->backward, "aten::exp") == 1);
  CHECK(min_cut.report->recomputed == std::unordered_set<std::string>{"sin", "exp"});

  SECTION("max_recompute_distance bounds how far from the backward a value is recomputed") {
    // sin(x) is one use away from the backward (exp reads it, the backward
    // reads exp's result): with a bound of 0 it is not recomputed.
    Recorded bounded;
    bounded.options.max_recompute_distance = 0;
    check_against_eager(fn, in, bounded);
    CHECK(bounded.report->recomputed.count(min_cut.result->saved_values[0]) == 0);
    CHECK(testing::count_calls(bounded.result->backward, "aten::sin") == 0);
  }
}

TEST_CASE("min-cut: compute-intensive ops are saved, not recomputed (ban_compute_intensive)",
          "[partitioner][min_cut]") {
  // sin(x @ w).sum(): cos(x @ w) needs the product. x and w are saved for
  // their gradients anyway, so without the ban the cheapest cut recomputes
  // the mm; with it, the product is saved.
  auto fn = [](const Tensors& in) { return Tensors{at::sin(at::mm(in[0], in[1])).sum()}; };
  const Tensors in = {at::randn({8, 16}), at::randn({16, 4})};
  Recorded banned, free;
  free.options.ban_compute_intensive = false;
  free.options.only_recompute_cheap_ops = false;
  check_against_eager(fn, in, banned);
  check_against_eager(fn, in, free);
  CHECK(testing::count_calls(banned.result->backward, "aten::mm") == 2);  // the two gradients
  CHECK(testing::count_calls(free.result->backward, "aten::mm") == 3);    // and the product again
  CHECK(banned.result->bytes == (8 * 16 + 16 * 4 + 8 * 4) * 4);
  CHECK(free.result->bytes == (8 * 16 + 16 * 4) * 4);
}

TEST_CASE("min-cut: views the backward reads of one saved value are saved as their base and made again there",
          "[partitioner][min_cut]") {
  // h = x @ w is not recomputed (a matmul); the backward reads two views of
  // it, h^T (for cos) and a slice (for sin), 128 + 32 elements where h has
  // 128: saving h and taking the views again in the backward (a view is its
  // base plus geometry, free to recompute) saves the views' overlap.
  auto fn = [](const Tensors& in) {
    const at::Tensor h = at::mm(in[0], in[1]);
    return Tensors{at::sin(h.t()).sum() + at::cos(h.narrow(1, 0, 4)).sum()};
  };
  const Tensors in = {at::randn({8, 8}), at::randn({8, 16})};
  Recorded min_cut, by_default;
  by_default.min_cut = false;
  check_against_eager(fn, in, min_cut);
  check_against_eager(fn, in, by_default);
  // x and w for the product's gradients, then h: (64 + 128 + 128) floats.
  CHECK(min_cut.result->bytes == (64 + 128 + 128) * 4);
  CHECK(by_default.result->bytes > min_cut.result->bytes);
  CHECK(std::find(min_cut.result->saved_values.begin(), min_cut.result->saved_values.end(), "mm") !=
        min_cut.result->saved_values.end());
  CHECK(min_cut.report->recomputed.size() == 2);  // the transpose and the slice
  // Why (what crucible compile --dump-dir writes): the product is kept as
  // compute-intensive, the views are cheap to take again.
  CHECK(min_cut.report->why.at("mm") == "kept in the forward: aten::mm is compute-intensive");
  for (const std::string& view : min_cut.report->recomputed)
    CHECK_THAT(min_cut.report->why.at(view), CRUCIBLE_HAS_SUBSTR("recomputed in the backward"));
  CHECK_THAT(partitioner::to_text(*min_cut.report), CRUCIBLE_HAS_SUBSTR("saved      %mm: kept in the forward"));
}

TEST_CASE("min-cut: a value a backward matmul reads is saved, not recomputed (ban_materialized_backwards)",
          "[partitioner][min_cut]") {
  // mm(relu(x @ w1), w2).sum(): w2's gradient is relu(h)ᵀ @ dy, a matmul
  // that reads relu(h) whole: recomputed, it would be materialized again.
  // Without the ban the cut recomputes relu from h (saving h, the same
  // bytes); with it, relu(h) is saved as it is.
  auto fn = [](const Tensors& in) { return Tensors{at::mm(at::relu(at::mm(in[0], in[1])), in[2]).sum()}; };
  const Tensors in = {at::randn({8, 16}), at::randn({16, 32}), at::randn({32, 4})};
  Recorded banned, free;
  banned.options.ban_materialized_backwards = true;
  check_against_eager(fn, in, banned);
  check_against_eager(fn, in, free);
  CHECK(testing::count_calls(banned.result->backward, "aten::relu") == 0);
  CHECK(testing::count_calls(free.result->backward, "aten::relu") == 1);
}

TEST_CASE("min-cut: a random op is never recomputed: the backward reads the forward's mask", "[partitioner][min_cut]") {
  auto fn = [](const Tensors& in) {
    auto [y, mask] = at::native_dropout(in[0], 0.5, true);
    return Tensors{at::sin(y).sum()};
  };
  Recorded min_cut;
  check_against_eager(fn, {at::randn({256})}, min_cut);
  CHECK(testing::count_calls(min_cut.result->backward, "aten::native_dropout") == 0);
}

TEST_CASE("min-cut: with functionalized RNG the backward draws the forward's dropout mask again",
          "[partitioner][min_cut]") {
  // (sin(dropout(x)) * w).sum(): the backward needs the mask (in dx) and
  // sin(dropout(x)) (as dw). With the RNG functionalized the mask is
  // crucible::philox_rand of the seed and offset inputs, cheap to draw
  // again: the cut saves x, w and those two scalars, no mask.
  auto fn = [](const Tensors& in) { return Tensors{(at::sin(at::dropout(in[0], 0.5, true)) * in[1]).sum()}; };
  Recorded min_cut;
  autograd::AotConfig config;
  config.functionalize_rng_ops = true;
  config.partition_fn = min_cut.fn();
  config.cache = nullptr;
  const autograd::AotFunction compiled = autograd::aot_function(fn, config);
  const at::Tensor x = at::randn({256}), w = at::randn({256});
  const at::Tensor cx = x.clone().requires_grad_(), cw = w.clone().requires_grad_();
  at::manual_seed(3);
  const at::Tensor out = compiled({cx, cw}).at(0);
  out.backward();
  CHECK(testing::count_calls(min_cut.result->backward, "crucible::philox_rand") == 1);
  CHECK(min_cut.result->bytes <= (256 + 256) * 4 + 2 * 8);  // x, w, seed and offset at most: no mask
  // The mask the forward drew, read off dw = sin(dropout(x)) (zero where
  // dropped), and eager's formulas with it: the backward drew the same one.
  const at::Tensor mask = (cw.grad() != 0).to(at::kFloat);
  const double kept = mask.mean().item<double>();  // a fair draw, many standard deviations inside
  REQUIRE(kept > 0.3);
  REQUIRE(kept < 0.7);
  const at::Tensor y = x * mask * 2.0;
  REQUIRE_CLOSE(cw.grad(), at::sin(y), 1e-6, 1e-7);
  REQUIRE_CLOSE(cx.grad(), at::cos(y) * w * mask * 2.0, 1e-6, 1e-7);
  REQUIRE_CLOSE(out, (at::sin(y) * w).sum(), 1e-5, 1e-5);  // summation order of sum() may differ
}

TEST_CASE("min-cut: only cheap ops are recomputed (only_recompute_cheap_ops)", "[partitioner][min_cut]") {
  // softmax is no pointwise op: its result is saved however cheap in bytes.
  auto fn = [](const Tensors& in) { return Tensors{at::sin(at::_softmax(in[0], 1, false)).sum()}; };
  Recorded min_cut;
  check_against_eager(fn, {at::randn({4, 8})}, min_cut);
  CHECK(testing::count_calls(min_cut.result->backward, "aten::_softmax") == 0);
}

TEST_CASE("min-cut: every zoo model's loss and gradients equal eager, saving no more than the default partition",
          "[partitioner][min_cut][zoo]") {
  for (const std::string& name : models::model_names()) {
    INFO(name);
    double bytes[2] = {0, 0};
    for (const bool min_cut : {false, true}) {
      Recorded partition;
      partition.min_cut = min_cut;
      bytes[min_cut] = zoo_against_eager(name, partition);
    }
    INFO("saved bytes: default " << bytes[0] << ", min-cut " << bytes[1]);
    CHECK(bytes[1] <= bytes[0]);
    CHECK(bytes[1] > 0);
  }
}

TEST_CASE("min-cut: a memory budget sweep saves non-increasing bytes with eager's gradients at every point",
          "[partitioner][min_cut][zoo]") {
  for (const std::string& name : {std::string("gpt"), std::string("resnet18")}) {
    INFO(name);
    double previous = std::numeric_limits<double>::infinity(), at_one = 0, at_zero = 0;
    for (const double budget : {1.0, 0.5, 0.1, 0.0}) {
      INFO("budget " << budget);
      Recorded partition;
      partition.options.memory_budget = budget;
      const double bytes = zoo_against_eager(name, partition);
      CHECK(bytes <= previous);
      previous = bytes;
      if (budget == 1.0) at_one = bytes;
      if (budget == 0.0) at_zero = bytes;
    }
    // Letting matmuls and convolutions be recomputed saves strictly less.
    CHECK(at_zero < at_one);
  }
}

TEST_CASE("estimated_peak_bytes: tensors live from their node to their last reader, through views",
          "[partitioner][min_cut]") {
  // a (32 bytes) dies at b; b lives through its view's reader c; the
  // placeholder is not counted: 64 bytes at b and again at c.
  const ir::Graph g = ir::parse(R"(%x : f32[8] = placeholder()
%a : f32[8] = aten::relu(%x)
%b : f32[8] = aten::neg(%a)
%v : f32[2, 4] = aten::view(%b, [2, 4])
%c : f32[2, 4] = aten::exp(%v)
return (%c)
)");
  CHECK(partitioner::estimated_peak_bytes(g) == 64);
  // The same with a read of a at the end: a, b's 32 and c's 32 at once.
  const ir::Graph late = ir::parse(R"(%x : f32[8] = placeholder()
%a : f32[8] = aten::relu(%x)
%b : f32[8] = aten::neg(%a)
%v : f32[2, 4] = aten::view(%b, [2, 4])
%c : f32[2, 4] = aten::exp(%v)
%s : f32[] = aten::sum(%a)
return (%c, %s)
)");
  CHECK(partitioner::estimated_peak_bytes(late) == 96);
}

// Note [Rematerialization in one graph]: a forward result that nobody reads
// may have no metadata (ATen's cuDNN attention leaves cum_seq_q undefined,
// and the tracer records no metadata for it); the cut neither needs nor
// saves it.
TEST_CASE("rematerialize: an unread forward result without metadata costs nothing", "[partitioner][min_cut]") {
  ir::Graph g = ir::parse(R"(%x : f32[4, 8] = placeholder()
%w : f32[8] = placeholder()
%b : f32[8] = placeholder()
%ln : f32[4, 8], %mean : f32[4, 1], %rstd : Tensor = aten::native_layer_norm(%x, [8], %w, %b, 1e-05)
%relu : f32[4, 8] = aten::relu(%ln)
%neg : f32[4, 8] = aten::neg(%ln)
%s : f32[] = aten::sum(%relu)
%g : f32[4, 8] = aten::mul.Tensor(%relu, %neg) {tags=[backward]}
return (%s, %g)
)");
  const partitioner::RematReport r = partitioner::rematerialize(g);
  // relu and neg are cheap: the backward recomputes both from the layer
  // norm's output, which alone stays alive (half the bytes).
  CHECK(r.recomputed_nodes == 2);
  CHECK(r.kept_bytes_after == r.kept_bytes_before / 2);
  // A read result without metadata is still an error, naming the value.
  ir::Graph unknown = ir::parse(R"(%x : f32[4, 8] = placeholder()
%w : f32[8] = placeholder()
%b : f32[8] = placeholder()
%ln : f32[4, 8], %mean : f32[4, 1], %rstd : Tensor = aten::native_layer_norm(%x, [8], %w, %b, 1e-05)
%s : f32[] = aten::sum(%ln)
%g : f32[4, 1] = aten::mul.Tensor(%rstd, %mean) {tags=[backward]}
return (%s, %g)
)");
  CHECK_THROWS_WITH(partitioner::rematerialize(unknown), CRUCIBLE_HAS_SUBSTR("%rstd has no metadata"));
}
