// A differential test: random DAGs of pointwise ops, broadcast, transposed,
// expanded, sliced and reshaped operands, reductions (sum, mean, amax,
// var_mean) broadcast back, softmax-style rows, cats read back through a
// slice, and mm (an extern kernel), compiled by compile_fx_inner and
// compared with the interpreter on the same inputs. A longer soak run:
//   CRUCIBLE_INDUCTOR_SOAK=5000 build/tests/inductor/test_inductor "[random]"
#include <crucible/inductor/compile_fx.h>
#include <crucible/ir/graph.h>
#include <crucible/ir/interpreter.h>
#include <crucible/ir/propagate_meta.h>

#include "catch.h"
#include "graph_testing.h"
#include "testing.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <random>

using namespace crucible;

namespace {

struct RandomGraph {
  ir::Graph graph;
  std::vector<at::Tensor> inputs;
  /// The graph reduces (sum, mean, amax, var_mean, softmax rows): the
  /// compiled loops add in another order than ATen (see the tolerance below).
  bool reduces = false;
};

RandomGraph random_graph(std::mt19937& rng, at::ScalarType dtype) {
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  RandomGraph r;
  ir::Graph& g = r.graph;
  // Every square value is [n, n]; one graph in four has rows long enough
  // (16 or more) for kernels to split their loops (Note [Split loops]).
  const int64_t n = static_cast<int64_t>(pick(4) == 0 ? 16 + pick(5) : 1 + pick(6));
  auto input = [&](const std::string& name, std::vector<int64_t> sizes) {
    at::Tensor t = at::randn(sizes, at::TensorOptions().dtype(dtype));
    if (!crucible::testing::compile_only()) t = t.to(crucible::testing::test_device());
    r.inputs.push_back(t);
    return g.add_placeholder(name, ir::TensorMeta::of(t));
  };
  std::vector<ir::Value*> square;
  for (int i = 0; i < 3; ++i) square.push_back(input("x" + std::to_string(i), {n, n}));
  // Operands of other shapes: broadcast against [n, n], or sliced down to it.
  ir::Value* col = input("col", {n, 1});
  ir::Value* row = input("row", {1, n});
  ir::Value* vec = input("vec", {n});
  ir::Value* tall = input("tall", {2 * n, n});
  ir::Value* wide = input("wide", {n, 2 * n});
  // Each call's metadata is derived as it is added: a view is drawn only
  // where the metadata says the operand is viewable (propagate_meta below
  // derives it all again).
  auto node = [&](std::string_view op, std::vector<ir::Argument> args) {
    ir::Node* added = g.add_call(op, std::move(args));
    ir::infer_meta(*added);
    return added;
  };
  auto call = [&](std::string_view op, std::vector<ir::Argument> args) { return node(op, std::move(args))->result(); };
  auto any = [&] { return square[pick(square.size())]; };
  auto binary = [&](ir::Value* a, ir::Value* b) {
    switch (pick(3)) {
      case 0:
        return call("aten::add.Tensor", {a, b, c10::Scalar(1)});
      case 1:
        return call("aten::sub.Tensor", {a, b, c10::Scalar(1)});
      default:
        return call("aten::mul.Tensor", {a, b});
    }
  };
  const size_t num_ops = 4 + pick(12);
  for (size_t k = 0; k < num_ops; ++k) {
    ir::Value* a = any();
    ir::Value* b = any();
    ir::Value* v = nullptr;
    const int64_t d = static_cast<int64_t>(pick(2));  // a reduction's dim
    switch (pick(26)) {
      case 0:
        v = call("aten::add.Tensor", {a, b, c10::Scalar(pick(2) ? 1.0 : 0.5)});
        break;
      case 1:
        v = call("aten::sub.Tensor", {a, b, c10::Scalar(1)});
        break;
      case 2:
        v = call("aten::mul.Tensor", {a, b});
        break;
      case 3:
        v = call("aten::relu", {a});
        break;
      case 4:
        v = call("aten::tanh", {a});
        break;
      case 5:
        v = call("aten::sigmoid", {a});
        break;
      case 6:
        v = call("aten::neg", {a});
        break;
      case 7:
        v = call("aten::mul.Scalar", {a, c10::Scalar(0.75)});
        break;
      case 8:
        v = call("aten::threshold_backward", {a, b, c10::Scalar(0.0)});
        break;
      case 9:
        v = call("aten::t", {a});
        break;  // a view: non-contiguous operands later
      case 10:
        v = call("aten::mm", {a, b});
        break;
      case 11: {  // a reduction broadcast back
        ir::Value* s = call("aten::sum.dim_IntList", {a, std::vector<int64_t>{1}, true});
        v = call("aten::add.Tensor", {b, s, c10::Scalar(1)});
        r.reduces = true;
        break;
      }
      case 12: {  // a 0-dim operand
        ir::Value* s = call("aten::mean", {a});
        v = call("aten::mul.Tensor", {b, s});
        r.reduces = true;
        break;
      }
      case 13: {  // a broadcast operand of shape [n, 1], [1, n] or [n], on either side
        ir::Value* c = std::vector<ir::Value*>{col, row, vec}[pick(3)];
        v = pick(2) ? binary(a, c) : binary(c, a);
        break;
      }
      case 14: {  // transpose.int, in one of its spellings
        const std::vector<std::pair<int64_t, int64_t>> dims = {{0, 1}, {1, 0}, {-1, 0}, {-2, -1}};
        const auto [d0, d1] = dims[pick(dims.size())];
        v = call("aten::transpose.int", {a, d0, d1});
        break;
      }
      case 15:
        v = call("aten::permute", {a, std::vector<int64_t>{1, 0}});
        break;
      case 16: {  // an expanded operand (stride 0), used as a value of its own
        switch (pick(3)) {
          case 0:
            v = call("aten::expand", {col, std::vector<int64_t>{pick(2) ? -1 : n, n}});
            break;
          case 1:
            v = call("aten::expand", {row, std::vector<int64_t>{n, pick(2) ? -1 : n}});
            break;
          default:
            v = call("aten::expand", {vec, std::vector<int64_t>{n, n}});
            break;
        }
        if (pick(2)) v = binary(v, a);
        break;
      }
      case 17: {  // every other row of [2n, n] or column of [n, 2n]: start 0 or 1, end None, 2n or "to the end"
        const int64_t start = static_cast<int64_t>(pick(2));
        const std::vector<c10::IValue> ends = {c10::IValue(), c10::IValue(2 * n),
                                               c10::IValue(std::numeric_limits<int64_t>::max())};
        const bool rows = pick(2);
        v = call("aten::slice.Tensor",
                 {rows ? tall : wide, rows ? int64_t{0} : int64_t{1}, start, ends[pick(3)], int64_t{2}});
        if (pick(2)) v = binary(a, v);
        break;
      }
      case 18: {  // to [n*n] and back (a pointwise op between, or not)
        // view where the metadata allows it, else reshape (a copy in ATen)
        const std::vector<int64_t> flat_size = {n * n};
        ir::Value* flat = call(a->meta().is_contiguous() ? "aten::view" : "aten::reshape", {a, flat_size});
        if (pick(2)) flat = call("aten::mul.Scalar", {flat, c10::Scalar(1.5)});
        v = call("aten::view", {flat, std::vector<int64_t>{n, n}});
        break;
      }
      case 19: {  // sum over dim d, broadcast back: kept, or unsqueezed
        const bool keepdim = pick(2);
        ir::Value* s = call("aten::sum.dim_IntList", {a, std::vector<int64_t>{d}, keepdim});
        if (!keepdim) s = call("aten::unsqueeze", {s, d});
        v = call("aten::add.Tensor", {b, s, c10::Scalar(pick(2) ? 1.0 : 0.5)});
        r.reduces = true;
        break;
      }
      case 20: {  // amax kept, subtracted
        ir::Value* m = call("aten::amax", {a, std::vector<int64_t>{d}, true});
        v = call("aten::sub.Tensor", {b, m, c10::Scalar(1)});
        r.reduces = true;
        break;
      }
      case 21: {  // mean over dim d; without keepdim, one per column (d = 0) broadcasts back as it is
        const bool keepdim = pick(2);
        ir::Value* m = call("aten::mean.dim", {a, std::vector<int64_t>{d}, keepdim});
        if (!keepdim && d == 1) m = call("aten::unsqueeze", {m, int64_t{1}});
        v = call("aten::mul.Tensor", {b, m});
        r.reduces = true;
        break;
      }
      case 22: {  // layer-norm rows or columns: (b - mean) * rsqrt(var + 1e-5)
        // Over an input (randn): a variance near 0 would make rsqrt amplify
        // rounding without bound, which randn rows of 2 or more elements
        // almost never have, unlike computed values (relu rows of zeros are
        // exact, saturated sigmoid rows are not).
        ir::Value* x = square[pick(3)];
        const bool unbiased = n > 1 && pick(2);  // n = 1 has no degree of freedom left: NaN
        ir::Node* vm = node("aten::var_mean.dim", {x, std::vector<int64_t>{d}, unbiased, true});
        ir::Value* rstd =
            call("aten::rsqrt", {call("aten::add.Scalar", {vm->result(0), c10::Scalar(1e-5), c10::Scalar(1)})});
        v = call("aten::mul.Tensor", {call("aten::sub.Tensor", {b, vm->result(1), c10::Scalar(1)}), rstd});
        r.reduces = true;
        break;
      }
      case 23: {  // softmax or log_softmax over dim d, decomposed
        ir::Value* m = call("aten::amax", {a, std::vector<int64_t>{d}, true});
        ir::Value* shifted = call("aten::sub.Tensor", {a, m, c10::Scalar(1)});
        ir::Value* e = call("aten::exp", {shifted});
        ir::Value* s = call("aten::sum.dim_IntList", {e, std::vector<int64_t>{d}, true});
        v = pick(2) ? call("aten::div.Tensor", {e, s})
                    : call("aten::sub.Tensor", {shifted, call("aten::log", {s}), c10::Scalar(1)});
        r.reduces = true;
        break;
      }
      case 24: {  // a and b concatenated along d, n of the 2n read back from s: across both, or inside one
        ir::Value* both = call("aten::cat", {std::vector<ir::Value*>{a, b}, d});
        const int64_t s = static_cast<int64_t>(pick(static_cast<size_t>(n) + 1));
        v = call("aten::slice.Tensor", {both, d, s, s + n, int64_t{1}});
        if (pick(2)) v = binary(v, a);
        break;
      }
      default:
        v = call("aten::div.Tensor",
                 {a, call("aten::add.Scalar", {call("aten::abs", {b}), c10::Scalar(1), c10::Scalar(1)})});
        break;
    }
    square.push_back(v);
  }
  std::vector<ir::Value*> outs = {square.back()};
  if (pick(2)) outs.push_back(square[3 + pick(square.size() - 3)]);
  g.set_output(outs);
  ir::propagate_meta(g);
  return r;
}

/// The largest finite magnitude among the floating values `graph` computes
/// on `inputs` (inputs included): the interpreter runs a copy that returns
/// every tensor value.
double largest_magnitude(const ir::Graph& graph, const std::vector<at::Tensor>& inputs) {
  ir::Graph all = graph.clone();
  std::vector<ir::Value*> values;
  for (ir::Node* node : all.nodes()) {
    if (node->is_output()) continue;
    for (const auto& v : node->results())
      if (v->is_tensor() && v->has_meta() && at::isFloatingType(v->meta().dtype)) values.push_back(v.get());
  }
  all.set_output(values);
  double largest = 0;
  const std::vector<at::Tensor> results = ir::Interpreter(all)(inputs);
  for (const at::Tensor& t : results) {
    const at::Tensor finite = t.masked_select(at::isfinite(t));
    if (finite.numel() > 0) largest = std::max(largest, finite.abs().max().item<double>());
  }
  return largest;
}

}  // namespace

