// A differential test: random DAGs of pointwise ops (fused), reductions,
// views, broadcasting and mm (extern kernels), compiled by compile_fx_inner
// and compared with the interpreter on the same inputs. A longer soak run:
//   CRUCIBLE_INDUCTOR_SOAK=5000 build/tests/inductor/test_inductor "[random]"
#include <crucible/inductor/compile_fx.h>
#include <crucible/ir/graph.h>
#include <crucible/ir/interpreter.h>
#include <crucible/ir/propagate_meta.h>

#include "catch.h"

#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <random>

using namespace crucible;

namespace {

struct RandomGraph {
  ir::Graph graph;
  std::vector<at::Tensor> inputs;
};

RandomGraph random_graph(std::mt19937& rng, at::ScalarType dtype) {
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  RandomGraph r;
  ir::Graph& g = r.graph;
  const int64_t n = 1 + static_cast<int64_t>(pick(6));  // every square value is [n, n]
  std::vector<ir::Value*> square;
  for (int i = 0; i < 3; ++i) {
    at::Tensor t = at::randn({n, n}, at::TensorOptions().dtype(dtype));
    r.inputs.push_back(t);
    square.push_back(g.add_placeholder("x" + std::to_string(i), ir::TensorMeta::of(t)));
  }
  auto any = [&] { return square[pick(square.size())]; };
  const size_t num_ops = 4 + pick(12);
  for (size_t k = 0; k < num_ops; ++k) {
    ir::Value* a = any();
    ir::Value* b = any();
    ir::Value* v = nullptr;
    switch (pick(14)) {
      case 0:
        v = g.add_call("aten::add.Tensor", {a, b, c10::Scalar(pick(2) ? 1.0 : 0.5)})->result();
        break;
      case 1:
        v = g.add_call("aten::sub.Tensor", {a, b, c10::Scalar(1)})->result();
        break;
      case 2:
        v = g.add_call("aten::mul.Tensor", {a, b})->result();
        break;
      case 3:
        v = g.add_call("aten::relu", {a})->result();
        break;
      case 4:
        v = g.add_call("aten::tanh", {a})->result();
        break;
      case 5:
        v = g.add_call("aten::sigmoid", {a})->result();
        break;
      case 6:
        v = g.add_call("aten::neg", {a})->result();
        break;
      case 7:
        v = g.add_call("aten::mul.Scalar", {a, c10::Scalar(0.75)})->result();
        break;
      case 8:
        v = g.add_call("aten::threshold_backward", {a, b, c10::Scalar(0.0)})->result();
        break;
      case 9:
        v = g.add_call("aten::t", {a})->result();
        break;  // a view: non-contiguous operands later
      case 10:
        v = g.add_call("aten::mm", {a, b})->result();
        break;
      case 11: {  // a reduction broadcast back: extern kernels around a fused loop
        ir::Value* s = g.add_call("aten::sum.dim_IntList", {a, std::vector<int64_t>{1}, true})->result();
        v = g.add_call("aten::add.Tensor", {b, s, c10::Scalar(1)})->result();
        break;
      }
      case 12: {  // a 0-dim operand: broadcast inside the loop
        ir::Value* s = g.add_call("aten::mean", {a})->result();
        v = g.add_call("aten::mul.Tensor", {b, s})->result();
        break;
      }
      default:
        v = g.add_call("aten::div.Tensor", {a, g.add_call("aten::add.Scalar", {g.add_call("aten::abs", {b})->result(),
                                                                               c10::Scalar(1), c10::Scalar(1)})
                                                   ->result()})
                ->result();
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

}  // namespace

TEST_CASE("random graphs: compile_fx_inner agrees with the interpreter", "[inductor][random]") {
  const char* soak = std::getenv("CRUCIBLE_INDUCTOR_SOAK");
  const int count = soak ? std::atoi(soak) : 200;
  std::mt19937 rng(12);
  at::manual_seed(12);
  std::string tmpl = (std::filesystem::temp_directory_path() / "crucible-inductor-random-XXXXXX").string();
  REQUIRE(::mkdtemp(tmpl.data()));
  inductor::InductorOptions o;
  o.cache_dir = tmpl;
  o.flags = {"-O1", "-fopenmp"};  // the loops' meaning does not depend on -O; compile time does
  for (int i = 0; i < count; ++i) {
    at::ScalarType dtype = i % 4 == 3 ? at::kDouble : at::kFloat;
    RandomGraph r = random_graph(rng, dtype);
    CAPTURE(i);
    std::vector<at::Tensor> in = r.inputs;
    std::vector<at::Tensor> want = ir::interpret(r.graph)(in);
    in = r.inputs;
    std::vector<at::Tensor> got = inductor::compile_fx_inner(r.graph, r.inputs, o)(in);
    REQUIRE(got.size() == want.size());
    for (size_t j = 0; j < got.size(); ++j) {
      // Fused code rounds differently (FMA contraction, libm's tanh/exp):
      // a few ulps per op of the largest magnitude in play.
      double scale = 1.0 + want[j].abs().max().item<double>();
      double tol = (dtype == at::kDouble ? 1e-10 : 1e-4) * scale;
      CAPTURE(j, want[j], got[j]);
      REQUIRE(got[j].sizes() == want[j].sizes());
      REQUIRE((got[j] - want[j]).abs().max().item<double>() <= tol);
    }
  }
}
