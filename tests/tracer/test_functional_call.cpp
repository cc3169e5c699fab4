// functional_call over torch::nn modules, joint graphs, fake mode and
// determinism: every test interprets the traced graph and compares it with
// eager LibTorch on the same inputs and parameters.
#include "catch.h"
#include "module_testing.h"
#include "testing.h"
#include "tracer_testing.h"

#include <crucible/ir/printer.h>
#include <crucible/models/zoo.h>
#include <crucible/tracer/error.h>
#include <crucible/tracer/functional_call.h>

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/instancenorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/types.h>
#include <torch/utils.h>

using crucible::testing::count_calls;
using crucible::testing::module_graph_inputs;
using crucible::testing::run_traced;
using crucible::tracer::functional_call;
using crucible::tracer::ModuleTraceOptions;
using crucible::tracer::TraceError;
using crucible::tracer::TraceMode;
using Tensors = std::vector<at::Tensor>;
namespace ir = crucible::ir;

namespace {

crucible::tracer::ModuleFn forward_of(const crucible::models::Model& model) {
  return [&model](torch::nn::Module&, const Tensors& in) { return Tensors{model.forward(in[0])}; };
}

struct TiedNet : torch::nn::Module {
  TiedNet() {
    emb = register_module("emb", torch::nn::Embedding(10, 6));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({6})));
    proj = register_module("proj", torch::nn::Linear(6, 6));
    register_module("proj_again", proj);  // the same Linear under a second name
    register_buffer("scale", torch::full({6}, 0.5));
  }
  torch::Tensor forward(const torch::Tensor& tokens) { return proj(norm(emb(tokens))) * named_buffers()["scale"]; }
  torch::nn::Embedding emb{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear proj{nullptr};
};

}  // namespace

TEST_CASE("functional_call lifts parameters and replays the MLP and the ConvNet", "[tracer]") {
  for (const char* name : {"mlp", "convnet"}) {
    torch::manual_seed(0);
    auto model = crucible::models::make_model(name);
    auto batch = model.example_batch(4, 1);
    auto r = functional_call(*model.module, forward_of(model), {batch.inputs});
    const auto params = model.module->named_parameters();
    const auto& specs = r.graph.signature().inputs;
    REQUIRE(specs.size() == params.size() + 1);
    for (size_t i = 0; i < params.size(); ++i) {
      REQUIRE(specs[i].kind == ir::InputKind::Parameter);
      REQUIRE(specs[i].target == params[i].key());
    }
    REQUIRE(specs.back().kind == ir::InputKind::UserInput);
    // Same kernels in the same order: bitwise equal.
    torch::NoGradGuard no_grad;
    REQUIRE_EQUAL_TENSORS(run_traced(r, module_graph_inputs(*model.module, {batch.inputs}))[0],
                          model.forward(batch.inputs));
  }
}

TEST_CASE("functional_call: a parameter pointed at a computed value by set_data is traced as that value", "[tracer]") {
  // What spmd's fully-sharded step does (Note [Fully-sharded step]): the
  // module reads its parameter, whose data is, for a while, a traced value
  // of other sizes; the TensorImpl stays the parameter's. In both modes.
  torch::manual_seed(4);
  torch::nn::Linear linear(3, 2);
  const at::Tensor x = torch::randn({5, 3});
  auto fn = [&](torch::nn::Module&, const Tensors& in) {
    const at::Tensor& w = linear->weight;
    const at::Tensor own = w.variable_data();
    w.set_data(at::cat({own, own}, 1).narrow(1, 1, 3) * 2);  // a value of other storage
    at::Tensor out = linear->forward(in[0]);
    w.set_data(own);
    return Tensors{out, w * 1};  // read again: the placeholder's value
  };
  for (const TraceMode mode : {TraceMode::Real, TraceMode::Fake}) {
    CAPTURE(static_cast<int>(mode));
    ModuleTraceOptions options;
    options.trace.mode = mode;
    const auto r = functional_call(*linear, fn, {x}, options);
    torch::NoGradGuard no_grad;
    const at::Tensor w = linear->weight.detach();
    const Tensors out = run_traced(r, module_graph_inputs(*linear, {x}));
    const at::Tensor moved = at::cat({w, w}, 1).narrow(1, 1, 3) * 2;
    REQUIRE_EQUAL_TENSORS(out[0], at::linear(x, moved, linear->bias));
    REQUIRE_EQUAL_TENSORS(out[1], w);
  }
}

