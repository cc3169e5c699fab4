// Host arithmetic (Note [Host arithmetic] in
// inductor/src/runtime/host_arith.cpp): the run-time plan computes ops on
// 0-dim float64 CPU tensors itself. Each op is compared with ATen's own
// kernel, called through the dispatcher on the same values, bit for bit:
// the optimizer's step counts and bias corrections must stay what eager
// computes.
#include "runtime/host_arith.h"

#include <crucible/ir/graph.h>
#include <crucible/ir/tensor_meta.h>

#include <ATen/core/stack.h>
#include <ATen/ops/scalar_tensor.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "catch.h"

using namespace crucible;
using inductor::detail::evaluate;
using inductor::detail::host_arith_of;

namespace {

const ir::TensorMeta kHostDouble = ir::TensorMeta::contiguous({}, c10::kDouble);

bool same_bits(double a, double b) {
  if (std::isnan(a) && std::isnan(b)) return true;  // ATen and std:: may differ in a NaN's payload
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// The node `op` of `args` in a graph whose two placeholders are 0-dim
// float64 CPU tensors; "%a" and "%b" in args name them.
struct Case {
  ir::Graph g;
  ir::Node* node = nullptr;
  Case(const std::string& op, const std::vector<c10::IValue>& constants, const std::vector<int>& placeholder_at) {
    ir::Value* a = g.add_placeholder("a", kHostDouble);
    ir::Value* b = g.add_placeholder("b", kHostDouble);
    std::vector<ir::Argument> args;
    size_t c = 0;
    for (size_t i = 0; i < constants.size() + placeholder_at.size(); ++i) {
      bool placeholder = false;
      for (size_t k = 0; k < placeholder_at.size(); ++k)
        if (placeholder_at[k] == static_cast<int>(i)) {
          args.emplace_back(k == 0 ? a : b);
          placeholder = true;
        }
      if (!placeholder) args.emplace_back(constants.at(c++));
    }
    node = g.add_call(op, std::move(args));
    node->result()->set_meta(kHostDouble);
    g.set_output({node->result()});
  }

  // ATen's value and the host arithmetic's, for placeholders x and y.
  std::pair<double, double> run(double x, double y) const {
    const auto h = host_arith_of(*node);
    REQUIRE(h.has_value());
    torch::jit::Stack stack;
    std::array<double, 2> operand = h->constant;
    std::array<double, 2> values{x, y};
    size_t placeholder = 0;
    for (const ir::Argument& a : node->args()) {
      if (a.is_value()) {
        stack.emplace_back(at::scalar_tensor(values[placeholder++], at::kDouble));
      } else {
        stack.push_back(a.constant());
      }
    }
    for (size_t i = 0; i < 2; ++i)
      if (h->arg[i] >= 0) operand[i] = stack[static_cast<size_t>(h->arg[i])].toTensor().item<double>();
    node->op().callBoxed(stack);
    return {stack.at(0).toTensor().item<double>(), evaluate(*h, operand[0], operand[1])};
  }
};

const std::vector<double>& values() {
  constexpr double inf = std::numeric_limits<double>::infinity();
  static const std::vector<double> v = {0.0,   -0.0, 1.0,  -1.0,         0.9, 0.999, 3.0,  -2.5, 1e-300,
                                        1e300, inf,  -inf, std::nan(""), 0.5, 100.0, 7.25, 1e-8, -1e-8};
  return v;
}

}  // namespace

TEST_CASE("host arithmetic computes what ATen's CPU kernels compute on 0-dim float64 tensors", "[inductor][host]") {
  struct Op {
    std::string name;
    std::vector<c10::IValue> constants;
    std::vector<int> placeholders;  // argument positions of %a and %b
  };
  const std::vector<Op> ops = {
      {"aten::add.Tensor", {}, {0, 1}},
      {"aten::add.Tensor", {c10::IValue(-1)}, {0, 1}},
      {"aten::sub.Tensor", {}, {0, 1}},
      {"aten::rsub.Tensor", {}, {0, 1}},
      {"aten::add.Scalar", {c10::IValue(1)}, {0}},
      {"aten::add.Scalar", {c10::IValue(0.1)}, {0}},
      {"aten::sub.Scalar", {c10::IValue(0.3), c10::IValue(-1)}, {0}},
      {"aten::rsub.Scalar", {c10::IValue(1)}, {0}},
      {"aten::mul.Tensor", {}, {0, 1}},
      {"aten::mul.Scalar", {c10::IValue(1e-2)}, {0}},
      {"aten::div.Tensor", {}, {0, 1}},
      {"aten::div.Scalar", {c10::IValue(3.0)}, {0}},
      {"aten::neg", {}, {0}},
      {"aten::reciprocal", {}, {0}},
      {"aten::pow.Scalar", {c10::IValue(0.9)}, {1}},
      {"aten::pow.Scalar", {c10::IValue(0.999)}, {1}},
      {"aten::pow.Scalar", {c10::IValue(1.0)}, {1}},
      {"aten::pow.Scalar", {c10::IValue(-2.0)}, {1}},
      {"aten::pow.Tensor_Tensor", {}, {0, 1}},
      {"aten::pow.Tensor_Scalar", {c10::IValue(0.0)}, {0}},
      {"aten::pow.Tensor_Scalar", {c10::IValue(1)}, {0}},
      {"aten::pow.Tensor_Scalar", {c10::IValue(2)}, {0}},
      {"aten::pow.Tensor_Scalar", {c10::IValue(3.0)}, {0}},
      {"aten::pow.Tensor_Scalar", {c10::IValue(-1.0)}, {0}},
      {"aten::pow.Tensor_Scalar", {c10::IValue(1.7)}, {0}},
  };
  for (const Op& op : ops) {
    const Case c(op.name, op.constants, op.placeholders);
    for (double x : values())
      for (double y : values()) {
        const auto [aten, host] = c.run(x, y);
        INFO(op.name << " of " << x << ", " << y << ": ATen " << aten << ", host " << host);
        CHECK(same_bits(aten, host));
      }
  }
}

TEST_CASE("host arithmetic leaves to ATen what it does not compute as ATen does", "[inductor][host]") {
  // alpha other than ±1: ATen's a + alpha * b may be a fused multiply-add.
  CHECK_FALSE(host_arith_of(*Case("aten::add.Tensor", {c10::IValue(0.5)}, {0, 1}).node));
  // Square roots (ATen's vectorized math library rounds sqrt(0.5) otherwise
  // than std::sqrt), 1 / sqrt(x) and 1 / (x * x).
  CHECK_FALSE(host_arith_of(*Case("aten::sqrt", {}, {0}).node));
  CHECK_FALSE(host_arith_of(*Case("aten::pow.Tensor_Scalar", {c10::IValue(0.5)}, {0}).node));
  CHECK_FALSE(host_arith_of(*Case("aten::pow.Tensor_Scalar", {c10::IValue(-0.5)}, {0}).node));
  CHECK_FALSE(host_arith_of(*Case("aten::pow.Tensor_Scalar", {c10::IValue(-2.0)}, {0}).node));
  // A rounding mode, a float32 result, a tensor with elements.
  CHECK_FALSE(host_arith_of(*Case("aten::div.Tensor_mode", {c10::IValue("floor")}, {0, 1}).node));
  Case f("aten::mul.Tensor", {}, {0, 1});
  f.node->result()->set_meta(ir::TensorMeta::contiguous({}, c10::kFloat));
  CHECK_FALSE(host_arith_of(*f.node));
  Case v("aten::mul.Tensor", {}, {0, 1});
  v.node->result()->set_meta(ir::TensorMeta::contiguous({3}, c10::kDouble));
  CHECK_FALSE(host_arith_of(*v.node));
  Case cuda("aten::mul.Tensor", {}, {0, 1});
  cuda.node->result()->set_meta(ir::TensorMeta::contiguous({}, c10::kDouble, c10::Device(c10::kCUDA, 0)));
  CHECK_FALSE(host_arith_of(*cuda.node));
}
