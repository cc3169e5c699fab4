// ir::count_flops on a compiled training step, against an independent
// reference: nanoGPT's estimate of a GPT's training FLOPs per token
// (model.py's estimate_mfu, after the PaLM paper's appendix B),
// 6 N + 12 L H Q T: N the parameters but the position embedding (the token
// embedding is also the head), L layers of H heads of Q dimensions over a
// context of T tokens. It counts each weight's matmul forward (2 N) and its
// two backward matmuls (4 N), and attention's two matmuls per layer forward
// and four backward, as count_flops does; the biases and the layer norms'
// parameters it counts too are the difference allowed here.
#include <crucible/ir/flop_count.h>
#include <crucible/models/zoo.h>
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/train_step.h>

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include "catch.h"

using namespace crucible;

TEST_CASE("flop count: a GPT training step counts nanoGPT's 6N + 12LHQT FLOPs per token", "[pipeline][flops]") {
  const models::GptConfig config{.vocab_size = 512, .block_size = 64, .n_layer = 3, .n_head = 4, .n_embd = 128};
  torch::manual_seed(0);
  models::Model model = models::make_gpt(config);
  torch::optim::AdamW optimizer(model.module->parameters(), torch::optim::AdamWOptions(1e-3));
  const data::Batch batch = model.example_batch(2, 0);
  pipeline::TrainStep step =
      pipeline::Builder().backend("interpreter").compile_train_step(model.module, optimizer, models::loss_of(model));
  step.compile({batch.inputs, batch.targets});

  const ir::FlopCount flops = ir::count_flops(step.graph());
  int64_t n = 0;
  for (const auto& p : model.module->named_parameters())
    if (p.key().find("wpe") == std::string::npos) n += p.value().numel();
  const int64_t tokens = batch.inputs.numel(), t = batch.inputs.size(1);
  const int64_t q = config.n_embd / config.n_head;
  const double reference = static_cast<double>(tokens * (6 * n + 12 * config.n_layer * config.n_head * q * t));
  INFO("counted " << flops.total << ", nanoGPT's estimate " << reference);
  CHECK(flops.by_op.contains("aten::bmm"));  // attention, written out
  CHECK(static_cast<double>(flops.total) <= reference);
  CHECK(static_cast<double>(flops.total) >= 0.97 * reference);
  // Node by node, the same: each op's FLOPs, the others none.
  ir::FlopCount by_node;
  for (const ir::Node* node : step.graph().nodes()) {
    const int64_t f = ir::count_flops(*node);
    if (f == 0) continue;
    by_node.total += f;
    by_node.by_op[node->target().substr(0, node->target().find('.'))] += f;
  }
  CHECK(by_node.total == flops.total);
  CHECK(by_node.by_op == flops.by_op);
}