TEST_CASE("random graphs: compile_fx_inner agrees with the interpreter", "[inductor][random]") {
  const char* soak = std::getenv("CRUCIBLE_INDUCTOR_SOAK");
  const int count = soak ? std::atoi(soak) : 200;
  std::mt19937 rng(12);
  at::manual_seed(12);
  inductor::InductorOptions o;
  o.cache_dir = crucible::testing::temp_dir("crucible-inductor-random");
  o.flags = {"-O1", "-fopenmp"};  // the loops' meaning does not depend on -O; compile time does
  for (int i = 0; i < count; ++i) {
    at::ScalarType dtype = i % 4 == 3 ? at::kDouble : at::kFloat;
    RandomGraph r = random_graph(rng, dtype);
    CAPTURE(i);
    if (crucible::testing::compile_only()) {  // CUDA asked for, no GPU: NVRTC compiles the graph's kernels
      crucible::testing::relabel_device(r.graph, crucible::testing::test_device());
      for (const std::string& cubin : inductor::compile_cuda(r.graph, "sm_90", o))
        REQUIRE(cubin.compare(0, 4,
                              "\x7f"
                              "ELF") == 0);
      continue;
    }
    std::vector<at::Tensor> in = r.inputs;
    std::vector<at::Tensor> want = ir::interpret(r.graph)(in);
    in = r.inputs;
    std::vector<at::Tensor> got = inductor::compile_fx_inner(r.graph, r.inputs, o)(in);
    REQUIRE(got.size() == want.size());
    // Fused code rounds differently (FMA contraction, libm's tanh/exp): a
    // few ulps per op of the largest magnitude in play, the output's for a
    // pointwise graph. A reduction adds its row in another order than ATen:
    // up to a few ulps of the sum of its terms' magnitudes, which may be far
    // larger than its result and than the output (terms that cancel), so
    // there the scale is the largest magnitude of any value in the graph
    // (the rows have at most 20 terms).
    const double reduced_scale = r.reduces ? largest_magnitude(r.graph, r.inputs) : 0.0;
    for (size_t j = 0; j < got.size(); ++j) {
      CAPTURE(j, want[j], got[j]);
      REQUIRE(got[j].sizes() == want[j].sizes());
      REQUIRE(got[j].scalar_type() == want[j].scalar_type());
      // An overflow (products of products can reach inf, and inf - inf in a
      // softmax row NaN) happens on both sides: the same non-finite values
      // in the same places, the rest compared as usual.
      const at::Tensor finite = at::isfinite(want[j]);
      REQUIRE(at::equal(finite, at::isfinite(got[j])));
      REQUIRE(at::equal(want[j].isnan(), got[j].isnan()));
      REQUIRE(at::equal(want[j].masked_select(at::isinf(want[j])), got[j].masked_select(at::isinf(want[j]))));
      const at::Tensor want_finite = want[j].masked_select(finite), got_finite = got[j].masked_select(finite);
      if (want_finite.numel() == 0) continue;
      const double scale = 1.0 + std::max(want_finite.abs().max().item<double>(), reduced_scale);
      const double tol = (dtype == at::kDouble ? 1e-10 : 1e-4) * scale;
      REQUIRE((got_finite - want_finite).abs().max().item<double>() <= tol);
    }
  }
}