TEST_CASE("functional_call: embedding, LayerNorm, buffers and a module registered twice", "[tracer]") {
  torch::manual_seed(1);
  auto net = std::make_shared<TiedNet>();
  auto tokens = torch::tensor({{1, 2, 9}, {0, 4, 4}}, torch::kLong);
  auto r = functional_call(*net, [&](torch::nn::Module&, const Tensors& in) { return Tensors{net->forward(in[0])}; },
                           {tokens});
  const auto& specs = r.graph.signature().inputs;
  // emb.weight, norm.weight, norm.bias, proj.weight, proj.bias, proj_again.weight, proj_again.bias, scale, tokens
  REQUIRE(specs.size() == 9);
  REQUIRE(specs[5].target == "proj_again.weight");
  REQUIRE(specs[5].duplicate_of == std::optional<size_t>(3));
  REQUIRE(specs[6].duplicate_of == std::optional<size_t>(4));
  REQUIRE(specs[7].kind == ir::InputKind::Buffer);
  REQUIRE(specs[7].target == "scale");
  REQUIRE(!r.graph.placeholders()[5]->has_users());
  torch::NoGradGuard no_grad;
  REQUIRE_EQUAL_TENSORS(run_traced(r, module_graph_inputs(*net, {tokens}))[0], net->forward(tokens));
}

TEST_CASE("functional_call: a joint trace of loss.backward() gives eager's gradients", "[tracer]") {
  torch::manual_seed(2);
  auto model = crucible::models::make_model("mlp");
  auto batch = model.example_batch(8, 3);
  auto step = [&](torch::nn::Module&, const Tensors& in) {
    auto loss = model.loss(model.forward(in[0]), in[1]);
    loss.backward();
    return Tensors{loss.detach()};
  };
  ModuleTraceOptions options;
  options.gradients_as_outputs = true;
  auto r = functional_call(*model.module, step, {batch.inputs, batch.targets}, options);
  const auto grads = r.graph.signature().outputs_of(ir::OutputKind::Gradient);
  const auto params = model.module->parameters();
  REQUIRE(grads.size() == params.size());
  size_t backward = 0;
  for (auto* n : r.graph.nodes()) backward += n->has_tag("backward");
  REQUIRE(backward > 0);
  // Tracing left the module's gradients alone.
  for (const auto& p : params) REQUIRE(!p.grad().defined());

  auto actual = run_traced(r, module_graph_inputs(*model.module, {batch.inputs, batch.targets}));
  auto loss = model.loss(model.forward(batch.inputs), batch.targets);
  loss.backward();
  REQUIRE_EQUAL_TENSORS(actual[0], loss.detach());
  for (size_t g = 0; g < grads.size(); ++g) {
    const auto input_index = *r.graph.signature().outputs[grads[g]].input_index;
    // Same kernels in the same order as eager's backward: bitwise equal.
    REQUIRE_EQUAL_TENSORS(actual[grads[g]], params[input_index].grad());
  }
}

TEST_CASE("functional_call keeps the module's tensors bit for bit when the trace throws", "[tracer]") {
  torch::manual_seed(3);
  auto model = crucible::models::make_model("mlp");
  auto batch = model.example_batch(2, 4);
  for (auto& p : model.module->parameters()) p.mutable_grad() = torch::randn_like(p);
  std::vector<std::pair<at::Tensor, at::Tensor>> before;  // value, grad
  std::vector<const void*> storages;
  for (auto& p : model.module->parameters()) {
    before.emplace_back(p.detach().clone(), p.grad().clone());
    storages.push_back(p.data_ptr());
  }
  auto bad_step = [&](torch::nn::Module& m, const Tensors& in) {
    auto loss = model.loss(model.forward(in[0]), in[1]);
    loss.backward();
    torch::NoGradGuard no_grad;
    for (auto& p : m.parameters()) p.sub_(p.grad() * 0.1);  // a real update, inside the trace
    if (loss.item<float>() > -1.0f) throw std::runtime_error("unreachable");
    return Tensors{loss};
  };
  REQUIRE_THROWS_WITH(functional_call(*model.module, bad_step, {batch.inputs, batch.targets}),
                      CRUCIBLE_HAS_SUBSTR("aten::_local_scalar_dense"));
  auto params = model.module->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    REQUIRE(params[i].data_ptr() == storages[i]);
    REQUIRE_EQUAL_TENSORS(params[i].detach(), before[i].first);
    REQUIRE_EQUAL_TENSORS(params[i].grad(), before[i].second);
    REQUIRE(params[i].requires_grad());
  }
}

