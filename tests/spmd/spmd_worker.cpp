// One rank of the multi-process spmd tests (test_spmd.cpp starts it with
// spmd::launch). Usage: spmd_worker SCENARIO OUT_DIR MODEL OPTIMIZER BUCKET_BYTES
//   train     10 steps (CRUCIBLE_TEST_STEPS) on this rank's shard of each
//             global batch; writes OUT_DIR/rank<R>.bin: the losses
//             (float64), then every parameter (float32, module order).
//   die       the last rank exits after 2 steps; the others keep stepping
//             and write the error they get to OUT_DIR/rank<R>.err.
//   mismatch  the last rank's shard is one example shorter; every rank
//             writes the error it gets to OUT_DIR/rank<R>.err.
//   trace_fails
//             the last rank's loss reads a data-dependent size (nonzero),
//             which its trace refuses; every rank writes the error it gets
//             to OUT_DIR/rank<R>.err.
//   two_steps as train, after another step (a model of its own, one bucket
//             per gradient) was compiled on the same group.
//   resume    as train, after rank 0 alone took 2 eager steps on the global
//             batches of seeds 100 and 101 (its optimizer holds Adam's
//             moments and counts, the others' none): every rank's optimizer
//             must end holding counts of 2 + 10 (rank<R>.err otherwise).
//   checkpoint
//             as train under CRUCIBLE_TEST_STYLE=fully_shard, but after 5
//             steps every rank saves its module and optimizer (its shards)
//             with torch::save, and a new model, optimizer and step (of
//             other initial weights) load them and take the last 5.
//   ddp       MODEL names a program of ddp_programs.h (OPTIMIZER is ignored:
//             the program has its own); kDdpSteps steps from the program's
//             per-rank seeds; writes OUT_DIR/rank<R>.bin: rank_result as
//             float64.
//   ddp_local_buffers
//             as ddp, with SpmdOptions::broadcast_buffers off.
// The ddp scenarios run on the CPU over the default backend; they too take
// CRUCIBLE_TEST_COMPILER.
// Per-rank batch 4; batches are the model's example_batch(4 * world, step).
// CRUCIBLE_TEST_DEVICE=cuda trains on cuda:(LOCAL_RANK mod GPUs), and
// CRUCIBLE_TEST_BACKEND picks the group's backend (default: auto), and
// CRUCIBLE_TEST_COMPILER the step's backend (default: interpreter; the
// inductor traces with its core decompositions, as it registered them), and
// CRUCIBLE_TEST_STYLE the data-parallel style (replicate, the default, or
// fully_shard: the train scenario then also unshards the model after step 3
// and trains on, and every scenario writes the parameters after unshard()).
#include <crucible/models/zoo.h>
#include <crucible/spmd/api.h>
#include <crucible/spmd/collectives.h>
#include <crucible/spmd/process_group.h>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ddp_programs.h"

using namespace crucible;

