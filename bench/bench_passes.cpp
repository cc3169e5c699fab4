// Per-pass times over every zoo model's graphs, and what the pattern
// rewrites buy the interpreter on GPT graphs:
//   BM_Pass/<pass>/<model>/<graph>   one built-in pass (ir::PassRegistry::builtin())
//                                    on a fresh copy of the graph (the copy untimed)
//   BM_Verify/<model>/<graph>        ir::verify (structure, schemas, use lists),
//                                    as the pass manager runs it between passes
//   BM_VerifyMeta/<model>/<graph>    ir::verify with VerifyOptions::check_meta
//   BM_InterpretRewritten/<gpt>/<graph>/<passes>
//                                    one interpreter run of the graph after dce+cse
//                                    and then nothing, fold_view_chains, fuse_addmm
//                                    or both (counter `nodes`: the graph's calls)
//   BM_InterpretLinear3d/<gpt>/<passes>
//                                    the same for one Linear on 3-D input as
//                                    at::matmul traces it, followed by two views
//                                    (GPT's c_fc: [B*T, n_embd] -> [B*T, 4 n_embd])
//   BM_InterpretViewChain/<passes>   the same for three views and a neg
// <graph> is the forward (functional_call, functionalized), the joint
// (forward, loss.backward(), gradients as outputs) and the train step (SGD
// with momentum, compiled with no pass). <gpt> is the zoo's GPT (2 layers,
// n_embd 64, T 32, batch 8) or a wider one (4 layers, n_embd 256, T 64,
// vocab 256, batch 8).
#include "zoo_setup.h"

#include <crucible/ir/interpreter.h>
#include <crucible/ir/parser.h>
#include <crucible/ir/pass_manager.h>
#include <crucible/ir/verifier.h>

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

