// core_aten_decompositions: each fused op traced into pointwise ops and
// reductions, the graph run by the interpreter against the fused eager kernel
// on several shapes and dtypes.
//
// Tolerances: the decomposed reductions add in another order than the fused
// kernels (and softmax divides where the kernel may multiply by a
// reciprocal), so results differ by a few ulps of the reduced magnitudes:
// rtol 1e-5 / atol 1e-6 in float, 1e-12 in double. In bfloat16 the
// decompositions compute in float and round once, while the fused CPU
// kernels also round intermediates: two bf16 ulps of the result (2^-6
// relative), and log_softmax's kernel rounds max + log(sum) to bfloat16, an
// absolute error of half an ulp of the largest input (inputs below 16 in
// magnitude here: 2^-5).
#include <crucible/tracer/decomposition.h>
#include <crucible/tracer/make_fx.h>

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "catch.h"
#include "testing.h"
#include "tracer_testing.h"

using namespace crucible;
using namespace crucible::testing;
using Tensors = std::vector<at::Tensor>;

namespace {

struct Tolerance {
  double rtol, atol;
};

Tolerance tolerance(at::ScalarType dtype) {
  if (dtype == at::kDouble) return {1e-12, 1e-12};
  if (dtype == at::kBFloat16) return {1.0 / 64, 1.0 / 32};
  return {1e-5, 1e-6};
}

// Traces `fn` with the core table; `op` is gone from the graph, and the graph
// gives fn's values within the dtype's tolerance.
void check(const std::string& op, const std::function<Tensors(const Tensors&)>& fn, const Tensors& inputs,
           at::ScalarType dtype) {
  INFO(op << " " << c10::toString(dtype));
  tracer::TraceOptions options;
  options.decompositions = tracer::core_aten_decompositions();
  REQUIRE(options.decompositions.count(op));
  const tracer::TraceResult r = tracer::make_fx(fn, clones(inputs), options);
  CHECK(count_calls(r.graph, op) == 0);
  const Tensors expected = fn(clones(inputs));
  const Tensors actual = run_traced(r, clones(inputs));
  REQUIRE(actual.size() == expected.size());
  const Tolerance tol = tolerance(dtype);
  for (size_t i = 0; i < expected.size(); ++i) {
    INFO("output " << i);
    REQUIRE(actual[i].scalar_type() == expected[i].scalar_type());
    REQUIRE(actual[i].sizes() == expected[i].sizes());
    REQUIRE_CLOSE(actual[i], expected[i], tol.rtol, tol.atol);
  }
}

const std::vector<std::vector<int64_t>> kShapes = {{7}, {3, 5}, {2, 3, 4}, {2, 1, 6}};

}  // namespace

TEST_CASE("core decompositions: softmax and log_softmax, forward and backward, over every dim", "[tracer][decomp]") {
  at::manual_seed(0);
  std::vector<std::vector<int64_t>> shapes = kShapes;
  shapes.push_back({2, 0, 3});  // over a 0-size dim too, which has no maximum
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble, at::kBFloat16})
    for (const auto& shape : shapes)
      for (int64_t dim = -1; dim < static_cast<int64_t>(shape.size()); ++dim) {
        INFO("shape " << c10::IntArrayRef(shape) << " dim " << dim);
        const Tensors in = {at::clamp(4 * at::randn(shape), -15, 15).to(dtype), at::randn(shape).to(dtype)};
        check(
            "aten::_softmax", [dim](const Tensors& t) { return Tensors{at::_softmax(t[0], dim, false)}; }, in, dtype);
        check(
            "aten::_log_softmax", [dim](const Tensors& t) { return Tensors{at::_log_softmax(t[0], dim, false)}; }, in,
            dtype);
        check(
            "aten::_softmax_backward_data",
            [dim, dtype](const Tensors& t) {
              return Tensors{at::_softmax_backward_data(t[1], at::_softmax(t[0], dim, false), dim, dtype)};
            },
            in, dtype);
        check(
            "aten::_log_softmax_backward_data",
            [dim, dtype](const Tensors& t) {
              return Tensors{at::_log_softmax_backward_data(t[1], at::_log_softmax(t[0], dim, false), dim, dtype)};
            },
            in, dtype);
      }
}

TEST_CASE("core decompositions: gelu and its backward, exact and tanh", "[tracer][decomp]") {
  at::manual_seed(1);
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble, at::kBFloat16})
    for (const auto& shape : kShapes)
      for (const std::string approximate : {"none", "tanh"}) {
        INFO("shape " << c10::IntArrayRef(shape) << " " << approximate);
        const Tensors in = {3 * at::randn(shape).to(dtype), at::randn(shape).to(dtype)};
        check(
            "aten::gelu", [approximate](const Tensors& t) { return Tensors{at::gelu(t[0], approximate)}; }, in, dtype);
        check(
            "aten::gelu_backward",
            [approximate](const Tensors& t) { return Tensors{at::gelu_backward(t[1], t[0], approximate)}; }, in, dtype);
      }
}

