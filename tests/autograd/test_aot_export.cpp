// aot_export_module and aot_export_joint_simple: the exported graphs,
// interpreted, against eager; and each error the seed raises.
#include <crucible/autograd/aot_export.h>
#include <crucible/autograd/error.h>
#include <crucible/ir/interpreter.h>
#include <crucible/ir/verifier.h>

#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "catch.h"
#include "module_testing.h"
#include "testing.h"

using namespace crucible;
using crucible::testing::module_graph_inputs;
using Tensors = std::vector<at::Tensor>;

namespace {

struct Net : torch::nn::Module {
  Net() {
    fc = register_module("fc", torch::nn::Linear(6, 3));
    bn = register_module("bn", torch::nn::BatchNorm1d(3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return bn(fc(x)); }
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

tracer::ModuleFn forward_fn() {
  return [](torch::nn::Module& m, const Tensors& in) { return Tensors{static_cast<Net&>(m).forward(in[0])}; };
}

// Options of a joint export whose loss is output `loss_index`.
autograd::AotExportOptions joint(size_t loss_index) {
  autograd::AotExportOptions options;
  options.trace_joint = true;
  options.output_loss_index = loss_index;
  return options;
}

tracer::ModuleFn loss_fn() {
  return [](torch::nn::Module& m, const Tensors& in) {
    const auto out = static_cast<Net&>(m).forward(in[0]);
    return Tensors{out.detach(), torch::mse_loss(out, in[1])};
  };
}

}  // namespace

TEST_CASE("aot_export_module: the inference graph lifts parameters and buffers and returns buffer updates",
          "[autograd][export]") {
  torch::manual_seed(60);
  Net net;
  net.train();
  const auto x = torch::randn({5, 6});
  const Tensors inputs = module_graph_inputs(net, {x});
  const ir::Graph g = autograd::aot_export_module(net, forward_fn(), {x}, {});
  ir::verify(g);
  const auto& sig = g.signature();
  // fc.weight, fc.bias, bn.weight, bn.bias; bn.running_mean, running_var, num_batches_tracked; x
  REQUIRE(sig.inputs_of(ir::InputKind::Parameter).size() == 4);
  REQUIRE(sig.inputs_of(ir::InputKind::Buffer).size() == 3);
  REQUIRE(sig.inputs[0].target == "fc.weight");
  REQUIRE(sig.inputs[6].target == "bn.num_batches_tracked");
  REQUIRE(sig.inputs[7].kind == ir::InputKind::UserInput);
  // The seed's order: updated inputs (the running statistics and the
  // counter), then user outputs.
  REQUIRE(sig.outputs.size() == 4);
  for (size_t k = 0; k < 3; ++k) REQUIRE(sig.outputs[k] == ir::OutputSpec{ir::OutputKind::MutatedInput, 4 + k});
  REQUIRE(sig.outputs[3].kind == ir::OutputKind::UserOutput);
  for (const ir::Node* n : g.nodes()) REQUIRE_FALSE(n->is_mutating());
  // Exporting changed nothing of the module.
  REQUIRE(net.bn->num_batches_tracked.item<int64_t>() == 0);
  Tensors run_in = inputs;
  Tensors before;
  for (const at::Tensor& t : inputs) before.push_back(t.clone());
  const Tensors actual = ir::Interpreter(g)(run_in);
  torch::NoGradGuard no_grad;
  const auto expected = net.forward(x);
  // Same kernels in the same order: bitwise equal.
  REQUIRE_EQUAL_TENSORS(actual[3], expected);
  // The buffers as eager's forward left them, as outputs; the graph's inputs unchanged.
  REQUIRE_EQUAL_TENSORS(actual[0], net.bn->running_mean);
  REQUIRE_EQUAL_TENSORS(actual[1], net.bn->running_var);
  REQUIRE_EQUAL_TENSORS(actual[2], net.bn->num_batches_tracked);
  for (size_t i = 0; i < inputs.size(); ++i) REQUIRE_EQUAL_TENSORS(inputs[i], before[i]);
}

TEST_CASE("aot_export_module: the joint graph of a training step has the loss and eager's gradients",
          "[autograd][export]") {
  torch::manual_seed(61);
  Net net;
  const auto x = torch::randn({5, 6}), y = torch::randn({5, 3});
  const Tensors inputs = module_graph_inputs(net, {x, y});
  const autograd::AotExportOptions options = joint(1);
  const ir::Graph g = autograd::aot_export_module(net, loss_fn(), {x, y}, options);
  ir::verify(g);
  const auto& sig = g.signature();
  REQUIRE(sig.inputs_of(ir::InputKind::Tangent).empty());
  for (size_t k = 0; k < 3; ++k) REQUIRE(sig.outputs[k] == ir::OutputSpec{ir::OutputKind::MutatedInput, 4 + k});
  REQUIRE(sig.outputs[3].kind == ir::OutputKind::UserOutput);
  REQUIRE(sig.outputs[4].kind == ir::OutputKind::Loss);
  const auto grads = sig.outputs_of(ir::OutputKind::Gradient);
  REQUIRE(grads.size() == 4);
  for (const auto& p : net.parameters()) REQUIRE_FALSE(p.grad().defined());
  Tensors run_in = inputs;
  const Tensors actual = ir::Interpreter(g)(run_in);
  const auto loss = loss_fn()(net, {x, y})[1];
  loss.backward();
  REQUIRE_EQUAL_TENSORS(actual[4], loss.detach());
  const auto params = net.parameters();
  for (size_t k = 0; k < grads.size(); ++k) {
    const size_t p = *sig.outputs[grads[k]].input_index;
    // The traced backward runs eager's backward kernels in eager's order.
    REQUIRE_EQUAL_TENSORS(actual[grads[k]], params[p].grad());
  }
}

TEST_CASE("aot_export_module errors: input metadata mutation", "[autograd][export]") {
  Net net;
  auto fn = [](torch::nn::Module& m, const Tensors& in) {
    in[0].transpose_(0, 1);
    return Tensors{static_cast<Net&>(m).forward(in[0].t())};
  };
  const auto x = torch::randn({5, 6});
  REQUIRE_THROWS_WITH(autograd::aot_export_module(net, fn, {x}, {}),
                      CRUCIBLE_HAS_SUBSTR("input 7 (arg0) has its metadata written in place"));
  REQUIRE(x.sizes() == at::IntArrayRef({5, 6}));
}

TEST_CASE("aot_export_module errors: data mutation of an input that requires grad", "[autograd][export]") {
  Net net;
  auto fn = [](torch::nn::Module& m, const Tensors& in) {
    const auto h = in[0] * 2;
    in[1].mul_(2);
    return Tensors{torch::mse_loss(static_cast<Net&>(m).forward(h), in[1].detach())};
  };
  const auto leaf = torch::randn({5, 3}).requires_grad_();
  const autograd::AotExportOptions options = joint(0);
  REQUIRE_THROWS_WITH(autograd::aot_export_module(net, fn, {torch::randn({5, 6}), leaf * 1.0}, options),
                      CRUCIBLE_HAS_SUBSTR("input 8 (arg1) requires grad and its data is written in place"));
}

TEST_CASE("aot_export_module errors: a loss that is not a scalar", "[autograd][export]") {
  Net net;
  const autograd::AotExportOptions options = joint(0);
  REQUIRE_THROWS_WITH(autograd::aot_export_module(net, forward_fn(), {torch::randn({5, 6})}, options),
                      CRUCIBLE_HAS_SUBSTR("must be a scalar, but it has shape f32[5, 3]"));
}

TEST_CASE("aot_export_module errors: a loss that does not require grad", "[autograd][export]") {
  Net net;
  auto fn = [](torch::nn::Module& m, const Tensors& in) {
    return Tensors{static_cast<Net&>(m).forward(in[0]).sum().detach()};
  };
  const autograd::AotExportOptions options = joint(0);
  REQUIRE_THROWS_WITH(autograd::aot_export_module(net, fn, {torch::randn({5, 6})}, options),
                      CRUCIBLE_HAS_SUBSTR("was marked as the loss, but it does not require gradients"));
}

TEST_CASE("aot_export_module errors: an output other than the loss requires grad", "[autograd][export]") {
  Net net;
  auto fn = [](torch::nn::Module& m, const Tensors& in) {
    const auto out = static_cast<Net&>(m).forward(in[0]);
    return Tensors{out, out.sum()};
  };
  const autograd::AotExportOptions options = joint(1);
  REQUIRE_THROWS_WITH(
      autograd::aot_export_module(net, fn, {torch::randn({5, 6})}, options),
      CRUCIBLE_HAS_SUBSTR("output 0 requires gradients but is not the loss") && CRUCIBLE_HAS_SUBSTR(".detach()"));
}

TEST_CASE("aot_export_module errors: trace_joint without output_loss_index", "[autograd][export]") {
  Net net;
  autograd::AotExportOptions options;
  options.trace_joint = true;
  REQUIRE_THROWS_WITH(
      autograd::aot_export_module(net, loss_fn(), {torch::randn({5, 6}), torch::randn({5, 3})}, options),
      CRUCIBLE_HAS_SUBSTR("output_loss_index"));
}

TEST_CASE("aot_export_joint_simple: the joint graph of Note [Joint graph contract], interpreted as eager",
          "[autograd][export]") {
  auto fn = [](const Tensors& in) { return Tensors{at::tanh(at::mm(in[0], in[1])), in[0].detach().sum()}; };
  torch::manual_seed(62);
  const auto a = torch::randn({3, 4}).requires_grad_(), b = torch::randn({4, 2}).requires_grad_();
  const ir::Graph g = autograd::aot_export_joint_simple(fn, {a, b}, /*trace_joint=*/true);
  ir::verify(g);
  const auto& sig = g.signature();
  REQUIRE(sig.inputs_of(ir::InputKind::Tangent).size() == 1);  // output 1 needs no gradient
  REQUIRE(sig.outputs_of(ir::OutputKind::Gradient).size() == 2);
  const auto tangent = torch::randn({3, 2});
  Tensors in{a.detach(), b.detach(), tangent};
  const Tensors actual = ir::Interpreter(g)(in);
  const auto expected = fn({a, b});
  const auto grads = torch::autograd::grad({expected[0]}, {a, b}, {tangent});
  REQUIRE_EQUAL_TENSORS(actual[0], expected[0].detach());
  REQUIRE_EQUAL_TENSORS(actual[1], expected[1]);
  REQUIRE_EQUAL_TENSORS(actual[2], grads[0]);
  REQUIRE_EQUAL_TENSORS(actual[3], grads[1]);
  // Without trace_joint: the inference graph.
  const ir::Graph inference = autograd::aot_export_joint_simple(fn, {a, b}, /*trace_joint=*/false);
  REQUIRE(inference.signature().outputs.size() == 2);
}

TEST_CASE("aot_export_joint_simple errors: input mutation and aliased outputs", "[autograd][export]") {
  const auto x = torch::randn({3});
  REQUIRE_THROWS_WITH(autograd::aot_export_joint_simple(
                          [](const Tensors& in) {
                            in[0].add_(1);
                            return Tensors{in[0] * 2};
                          },
                          {x}, false),
                      CRUCIBLE_HAS_SUBSTR("input 0 is written in place"));
  REQUIRE_THROWS_WITH(autograd::aot_export_joint_simple(
                          [](const Tensors& in) {
                            return Tensors{in[0].view({3, 1})};
                          },
                          {x}, false),
                      CRUCIBLE_HAS_SUBSTR("output 0 is alias_of_input (of 0)"));
}