namespace {

using namespace crucible;

struct ZooGraphs {
  std::unique_ptr<bench::ZooSetup> setup;
  pipeline::TrainStep step;
  std::map<std::string, ir::Graph> graphs;  // forward, joint, train_step
  std::map<std::string, std::vector<at::Tensor>> inputs;
};

const std::vector<std::string>& graph_kinds() {
  static const std::vector<std::string> kinds = {"forward", "joint", "train_step"};
  return kinds;
}

std::unique_ptr<ZooGraphs> make_graphs(std::unique_ptr<bench::ZooSetup> setup) {
  auto z = std::make_unique<ZooGraphs>();
  z->graphs["forward"] = setup->trace_forward(/*functionalize=*/true).graph;
  z->graphs["joint"] = setup->trace_joint().graph;
  z->step = setup->unoptimized_step();
  z->graphs["train_step"] = z->step.graph().clone();
  // The forward's placeholders: parameters, buffers, then the batch's inputs.
  std::vector<at::Tensor> fwd;
  for (const auto& p : setup->model.module->named_parameters()) fwd.push_back(p.value().detach());
  for (const auto& b : setup->model.module->named_buffers()) fwd.push_back(b.value().detach());
  fwd.push_back(setup->batch[0]);
  z->inputs["forward"] = fwd;
  z->inputs["train_step"] = z->step.graph_inputs(setup->batch);
  z->setup = std::move(setup);
  return z;
}

// Built once per model, on first use (tracing and compiling take a while).
const ZooGraphs& zoo_graphs(const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<ZooGraphs>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto& z = cache[name];
  if (!z) {
    if (name == "gpt-wide") {
      torch::manual_seed(0);
      z = make_graphs(std::make_unique<bench::ZooSetup>(
          models::make_gpt({.vocab_size = 256, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 256}), 8));
    } else {
      z = make_graphs(std::make_unique<bench::ZooSetup>(name));
    }
  }
  return *z;
}

void pass(benchmark::State& state, const std::string& pass, const std::string& model, const std::string& kind) {
  const ir::Graph& graph = zoo_graphs(model).graphs.at(kind);
  const ir::PassManager manager({ir::PassRegistry::builtin().get(pass)}, ir::PassManagerOptions{.verify = false});
  for (auto _ : state) {
    state.PauseTiming();
    ir::Graph g = graph.clone();
    state.ResumeTiming();
    manager.run(g);
  }
  state.counters["nodes"] = static_cast<double>(graph.num_nodes());
}

void verify(benchmark::State& state, const std::string& model, const std::string& kind) {
  const ir::Graph& graph = zoo_graphs(model).graphs.at(kind);
  for (auto _ : state) ir::verify(graph);
  state.counters["nodes"] = static_cast<double>(graph.num_nodes());
}

void verify_meta(benchmark::State& state, const std::string& model, const std::string& kind) {
  const ir::Graph& graph = zoo_graphs(model).graphs.at(kind);
  for (auto _ : state) ir::verify(graph, ir::VerifyOptions{.check_meta = true});
  state.counters["nodes"] = static_cast<double>(graph.num_nodes());
}

void interpret_rewritten(benchmark::State& state, const std::string& model, const std::string& kind,
                         const std::vector<std::string>& rewrites) {
  const ZooGraphs& z = zoo_graphs(model);
  ir::Graph g = z.graphs.at(kind).clone();
  std::vector<std::string> passes = {"dce", "cse"};
  passes.insert(passes.end(), rewrites.begin(), rewrites.end());
  ir::PassManager(ir::PassRegistry::builtin().passes(passes)).run(g);
  const ir::Interpreter interpreter(g);
  const std::vector<at::Tensor>& inputs = z.inputs.at(kind);
  for (auto _ : state) {
    std::vector<at::Tensor> in = inputs;
    benchmark::DoNotOptimize(interpreter.run(in));
  }
  size_t calls = 0;
  for (const ir::Node* n : g.nodes()) calls += n->is_call();
  state.counters["nodes"] = static_cast<double>(calls);
}

// One Linear on 3-D input as at::matmul traces it (x[B, T, K] @ w.t() + b),
// and a view chain as matmul's fold followed by the caller's view makes it:
// the graphs the two rewrites change, alone, at GPT's sizes.
std::string linear_3d(int64_t bt, int64_t k, int64_t n) {
  const std::string b = "2", t = std::to_string(bt / 2), K = std::to_string(k), N = std::to_string(n),
                    BT = std::to_string(bt);
  return "%x : f32[" + b + ", " + t + ", " + K +
         "] = placeholder()\n"
         "%w : f32[" +
         N + ", " + K +
         "] = placeholder()\n"
         "%b : f32[" +
         N +
         "] = placeholder()\n"
         "%t : f32[" +
         K + ", " + N + "] stride=[1, " + K +
         "] = aten::t(%w)\n"
         "%view : f32[" +
         BT + ", " + K + "] = aten::view(%x, [" + BT + ", " + K +
         "])\n"
         "%mm : f32[" +
         BT + ", " + N +
         "] = aten::mm(%view, %t)\n"
         "%uv : f32[" +
         b + ", " + t + ", " + N + "] = aten::_unsafe_view(%mm, [" + b + ", " + t + ", " + N +
         "])\n"
         "%add : f32[" +
         b + ", " + t + ", " + N +
         "] = aten::add.Tensor(%uv, %b)\n"
         "%flat : f32[" +
         BT + ", " + N + "] = aten::_unsafe_view(%add, [" + BT + ", " + N +
         "])\n"
         "%out : f32[" +
         std::to_string(bt * n) + "] = aten::_unsafe_view(%flat, [" + std::to_string(bt * n) +
         "])\n"
         "return (%out)\n";
}

// GPT's attention output as traced: the heads' product folded back by
// at::matmul's _unsafe_view, then the caller's transpose-free view.
std::string view_chain() {
  return "%y : f32[8, 2, 32, 32] = placeholder()\n"
         "%a : f32[16, 32, 32] = aten::_unsafe_view(%y, [16, 32, 32])\n"
         "%b : f32[8, 2, 32, 32] = aten::_unsafe_view(%a, [8, 2, 32, 32])\n"
         "%c : f32[8, 64, 32] = aten::view(%b, [8, 64, 32])\n"
         "%n : f32[8, 64, 32] = aten::neg(%c)\n"
         "return (%n)\n";
}

void interpret_text(benchmark::State& state, const std::string& text, const std::vector<std::string>& rewrites) {
  ir::Graph g = ir::parse(text);
  std::vector<std::string> passes = {"dce", "cse"};
  passes.insert(passes.end(), rewrites.begin(), rewrites.end());
  ir::PassManager(ir::PassRegistry::builtin().passes(passes)).run(g);
  const ir::Interpreter interpreter(g);
  std::vector<at::Tensor> inputs;
  for (const ir::Value* p : g.placeholders()) inputs.push_back(at::randn(p->meta().sizes));
  for (auto _ : state) {
    std::vector<at::Tensor> in = inputs;
    benchmark::DoNotOptimize(interpreter.run(in));
  }
  size_t calls = 0;
  for (const ir::Node* node : g.nodes()) calls += node->is_call();
  state.counters["nodes"] = static_cast<double>(calls);
}

[[maybe_unused]] const bool registered = [] {
  for (const std::string& model : models::model_names())
    for (const std::string& kind : graph_kinds()) {
      for (const std::string& p : ir::PassRegistry::builtin().names())
        benchmark::RegisterBenchmark(("BM_Pass/" + p + "/" + model + "/" + kind).c_str(), pass, p, model, kind)
            ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("BM_Verify/" + model + "/" + kind).c_str(), verify, model, kind)
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("BM_VerifyMeta/" + model + "/" + kind).c_str(), verify_meta, model, kind)
          ->Unit(benchmark::kMillisecond);
    }
  const std::vector<std::pair<std::string, std::vector<std::string>>> variants = {
      {"dce+cse", {}},
      {"fold_view_chains", {"fold_view_chains"}},
      {"fuse_addmm", {"fuse_addmm"}},
      {"both", {"fold_view_chains", "fuse_addmm"}}};
  for (const std::string model : {"gpt", "gpt-wide"})
    for (const std::string kind : {"forward", "train_step"})
      for (const auto& [label, rewrites] : variants)
        benchmark::RegisterBenchmark(("BM_InterpretRewritten/" + model + "/" + kind + "/" + label).c_str(),
                                     interpret_rewritten, model, kind, rewrites)
            ->Unit(benchmark::kMillisecond);
  // GPT's c_fc (n_embd -> 4 n_embd) at the zoo's and the wide GPT's sizes.
  for (const auto& [label, bt, k, n] : std::vector<std::tuple<std::string, int64_t, int64_t, int64_t>>{
           {"gpt", 256, 64, 256}, {"gpt-wide", 512, 256, 1024}})
    for (const auto& [variant, rewrites] : variants)
      benchmark::RegisterBenchmark(("BM_InterpretLinear3d/" + label + "/" + variant).c_str(), interpret_text,
                                   linear_3d(bt, k, n), rewrites)
          ->Unit(benchmark::kMicrosecond);
  for (const auto& [variant, rewrites] : variants)
    benchmark::RegisterBenchmark(("BM_InterpretViewChain/" + variant).c_str(), interpret_text, view_chain(), rewrites)
        ->Unit(benchmark::kMicrosecond);
  return true;
}();

}  // namespace