TEST_CASE("core decompositions: native_layer_norm and its backward, with and without affine parameters",
          "[tracer][decomp]") {
  at::manual_seed(2);
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble})
    for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{4, 6}, {2, 3, 8}, {2, 3, 4, 5}})
      for (const size_t normalized : {size_t{1}, size_t{2}})
        for (const bool affine : {true, false}) {
          INFO("shape " << c10::IntArrayRef(shape) << " normalized dims " << normalized << (affine ? " affine" : ""));
          const std::vector<int64_t> norm(shape.end() - static_cast<std::ptrdiff_t>(normalized), shape.end());
          const auto opt = at::TensorOptions().dtype(dtype);
          const Tensors in = {at::randn(shape, opt), at::randn(shape, opt), at::randn(norm, opt), at::randn(norm, opt)};
          auto forward = [norm, affine](const Tensors& t) {
            auto [y, mean, rstd] =
                at::native_layer_norm(t[0], norm, affine ? std::optional<at::Tensor>(t[2]) : std::nullopt,
                                      affine ? std::optional<at::Tensor>(t[3]) : std::nullopt, 1e-5);
            return Tensors{y, mean, rstd};
          };
          check("aten::native_layer_norm", forward, in, dtype);
          check(
              "aten::native_layer_norm_backward",
              [norm, affine, forward](const Tensors& t) {
                const Tensors f = forward(t);
                auto [dx, dw, db] = at::native_layer_norm_backward(
                    t[1], t[0], norm, f[1], f[2], affine ? std::optional<at::Tensor>(t[2]) : std::nullopt,
                    affine ? std::optional<at::Tensor>(t[3]) : std::nullopt, {true, affine, affine});
                return affine ? Tensors{dx, dw, db} : Tensors{dx};
              },
              in, dtype);
        }
}

TEST_CASE("core decompositions: nll_loss forward and backward, every reduction, weights and ignore_index",
          "[tracer][decomp]") {
  at::manual_seed(3);
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble})
    for (const int64_t reduction : {at::Reduction::None, at::Reduction::Mean, at::Reduction::Sum})
      for (const bool weighted : {false, true})
        for (const bool batched : {true, false}) {
          INFO("reduction " << reduction << (weighted ? " weighted" : "") << (batched ? " [N, C]" : " [C]"));
          const auto opt = at::TensorOptions().dtype(dtype);
          at::Tensor x = batched ? at::log_softmax(at::randn({6, 5}, opt), 1) : at::log_softmax(at::randn({5}, opt), 0);
          // A masked class (log-probability -inf) beside a target: picking
          // the target's entry must not multiply the -inf by zero.
          (batched ? x[0][1] : x[1]).fill_(-std::numeric_limits<double>::infinity());
          // Class 2 is ignored; the batch holds it twice.
          const at::Tensor target =
              batched ? at::tensor({0, 2, 4, 1, 2, 3}, at::kLong) : at::scalar_tensor(3, at::kLong);
          const Tensors in = {x, target, at::rand({5}, opt) + 0.5};
          auto forward = [reduction, weighted](const Tensors& t) {
            auto [loss, total] = at::nll_loss_forward(
                t[0], t[1], weighted ? std::optional<at::Tensor>(t[2]) : std::nullopt, reduction, /*ignore_index=*/2);
            return Tensors{loss, total};
          };
          // With reduction none, ATen's total_weight is not a value anyone reads.
          check(
              "aten::nll_loss_forward",
              [forward, reduction, batched](const Tensors& t) {
                const Tensors f = forward(t);
                return reduction == at::Reduction::None && batched ? Tensors{f[0]} : f;
              },
              in, dtype);
          check(
              "aten::nll_loss_backward",
              [forward, reduction, weighted](const Tensors& t) {
                const Tensors f = forward(t);
                const at::Tensor grad = at::ones_like(f[0]) * 0.75;
                return Tensors{at::nll_loss_backward(
                    grad, t[0], t[1], weighted ? std::optional<at::Tensor>(t[2]) : std::nullopt, reduction, 2, f[1])};
              },
              in, dtype);
        }
}