TEST_CASE("tracing twice gives the same printed graph", "[tracer]") {
  torch::manual_seed(4);
  auto model = crucible::models::make_model("convnet");
  auto batch = model.example_batch(2, 5);
  auto a = functional_call(*model.module, forward_of(model), {batch.inputs});
  auto b = functional_call(*model.module, forward_of(model), {batch.inputs});
  REQUIRE(ir::to_text(a.graph) == ir::to_text(b.graph));
}

TEST_CASE("fake mode: meta tensors, with CPU stand-ins for ops without a Meta kernel", "[tracer]") {
  crucible::tracer::TraceOptions fake;
  fake.mode = TraceMode::Fake;
  // Every op here has a Meta kernel (structured kernels: addmm, tanh, _softmax).
  auto fn = [](const Tensors& in) { return Tensors{torch::softmax(torch::tanh(torch::matmul(in[0], in[1])), 1)}; };
  Tensors inputs = {torch::randn({3, 4}), torch::randn({4, 5})};
  auto r = crucible::tracer::make_fx(fn, inputs, fake);
  REQUIRE(r.graph.outputs()[0]->meta().sizes == std::vector<int64_t>{3, 5});
  // The device the value will live on, not the meta device (Note [Devices in fake mode]).
  REQUIRE(r.graph.outputs()[0]->meta().device.is_cpu());
  REQUIRE(r.stand_in_ops.empty());
  REQUIRE_EQUAL_TENSORS(run_traced(r, inputs)[0], fn(inputs)[0]);

  // The MLP uses aten::relu, which has no Meta kernel in LibTorch 2.11: it runs
  // on zero-filled CPU stand-ins (Note [Fake mode]) and the graph is the one a
  // real trace records, with the same metadata.
  torch::manual_seed(5);
  auto model = crucible::models::make_model("mlp");
  auto batch = model.example_batch(4, 6);
  ModuleTraceOptions fake_module;
  fake_module.trace.mode = TraceMode::Fake;
  auto before = model.module->parameters()[0].detach().clone();
  auto f = functional_call(*model.module, forward_of(model), {batch.inputs}, fake_module);
  auto real = functional_call(*model.module, forward_of(model), {batch.inputs});
  REQUIRE(count_calls(f.graph, "aten::relu") == 2);
  REQUIRE(f.stand_in_ops == std::vector<std::string>{"aten::relu"});
  REQUIRE(ir::to_text(f.graph) == ir::to_text(real.graph));
  REQUIRE(model.module->parameters()[0].device().is_cpu());
  REQUIRE_EQUAL_TENSORS(model.module->parameters()[0].detach(), before);
  torch::NoGradGuard no_grad;
  REQUIRE_EQUAL_TENSORS(run_traced(f, module_graph_inputs(*model.module, {batch.inputs}))[0],
                        model.forward(batch.inputs));
}