namespace {

constexpr int64_t kPerRank = 4;
constexpr int kSteps = 10;

// The step's backend: CRUCIBLE_TEST_COMPILER, or the reference.
const char* compiler() {
  const char* name = std::getenv("CRUCIBLE_TEST_COMPILER");
  return name ? name : "interpreter";
}

// CRUCIBLE_TEST_STEPS, or kSteps.
int test_steps() {
  const char* steps = std::getenv("CRUCIBLE_TEST_STEPS");
  return steps ? std::stoi(steps) : kSteps;
}

// CRUCIBLE_TEST_STYLE.
spmd::DataParallelStyle style() {
  const char* name = std::getenv("CRUCIBLE_TEST_STYLE");
  return spmd::parse_data_parallel_style(name ? name : "replicate");
}

void write_error(const std::string& dir, int rank, const std::string& what) {
  std::ofstream(dir + "/rank" + std::to_string(rank) + ".err") << what;
}

// The ddp scenarios: one rank of a program of ddp_programs.h, on the CPU.
int run_program(const std::string& scenario, const std::string& dir, const std::string& name, int64_t bucket_bytes) {
  spmd::ProcessGroup group = spmd::init_process_group(spmd::options_from_env());
  const int rank = group.rank(), world = group.size();
  // Ranks build the program from different seeds: spmd::compile starts
  // every rank from rank 0's state.
  at::manual_seed(100 + rank);
  spmd_testing::Program p = spmd_testing::make_program(name);
  spmd::SpmdOptions options;
  options.parallel_mode.bucket_bytes = bucket_bytes;
  if (scenario == "ddp_local_buffers") options.broadcast_buffers = false;
  options.builder.backend(compiler());
  try {
    spmd::SpmdStep step = spmd::compile(p.module, *p.optimizer, p.loss, options);
    auto shard = [&](int s) { return spmd_testing::shard_of(p.batch(p.per_rank * world, s), rank, p.per_rank); };
    step.compile(shard(0));
    at::manual_seed(p.rng_seed(rank));  // compiling left the generator as it found it
    std::vector<double> losses;
    for (int s = 0; s < spmd_testing::kDdpSteps; ++s) losses.push_back(step(shard(s)).item<double>());
    const at::Tensor result = spmd_testing::rank_result(losses, *p.module);
    std::ofstream out(dir + "/rank" + std::to_string(rank) + ".bin", std::ios::binary);
    out.write(static_cast<const char*>(result.data_ptr()), static_cast<std::streamsize>(result.nbytes()));
    return out ? 0 : 1;
  } catch (const std::exception& e) {
    write_error(dir, rank, e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::cerr << "usage: spmd_worker SCENARIO OUT_DIR MODEL OPTIMIZER BUCKET_BYTES\n";
    return 2;
  }
  const std::string scenario = argv[1], dir = argv[2], model_name = argv[3], opt_name = argv[4];
  const int64_t bucket_bytes = std::stoll(argv[5]);
  at::set_num_threads(1);
  if (scenario == "ddp" || scenario == "ddp_local_buffers") return run_program(scenario, dir, model_name, bucket_bytes);
  spmd::ProcessGroupOptions go = spmd::options_from_env();
  const char* device_env = std::getenv("CRUCIBLE_TEST_DEVICE");
  const char* backend_env = std::getenv("CRUCIBLE_TEST_BACKEND");
  go.device = device_env ? device_env : "cpu";
  go.backend = backend_env ? backend_env : "auto";
  const at::Device device =
      go.device == "cuda"
          ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(go.local_rank % static_cast<int>(at::getNumGPUs())))
          : at::Device(at::kCPU);
  spmd::ProcessGroup group = spmd::init_process_group(go);
  const int rank = group.rank(), world = group.size();

  // Ranks build the model from different seeds: spmd::compile starts every
  // rank from rank 0's weights.
  at::manual_seed(100 + rank);
  models::Model model = models::make_model(model_name);
  model.module->to(device);
  auto make_optimizer = [&opt_name](models::Model& m) -> std::unique_ptr<torch::optim::Optimizer> {
    if (opt_name == "sgd")
      return std::make_unique<torch::optim::SGD>(m.module->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    return std::make_unique<torch::optim::Adam>(m.module->parameters(), torch::optim::AdamOptions(1e-3));
  };
  std::unique_ptr<torch::optim::Optimizer> opt = make_optimizer(model);
  auto shard = [&](int s) {
    const data::Batch global = model.example_batch(kPerRank * world, static_cast<uint64_t>(s));
    int64_t n = kPerRank;
    if (scenario == "mismatch" && rank == world - 1) n -= 1;
    return std::vector<at::Tensor>{global.inputs.narrow(0, rank * kPerRank, n).to(device),
                                   global.targets.narrow(0, rank * kPerRank, n).to(device)};
  };
  if (scenario == "two_steps") {
    // Its graph differs from the step's below, and the hashes it compared
    // stay in the store: the step below must compare its own.
    models::Model other = models::make_model(model_name);
    other.module->to(device);
    torch::optim::SGD other_opt(other.module->parameters(), torch::optim::SGDOptions(0.1));
    spmd::SpmdOptions one_per_gradient;
    one_per_gradient.builder.backend(compiler());
    one_per_gradient.parallel_mode.bucket_bytes = 0;
    spmd::compile(other.module, other_opt, models::loss_of(other), one_per_gradient).compile(shard(0));
  }
  constexpr int kResumedSteps = 2;
  if (scenario == "resume" && rank == 0)
    for (int s = 0; s < kResumedSteps; ++s) {
      const data::Batch global = model.example_batch(kPerRank * world, static_cast<uint64_t>(100 + s));
      models::eager_train_step(model, *opt, {global.inputs.to(device), global.targets.to(device)});
    }
  spmd::SpmdOptions options;
  options.parallel_mode.bucket_bytes = bucket_bytes;
  options.parallel_mode.style = scenario == "checkpoint" ? spmd::DataParallelStyle::FullyShard : style();
  if (const char* dtype = std::getenv("CRUCIBLE_TEST_PARAM_DTYPE"); dtype && std::string(dtype) == "bf16")
    options.parallel_mode.param_dtype = at::kBFloat16;
  options.builder.backend(compiler());
  pipeline::LossFn loss = models::loss_of(model);
  if (scenario == "trace_fails" && rank == world - 1)
    loss = [base = loss](torch::nn::Module& m, const std::vector<at::Tensor>& batch) {
      return base(m, batch) * at::nonzero(batch[1]).size(0);
    };
  spmd::SpmdStep step = spmd::compile(model.module, *opt, loss, options);

  const int steps = test_steps();
  std::vector<double> losses;
  try {
    for (int s = 0; s < steps; ++s) {
      if (scenario == "die" && rank == world - 1 && s == 2) _exit(3);
      if (scenario == "checkpoint" && s == steps / 2) {
        // Each rank's shards, saved and loaded by the rank alone.
        const std::string file = dir + "/rank" + std::to_string(rank);
        torch::save(model.module, file + ".module.pt");
        torch::save(*opt, file + ".optimizer.pt");
        at::manual_seed(200 + rank);
        model = models::make_model(model_name);
        model.module->to(device);
        opt = make_optimizer(model);
        step = spmd::compile(model.module, *opt, models::loss_of(model), options);
        torch::load(model.module, file + ".module.pt");
        torch::load(*opt, file + ".optimizer.pt");
      }
      losses.push_back(step(shard(s)).item<double>());
      // The whole model between two steps, which the next one shards again.
      if (scenario == "train" && options.parallel_mode.style == spmd::DataParallelStyle::FullyShard && s == 3)
        step.unshard();
    }
    // Rank 0's full state dict, gathered from the shards, beside the whole
    // parameters unshard() gives (rank<R>.bin): the test compares them.
    const std::vector<std::pair<std::string, at::Tensor>> full = step.full_state_dict();
    if (rank != 0 && !full.empty()) throw std::runtime_error("full_state_dict: a rank other than 0 got tensors");
    if (rank == 0) {
      std::ofstream out(dir + "/rank0.full.bin", std::ios::binary);
      size_t i = 0;
      for (const auto& p : model.module->named_parameters()) {
        if (full.at(i).first != p.key()) throw std::runtime_error("full_state_dict: " + full.at(i).first + " first");
        const at::Tensor c = full.at(i++).second.to(at::kFloat).contiguous();
        out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
      }
    }
    step.unshard();
  } catch (const std::exception& e) {
    write_error(dir, rank, e.what());
    return 1;
  }
  if (scenario == "resume")
    for (const at::Tensor& p : model.module->parameters()) {
      const auto it = opt->state().find(p.unsafeGetTensorImpl());
      const auto* adam =
          it == opt->state().end() ? nullptr : dynamic_cast<const torch::optim::AdamParamState*>(it->second.get());
      if (!adam || adam->step() != kResumedSteps + steps) {
        write_error(dir, rank,
                    "the optimizer's step count is " + (adam ? std::to_string(adam->step()) : std::string("absent")) +
                        ", not " + std::to_string(kResumedSteps + steps));
        return 1;
      }
    }
  if (scenario != "train" && scenario != "two_steps" && scenario != "resume" && scenario != "checkpoint") {
    write_error(dir, rank, "no error after " + std::to_string(steps) + " steps");
    return 1;
  }
  if (spmd::pending_collectives() != 0) {
    std::cerr << "rank " << rank << ": collectives left unwaited\n";
    return 1;
  }
  std::ofstream out(dir + "/rank" + std::to_string(rank) + ".bin", std::ios::binary);
  out.write(reinterpret_cast<const char*>(losses.data()), static_cast<std::streamsize>(losses.size() * sizeof(double)));
  for (const at::Tensor& p : model.module->parameters()) {
    const at::Tensor c = p.detach().to(at::kFloat).cpu().contiguous();
    out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  }
  return out ? 0 : 1;
}