TEST_CASE("core decompositions: silu, threshold_backward, addcmul and addcdiv, broadcast and not contiguous",
          "[tracer][decomp]") {
  at::manual_seed(4);
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble, at::kBFloat16})
    for (const auto& shape : kShapes) {
      INFO("shape " << c10::IntArrayRef(shape));
      const at::Tensor x = (3 * at::randn(shape)).to(dtype);
      // A transposed (non-contiguous) gradient where the shape allows it, and
      // a broadcast row for the pointwise ops' second operand.
      const at::Tensor g = shape.size() > 1 ? at::randn(shape).to(dtype).transpose(0, 1).contiguous().transpose(0, 1)
                                            : at::randn(shape).to(dtype);
      const at::Tensor row = at::randn({shape.back()}).to(dtype);
      const at::Tensor away_from_zero = at::rand({shape.back()}).to(dtype) + 0.5;
      const Tensors in = {x, g, row, away_from_zero};
      check(
          "aten::silu", [](const Tensors& t) { return Tensors{at::silu(t[0])}; }, in, dtype);
      check(
          "aten::silu_backward", [](const Tensors& t) { return Tensors{at::silu_backward(t[1], t[0])}; }, in, dtype);
      check(
          "aten::threshold_backward", [](const Tensors& t) { return Tensors{at::threshold_backward(t[1], t[0], 0)}; },
          in, dtype);
      check(
          "aten::addcmul", [](const Tensors& t) { return Tensors{at::addcmul(t[0], t[1], t[2], 0.5)}; }, in, dtype);
      check(
          "aten::addcdiv", [](const Tensors& t) { return Tensors{at::addcdiv(t[0], t[1], t[3], -0.25)}; }, in, dtype);
    }
  // 0-size tensors go through as 0-size results.
  const Tensors empty = {at::randn({0, 3}), at::randn({0, 3}), at::randn({3}), at::rand({3}) + 0.5};
  check(
      "aten::silu", [](const Tensors& t) { return Tensors{at::silu(t[0])}; }, empty, at::kFloat);
  check(
      "aten::addcdiv", [](const Tensors& t) { return Tensors{at::addcdiv(t[0], t[1], t[3], 2)}; }, empty, at::kFloat);
}

TEST_CASE("core decompositions: mse_loss and its backward, every reduction", "[tracer][decomp]") {
  at::manual_seed(5);
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble})
    for (const int64_t reduction : {at::Reduction::None, at::Reduction::Mean, at::Reduction::Sum}) {
      INFO("reduction " << reduction);
      const auto opt = at::TensorOptions().dtype(dtype);
      const Tensors in = {at::randn({4, 6}, opt), at::randn({4, 6}, opt)};
      check(
          "aten::mse_loss", [reduction](const Tensors& t) { return Tensors{at::mse_loss(t[0], t[1], reduction)}; }, in,
          dtype);
      check(
          "aten::mse_loss_backward",
          [reduction](const Tensors& t) {
            const at::Tensor grad = at::ones_like(at::mse_loss(t[0], t[1], reduction)) * 0.5;
            return Tensors{at::mse_loss_backward(grad, t[0], t[1], reduction)};
          },
          in, dtype);
    }
}

TEST_CASE("core decompositions: embedding_dense_backward with repeated indices, padding and frequency scaling",
          "[tracer][decomp]") {
  at::manual_seed(6);
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble})
    for (const int64_t padding_idx : {int64_t{-1}, int64_t{2}})
      for (const bool scale : {false, true}) {
        INFO("padding_idx " << padding_idx << (scale ? " scale_grad_by_freq" : ""));
        const at::Tensor indices = at::tensor({0, 2, 5, 2, 2, 7}, at::kLong).reshape({2, 3});
        const Tensors in = {at::randn({2, 3, 4}, at::TensorOptions().dtype(dtype)), indices};
        check(
            "aten::embedding_dense_backward",
            [padding_idx, scale](const Tensors& t) {
              return Tensors{at::embedding_dense_backward(t[0], t[1], 9, padding_idx, scale)};
            },
            in, dtype);
      }
}

// Batch norms of 3 channels over several shapes and dtypes, in training and
// eval, with and without weight: body(dtype, shape, train, affine).
void for_each_batch_norm(
    const std::function<void(at::ScalarType, const std::vector<int64_t>&, bool train, bool affine)>& body) {
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble})
    for (const auto& shape : std::vector<std::vector<int64_t>>{{6, 3}, {2, 3, 5}, {2, 3, 4, 4}})
      for (const bool train : {true, false})
        for (const bool affine : {true, false}) {
          INFO("shape " << c10::IntArrayRef(shape) << (train ? " training" : " eval") << (affine ? " affine" : ""));
          body(dtype, shape, train, affine);
        }
}