TEST_CASE("functionalize: a module's in-place state writes become MutatedInput outputs", "[tracer]") {
  torch::manual_seed(6);
  auto bn = std::make_shared<torch::nn::BatchNorm2dImpl>(3);
  bn->train();
  auto x = torch::randn({2, 3, 4, 4});
  ModuleTraceOptions options;
  options.trace.functionalize = true;
  auto r = functional_call(
      *bn, [&](torch::nn::Module&, const Tensors& in) { return Tensors{bn->forward(in[0])}; }, {x}, options);
  // BatchNorm's `num_batches_tracked += 1` is recorded out of place, and its
  // running statistics through the functional batch norm (Note [Ops with
  // hidden writes]); each buffer's new value comes back as an output (Note
  // [Functionalizing module state]).
  REQUIRE(count_calls(r.graph, "aten::add_.Scalar") == 0);
  REQUIRE(count_calls(r.graph, "aten::add.Scalar") == 1);
  REQUIRE(count_calls(r.graph, "aten::native_batch_norm") == 0);
  REQUIRE(count_calls(r.graph, "aten::_native_batch_norm_legit_functional") == 1);
  for (const ir::Node* n : r.graph.nodes()) REQUIRE_FALSE(n->is_mutating());
  const auto& outs = r.graph.signature().outputs;
  REQUIRE(outs.size() == 4);
  // weight, bias, running_mean, running_var, num_batches_tracked
  for (size_t k = 1; k < 4; ++k) REQUIRE(outs[k] == ir::OutputSpec{ir::OutputKind::MutatedInput, k + 1});
  REQUIRE(r.input_mutations[2].data);
  REQUIRE(r.input_mutations[4].data);
  // Tracing left the module's buffers alone.
  REQUIRE(bn->num_batches_tracked.item<int64_t>() == 0);

  Tensors graph_in = module_graph_inputs(*bn, {x});
  const Tensors before = crucible::testing::clones(graph_in);
  auto actual = run_traced(r, graph_in);
  auto expected = bn->forward(x);
  // The same kernels on the CPU: bitwise equal; the graph writes none of its inputs.
  REQUIRE_EQUAL_TENSORS(actual[0], expected.detach());
  REQUIRE_EQUAL_TENSORS(actual[1], bn->running_mean);
  REQUIRE_EQUAL_TENSORS(actual[2], bn->running_var);
  REQUIRE(actual[3].item<int64_t>() == bn->num_batches_tracked.item<int64_t>());
  for (size_t i = 0; i < graph_in.size(); ++i) REQUIRE_EQUAL_TENSORS(graph_in[i], before[i]);
}

TEST_CASE("functionalize: in-place writes to tensors computed from module state alone, and through its alias",
          "[tracer]") {
  // A weight standardized in place (no functional wrapper: it is computed
  // from a parameter alone), and InstanceNorm's running statistics, which
  // instance_norm writes through aten::alias after a batch norm over their
  // repeats.
  torch::manual_seed(7);
  auto lin = std::make_shared<torch::nn::LinearImpl>(5, 5);
  auto norm = std::make_shared<torch::nn::InstanceNorm1dImpl>(
      torch::nn::InstanceNorm1dOptions(4).affine(true).track_running_stats(true));
  auto m = std::make_shared<torch::nn::Module>();
  m->register_module("lin", lin);
  m->register_module("norm", norm);
  m->train();
  auto forward = [&](const at::Tensor& x) {
    at::Tensor w = lin->weight - lin->weight.mean();
    w.div_(w.std());
    return norm->forward(at::linear(x, w, lin->bias));
  };
  const at::Tensor x = torch::randn({3, 4, 5});
  ModuleTraceOptions options;
  options.trace.functionalize = true;
  auto r = functional_call(
      *m, [&](torch::nn::Module&, const Tensors& in) { return Tensors{forward(in[0])}; }, {x}, options);
  for (const ir::Node* n : r.graph.nodes()) REQUIRE_FALSE(n->is_mutating());
  Tensors graph_in = module_graph_inputs(*m, {x});
  const auto actual = run_traced(r, graph_in);
  const at::Tensor expected = forward(x);
  REQUIRE_CLOSE(actual[0], expected.detach(), 1e-6, 1e-6);
  // running_mean and running_var come back as written.
  REQUIRE(actual.size() == 3);
  REQUIRE_CLOSE(actual[1], norm->running_mean, 1e-6, 1e-6);
  REQUIRE_CLOSE(actual[2], norm->running_var, 1e-6, 1e-6);

  // A write through a view of such a tensor would not reach the tensor.
  auto through_view = [&](torch::nn::Module&, const Tensors& in) {
    at::Tensor w = lin->weight.clone();
    w.select(1, 0).mul_(0.5);
    return Tensors{at::linear(in[0], w)};
  };
  REQUIRE_THROWS_AS(functional_call(*m, through_view, {x}, options), TraceError);
}
