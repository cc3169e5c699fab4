// Every zoo model's graphs — forward (make_fx, functional_call real, fake and
// functionalized), joint, aot_export_module's, AOTAutograd's forward and
// backward, the compiled train step — carry the metadata their ops derive,
// and keep it through every built-in pass; each pass leaves what the graph
// computes unchanged (bitwise, but for fuse_addmm: see kAddmmRtol).
#include <crucible/autograd/aot_export.h>
#include <crucible/ir/interpreter.h>
#include <crucible/ir/pass_manager.h>
#include <crucible/ir/verifier.h>
#include <crucible/models/zoo.h>
#include <crucible/pipeline/builder.h>
#include <crucible/tracer/functional_call.h>
#include <crucible/tracer/make_fx.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/sgd.h>

#include "catch.h"
#include "graph_testing.h"
#include "module_testing.h"
#include "testing.h"

using namespace crucible;

namespace {

// fuse_addmm replaces mm then add by addmm, which adds the bias inside the
// GEMM (C := A*B + beta*C). On the 2-core CPU machine the zoo's graphs come
// out bitwise equal, but a BLAS may fold beta*C in at another point of the
// accumulation: a few float32 ulps of the products' terms (sums of up to 256
// terms of size ~1: 1e-5 absolute), carried through the layers after it
// (1e-5 relative). fuse_attention's fused kernel sums the scores and the
// softmax in its own order: the same few ulps (3e-7 measured on the GPT).
constexpr double kAddmmRtol = 1e-5;
constexpr double kAddmmAtol = 1e-5;

struct ZooGraph {
  std::string name;
  ir::Graph graph;
  /// One per placeholder (empty: not run); cloned for every run.
  std::vector<at::Tensor> inputs;
};

std::vector<at::Tensor> clones(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> r;
  for (const at::Tensor& t : ts) r.push_back(t.defined() ? t.detach().clone() : t);
  return r;
}

tracer::ModuleFn forward_of(const models::Model& m) {
  return
      [&m](torch::nn::Module&, const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{m.forward(in[0])}; };
}

tracer::ModuleFn module_loss(const models::Model& m) {
  return [&m](torch::nn::Module&, const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{m.loss(m.forward(in[0]), in[1])};
  };
}

// The graphs of one model, each with inputs to run it on.
std::vector<ZooGraph> zoo_graphs(const std::string& name) {
  at::manual_seed(0);
  const models::Model model = models::make_model(name);
  model.module->train();
  torch::nn::Module& module = *model.module;
  const data::Batch batch = model.example_batch(2, 0);
  std::vector<ZooGraph> graphs;

  for (const bool functionalize : {false, true}) {
    tracer::ModuleTraceOptions o;
    o.trace.functionalize = functionalize;
    graphs.push_back({functionalize ? "forward, functionalized" : "forward",
                      tracer::functional_call(module, forward_of(model), {batch.inputs}, o).graph,
                      testing::module_graph_inputs(module, {batch.inputs})});
  }
  {
    tracer::ModuleTraceOptions o;
    o.trace.mode = tracer::TraceMode::Fake;
    // Not run: a factory call it recorded makes meta tensors (arange on the
    // device of a meta input), as it did while tracing.
    graphs.push_back(
        {"forward, fake mode", tracer::functional_call(module, forward_of(model), {batch.inputs}, o).graph, {}});
  }
  {
    tracer::TraceResult r = tracer::make_fx(
        [&](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{model.forward(in[0])}; },
        {batch.inputs});
    std::vector<at::Tensor> inputs{batch.inputs};
    for (const tracer::LiftedTensor& l : r.lifted) inputs.push_back(l.tensor);
    graphs.push_back({"make_fx forward (module state lifted)", std::move(r.graph), inputs});
  }
  {
    tracer::ModuleTraceOptions o;
    o.trace.functionalize = true;
    o.gradients_as_outputs = true;
    auto step = [&](torch::nn::Module& m, const std::vector<at::Tensor>& in) {
      at::Tensor loss = module_loss(model)(m, in)[0];
      loss.backward();
      return std::vector<at::Tensor>{loss.detach()};
    };
    graphs.push_back({"joint (functional_call, loss.backward())",
                      tracer::functional_call(module, step, {batch.inputs, batch.targets}, o).graph,
                      testing::module_graph_inputs(module, {batch.inputs, batch.targets})});
  }
  graphs.push_back({"aot_export_module inference",
                    autograd::aot_export_module(module, forward_of(model), {batch.inputs}, {}),
                    testing::module_graph_inputs(module, {batch.inputs})});
  graphs.push_back({"aot_export_module joint",
                    autograd::aot_export_module(module, module_loss(model), {batch.inputs, batch.targets},
                                                {.trace_joint = true, .output_loss_index = 0}),
                    testing::module_graph_inputs(module, {batch.inputs, batch.targets})});
  {
    // AOTAutograd's partitioned graphs, as its compilers receive them.
    std::vector<ZooGraph> captured;
    pipeline::Builder b;
    b.passes({}).backend("capture", [&](const ir::Graph& g, const std::vector<at::Tensor>& examples) {
      captured.push_back(
          {captured.empty() ? "aot_module forward" : "aot_module backward", g.clone(), clones(examples)});
      return ir::interpret(g);
    });
    const autograd::AotModule compiled = b.compile(model.module, module_loss(model));
    compiled({batch.inputs, batch.targets})[0].backward();
    module.zero_grad();
    REQUIRE(captured.size() == 2);
    for (ZooGraph& c : captured) graphs.push_back(std::move(c));
  }
  {
    torch::optim::SGD sgd(module.parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    pipeline::Builder b;
    b.passes({});
    const pipeline::TrainStep step = b.compile_train_step(model.module, sgd, models::loss_of(model));
    step.compile({batch.inputs, batch.targets});
    graphs.push_back({"train step", step.graph().clone(), clones(step.graph_inputs({batch.inputs, batch.targets}))});
  }
  return graphs;
}

// The graph's outputs and its inputs after the run (a train step writes its
// state in place), on copies of `inputs`, with a fixed random stream; nothing
// for a graph without inputs to run on.
std::vector<at::Tensor> run(const ir::Graph& g, const std::vector<at::Tensor>& inputs) {
  if (inputs.empty()) return {};
  std::vector<at::Tensor> in = clones(inputs);
  std::vector<at::Tensor> results = in;
  at::manual_seed(5);
  std::vector<at::Tensor> out = ir::Interpreter(g).run(in);
  results.insert(results.end(), out.begin(), out.end());
  return results;
}

void require_same_results(const std::vector<at::Tensor>& after, const std::vector<at::Tensor>& before, bool bitwise) {
  REQUIRE(after.size() == before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    INFO("result " << i << " (inputs after the run, then outputs)");
    if (bitwise)
      REQUIRE_EQUAL_TENSORS(after[i], before[i]);
    else
      REQUIRE_CLOSE(after[i], before[i], kAddmmRtol, kAddmmAtol);
  }
}

}  // namespace

TEST_CASE(
    "every zoo graph's metadata is what its ops derive, after every built-in pass, and the passes keep "
    "what it computes",
    "[ir][meta][zoo]") {
  const ir::PassRegistry registry = ir::PassRegistry::builtin();
  std::vector<std::vector<std::string>> pass_lists;
  for (const std::string& p : registry.names()) pass_lists.push_back({p});
  pass_lists.push_back({"fold_view_chains", "fuse_addmm", "cse", "dce"});
  for (const std::string& model : models::model_names()) {
    for (ZooGraph& z : zoo_graphs(model)) {
      INFO(model << ": " << z.name);
      REQUIRE_NOTHROW(ir::verify(z.graph, ir::VerifyOptions{.check_meta = true}));
      const std::vector<at::Tensor> before = run(z.graph, z.inputs);
      for (const std::vector<std::string>& passes : pass_lists) {
        std::string names;
        for (const std::string& p : passes) names += p + " ";
        INFO("passes: " << names);
        ir::Graph g = z.graph.clone();
        ir::PassManager(registry.passes(passes), ir::PassManagerOptions{.verify_meta = true}).run(g);
        // Fused matmuls and attention sum in another order.
        const bool bitwise = std::find(passes.begin(), passes.end(), "fuse_addmm") == passes.end() &&
                             std::find(passes.begin(), passes.end(), "fuse_attention") == passes.end() &&
                             std::find(passes.begin(), passes.end(), "fuse_flash_attention") == passes.end();
        require_same_results(run(g, z.inputs), before, bitwise);
        // The rewrites do apply: GPT's 8 Linears with a bias (4 per block)
        // become one addmm each wherever the graph holds the forward, and
        // every GPT graph has view chains to fold.
        if (model == "gpt" && passes == std::vector<std::string>{"fuse_addmm"} && z.name != "aot_module backward")
          REQUIRE(testing::count_calls(g, "aten::addmm") == 8);
        // The small GPT's two attentions are fused in its forward graphs
        // (those with a backward keep the probabilities for it, and stay).
        // fuse_flash_attention takes them too: they are on the CPU.
        if (model == "gpt" &&
            (passes == std::vector<std::string>{"fuse_attention"} ||
             passes == std::vector<std::string>{"fuse_flash_attention"}) &&
            z.name.starts_with("forward"))
          REQUIRE(testing::count_calls(g, "aten::scaled_dot_product_attention") == 2);
        if (model == "gpt" && passes == std::vector<std::string>{"fold_view_chains"})
          REQUIRE(g.num_nodes() < z.graph.num_nodes());
      }
    }
  }
}