TEST_CASE("core decompositions: native_batch_norm_backward, training and eval, with and without weight",
          "[tracer][decomp]") {
  at::manual_seed(7);
  for_each_batch_norm([](at::ScalarType dtype, const std::vector<int64_t>& shape, bool train, bool affine) {
    const auto opt = at::TensorOptions().dtype(dtype);
    const Tensors in = {at::randn(shape, opt), at::randn(shape, opt), at::rand({3}, opt) + 0.5, at::randn({3}, opt),
                        at::rand({3}, opt) + 0.5};
    check(
        "aten::native_batch_norm_backward",
        [train, affine](const Tensors& t) {
          const std::optional<at::Tensor> weight = affine ? std::optional<at::Tensor>(t[2]) : std::nullopt;
          at::Tensor running_mean = t[3].clone(), running_var = t[4].clone();
          auto [y, save_mean, save_invstd] =
              at::native_batch_norm(t[0], weight, std::nullopt, running_mean, running_var, train, 0.1, 1e-5);
          auto [dx, dw, db] = at::native_batch_norm_backward(t[1], t[0], weight, t[3], t[4], save_mean, save_invstd,
                                                             train, 1e-5, {true, affine, affine});
          return affine ? Tensors{dx, dw, db} : Tensors{dx};
        },
        in, dtype);
  });
}

TEST_CASE(
    "core decompositions: native_batch_norm in training and eval, running statistics written, and its "
    "functional variant",
    "[tracer][decomp]") {
  at::manual_seed(9);
  for_each_batch_norm([](at::ScalarType dtype, const std::vector<int64_t>& shape, bool train, bool affine) {
    const auto opt = at::TensorOptions().dtype(dtype);
    const Tensors in = {at::randn(shape, opt) * 3 + 1, at::rand({3}, opt) + 0.5, at::randn({3}, opt),
                        at::randn({3}, opt), at::rand({3}, opt) + 0.5};
    auto weight = [affine](const Tensors& t, size_t i) {
      return affine ? std::optional<at::Tensor>(t[i]) : std::nullopt;
    };
    // The running statistics are written in place: returned after the op.
    check(
        "aten::native_batch_norm",
        [&](const Tensors& t) {
          at::Tensor running_mean = t[3].clone(), running_var = t[4].clone();
          auto [y, save_mean, save_invstd] =
              at::native_batch_norm(t[0], weight(t, 1), weight(t, 2), running_mean, running_var, train, 0.1, 1e-5);
          return train ? Tensors{y, save_mean, save_invstd, running_mean, running_var} : Tensors{y};
        },
        in, dtype);
    check(
        "aten::_native_batch_norm_legit_functional",
        [&](const Tensors& t) {
          auto [y, save_mean, save_invstd, new_mean, new_var] =
              at::_native_batch_norm_legit_functional(t[0], weight(t, 1), weight(t, 2), t[3], t[4], train, 0.1, 1e-5);
          return train ? Tensors{y, save_mean, save_invstd, new_mean, new_var} : Tensors{y, new_mean, new_var};
        },
        in, dtype);
  });
}

TEST_CASE("core decompositions: an in-place op is its out-of-place variant's decomposition, then copy_",
          "[tracer][decomp]") {
  // Note [Decomposing in-place ops]: on a plain input (make_fx keeps the
  // write), and functionalized (the write becomes an output).
  at::manual_seed(8);
  auto fn = [](const Tensors& t) {
    t[0].addcmul_(t[1], t[2], 0.5);
    return Tensors{t[0] * 2};
  };
  const Tensors in = {at::randn({3}), at::randn({3}), at::randn({3})};
  for (const bool functionalize : {false, true}) {
    INFO((functionalize ? "functionalized" : "in place"));
    tracer::TraceOptions options;
    options.decompositions = tracer::core_aten_decompositions();
    options.functionalize = functionalize;
    const tracer::TraceResult r = tracer::make_fx(fn, clones(in), options);
    CHECK(count_calls(r.graph, "aten::addcmul_") == 0);
    CHECK(count_calls(r.graph, "aten::addcmul") == 0);
    Tensors eager_in = clones(in), graph_in = clones(in);
    const Tensors expected = fn(eager_in);
    const Tensors actual = run_traced(r, graph_in);
    REQUIRE_CLOSE(actual[0], expected[0], 1e-6, 1e-6);
    // The write: into the input in place, or the new value as an output.
    if (functionalize) {
      REQUIRE_CLOSE(actual.back(), eager_in[0], 1e-6, 1e-6);
    } else {
      REQUIRE_CLOSE(graph_in[0], eager_in[0], 1e-6, 1e-6);
    }
  }
}
