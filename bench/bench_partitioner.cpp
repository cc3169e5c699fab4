// The default and the min-cut partition of each zoo model's joint graph
// (AOTAutograd's, of loss.backward() through aot_module, traced in fake
// mode so GPT-2 small at T = 1024 fits in memory): time of one partition,
// and tensors / bytes saved for the backward as counters. Registered as
// BM_Partition/<model>/<size>/<default|min-cut>/batch:B.
#include <crucible/autograd/aot_module.h>
#include <crucible/ir/graph.h>
#include <crucible/models/zoo.h>
#include <crucible/partitioner/default_partition.h>
#include <crucible/partitioner/min_cut_partition.h>

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

#include <memory>
#include <string>
#include <utility>

namespace {

using namespace crucible;

struct Joint {
  ir::Graph graph;
  size_t num_fwd_outputs = 0;
};

// The joint graph AOTAutograd hands its partitioner for the model's loss.
Joint joint_graph(const std::string& model, const std::string& size, int64_t batch) {
  torch::manual_seed(0);
  models::Model m = models::make_model(model, size);
  m.module->train();
  const data::Batch b = m.example_batch(batch, 0);
  auto joint = std::make_shared<Joint>();
  autograd::AotConfig config;
  config.trace_mode = tracer::TraceMode::Fake;
  config.cache = nullptr;
  config.partition_fn = [joint](const ir::Graph& g, size_t n) {
    joint->graph = g.clone();
    joint->num_fwd_outputs = n;
    return partitioner::default_partition(g, n);
  };
  config.fw_compiler = [](const ir::Graph&, const std::vector<at::Tensor>&) { return ir::CompiledFn(); };
  const autograd::AotModule f = autograd::aot_module(
      m.module,
      [loss = models::loss_of(m)](torch::nn::Module& mod, const std::vector<at::Tensor>& in) {
        return std::vector<at::Tensor>{loss(mod, in)};
      },
      config);
  f.compile({b.inputs, b.targets});
  return std::move(*joint);
}

void partition(benchmark::State& state, const std::string& model, const std::string& size, bool min_cut) {
  const Joint joint = joint_graph(model, size, state.range(0));
  partitioner::PartitionResult r;
  for (auto _ : state)
    r = min_cut ? partitioner::min_cut_rematerialization_partition(joint.graph, joint.num_fwd_outputs)
                : partitioner::default_partition(joint.graph, joint.num_fwd_outputs);
  state.counters["joint_nodes"] = static_cast<double>(joint.graph.num_nodes());
  state.counters["saved_tensors"] = static_cast<double>(r.saved_values.size());
  state.counters["saved_MiB"] = partitioner::saved_bytes(r) / (1024.0 * 1024.0);
}

[[maybe_unused]] const bool registered = [] {
  struct Case {
    const char* model;
    const char* size;
    int64_t batch;
  };
  for (const Case& c : {Case{"mlp", "small", 8}, Case{"convnet", "small", 8}, Case{"resnet18", "small", 8},
                        Case{"gpt", "small", 8}, Case{"gpt", "full", 8}})
    for (const bool min_cut : {false, true})
      benchmark::RegisterBenchmark(
          ("BM_Partition/" + std::string(c.model) + "/" + c.size + "/" + (min_cut ? "min-cut" : "default")).c_str(),
          [c, min_cut](benchmark::State& state) { partition(state, c.model, c.size, min_cut); })
          ->Arg(c.batch)
          ->ArgName("batch")
          ->Unit(benchmark::kMillisecond);
  return true;
}();

}  // namespace
