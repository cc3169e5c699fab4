// `crucible train --model M --dataset D [--epochs E | --steps N] [--batch B]
// [--lr X] [--optimizer sgd|adam|adamw] --backend B [--device cpu|cuda] [--check-eager] [--json]
// [--nproc N [--parallel-mode replicate|fully_shard]]`:
// train a zoo model through the compiled training step (one graph: forward,
// backward, optimizer update; see crucible/pipeline/train_step.h), or eagerly
// with --backend eager; report per-stage compile times, throughput and the
// test accuracy. --check-eager trains an eager copy from the same weights on
// the same batches alongside and reports how far the two ended apart:
// bitwise with the interpreter, as Note [Agreement with eager for a fused
// backend] (eager_check.h) says with inductor, the default.
#include "commands.h"
#include "eager_check.h"
#include "progress.h"
#include "training.h"

#include <crucible/autograd/aot_module.h>
#include <crucible/data/batcher.h>
#include <crucible/data/fashion_mnist.h>
#include <crucible/models/zoo.h>
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/error.h>
#include <crucible/pipeline/instruments.h>
#include <crucible/runtime/backend_registry.h>
#include <crucible/runtime/instruments.h>
#include <crucible/runtime/memory.h>
#include <crucible/runtime/timing.h>
#include <crucible/spmd/api.h>
#include <crucible/spmd/launch.h>
#include <crucible/spmd/process_group.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/utils.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace crucible::tools {
namespace {

struct TrainCommandOptions {
  std::string model = "convnet";
  std::string dataset;  // empty: fashion-mnist for image models, synthetic for the GPT
  std::optional<int64_t> epochs;
  std::optional<int64_t> steps;
  int64_t batch = 32;
  OptimizerFlags optimizer;
  std::string backend = runtime::BackendRegistry::builtin().best().name;
  std::string device = "cpu";
  std::string size = "small";
  CompileFlags compile;
  bool check_eager = false;
  bool json = false;
  uint64_t seed = 0;
  std::string data_dir = data::kFashionMnistDir;
  double tolerance = 1e-4;
  int nproc = 1;
  std::string parallel_mode = "replicate";
};

constexpr int64_t kSyntheticSteps = 200;
// Note [Agreement with eager for a fused backend]: the loss curves' windows
// within 2% of eager's, the test accuracy within 1 point.
constexpr double kLossCurveRtol = 0.02;
constexpr double kAccuracyPoints = 1.0;
constexpr int64_t kTestBatch = 500;

std::string sci(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1e", v);
  return buf;
}

// Where batches come from: the training stream by step, and the held-out set.
struct Data {
  std::string description;
  int64_t steps_per_epoch = 0;  // 0: a stream without epochs (synthetic)
  std::function<data::Batch(int64_t step)> train_batch;
  std::vector<data::Batch> test_batches;
};

Data fashion_mnist_data(const TrainCommandOptions& o) {
  data::FashionMnist train = data::load_fashion_mnist(data::Split::Train, o.data_dir);
  data::FashionMnist test = data::load_fashion_mnist(data::Split::Test, o.data_dir);
  Data d;
  d.description = "fashion-mnist (" + std::to_string(train.images.size(0)) + " training, " +
                  std::to_string(test.images.size(0)) + " test images)";
  // The last, smaller batch of an epoch is dropped: every step has one shape,
  // so the step compiles once.
  auto batcher = std::make_shared<data::Batcher>(
      train.images, train.labels, data::BatcherOptions{o.batch, /*shuffle=*/true, o.seed, /*drop_last=*/true});
  d.steps_per_epoch = batcher->batches_per_epoch();
  if (d.steps_per_epoch == 0)
    throw pipeline::PipelineError("--batch " + std::to_string(o.batch) + " is larger than the training set");
  auto epoch = std::make_shared<std::optional<std::pair<int64_t, data::Epoch>>>();
  d.train_batch = [batcher, epoch, per_epoch = d.steps_per_epoch](int64_t step) {
    const int64_t e = step / per_epoch;
    if (!*epoch || (*epoch)->first != e) epoch->emplace(e, batcher->epoch(e));
    return (*epoch)->second[step % per_epoch];
  };
  for (int64_t i = 0; i < test.images.size(0); i += kTestBatch)
    d.test_batches.push_back({test.images.slice(0, i, i + kTestBatch), test.labels.slice(0, i, i + kTestBatch)});
  return d;
}

Data synthetic_data(const TrainCommandOptions& o, const models::Model& model) {
  // The model's own example batches, so that the data has the model's shapes
  // at every --size (GPT-2 small's T = 1024 and vocabulary 50257 with --size
  // full): batch `step` is example_batch(batch, seed + step), the held-out
  // batches come from seeds far past any step.
  Data d;
  const data::Batch first = model.example_batch(o.batch, o.seed);
  d.description = !first.inputs.is_floating_point() ? "synthetic token sequences " + c10::str(first.inputs.sizes()) +
                                                          " (arithmetic sequences modulo the vocabulary: learnable)"
                                                    : "synthetic images " + c10::str(first.inputs.sizes()) +
                                                          " (N(0, 1) pixels, uniform labels: nothing to learn)";
  d.train_batch = [examples = model.example_batch, b = o.batch, seed = o.seed](int64_t step) {
    return examples(b, seed + static_cast<uint64_t>(step));
  };
  for (int64_t i = 0; i < 10; ++i) d.test_batches.push_back(model.example_batch(o.batch, o.seed + 1'000'000 + i));
  return d;
}

// Top-1 accuracy of `forward` over the held-out batches, with `module` in
// eval mode and no gradients (every position counts for the GPT).
double test_accuracy(torch::nn::Module& module, const std::function<at::Tensor(const at::Tensor&)>& forward,
                     const std::vector<data::Batch>& batches, int64_t* counted) {
  module.eval();
  at::NoGradGuard no_grad;
  int64_t correct = 0, total = 0;
  for (const data::Batch& b : batches) {
    const at::Tensor predicted = forward(b.inputs).argmax(-1);
    correct += predicted.eq(b.targets).sum().item<int64_t>();
    total += b.targets.numel();
  }
  module.train();
  *counted = total;
  return total ? static_cast<double>(correct) / static_cast<double>(total) : 0.0;
}

data::Batch on(const data::Batch& b, const at::Device& device) { return {b.inputs.to(device), b.targets.to(device)}; }

// --nproc N from a plain shell: start N ranks of this same command line
// (crucible launch's way), each of which sees WORLD_SIZE and trains.
void launch_ranks(const TrainCommandOptions& o) {
  spmd::LaunchOptions l;
  l.nproc = o.nproc;
  l.command = {"/proc/self/exe"};
  l.command.insert(l.command.end(), command_line().begin() + 1, command_line().end());
  if (const int code = spmd::launch(l); code != 0)
    throw pipeline::PipelineError("a rank of the data-parallel run failed (exit status " + std::to_string(code) +
                                  "); its error is printed above");
}

// The ranks of a data-parallel run: its process group where WORLD_SIZE is
// set (a rank that crucible launch or --nproc started), else one rank and
// no group.
struct Ranks {
  std::optional<spmd::ProcessGroup> group;
  int world = 1, rank = 0;
};

Ranks join_ranks(const TrainCommandOptions& o) {
  Ranks r;
  if (std::getenv("WORLD_SIZE") != nullptr) {
    spmd::ProcessGroupOptions g = spmd::options_from_env();
    if (g.world_size != o.nproc && o.nproc != 1)
      throw pipeline::PipelineError("--nproc " + std::to_string(o.nproc) + " but WORLD_SIZE is " +
                                    std::to_string(g.world_size) + ": give one or the other");
    g.device = o.device;
    r.group = spmd::init_process_group(g);
  }
  r.world = r.group ? r.group->size() : 1;
  r.rank = r.group ? r.group->rank() : 0;
  return r;
}

// Eager CUDA training does not repeat itself bit for bit: cuDNN's default
// weight-gradient kernels accumulate with atomics in no fixed order, and two
// copies so trained drift apart over an epoch until the comparison says
// nothing. --check-eager therefore runs both copies with deterministic
// kernels, as torch.use_deterministic_algorithms(True, warn_only=True) does;
// cuBLAS reads its workspace setting when its first handle is made.
// They also run without TF32, as torch.compile's accuracy runs do: TF32
// keeps 10 bits of each operand's mantissa, and a compiled step's other
// kernels (channels-last convolutions: Note [Channels-last convolutions])
// round other operands, 1e-4 apart where float32 agrees to 1e-7.
void use_deterministic_kernels() {
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  at::globalContext().setBenchmarkCuDNN(false);
  at::globalContext().setAllowTF32CuDNN(false);
  at::globalContext().setFloat32MatmulPrecision("highest");
}

// A run, set up: where it trains, the model and its optimizer, the data,
// and the copies --check-eager trains beside it.
struct Run {
  Ranks ranks;
  std::string dataset;
  bool gpt = false;
  bool compiled = false;       // a backend, not --backend eager
  bool deterministic = false;  // use_deterministic_kernels
  // A fused backend's check (Note [Agreement with eager for a fused
  // backend]): a float64 copy for the first step, the backend's gradients
  // from identical state, both copies' losses at every step.
  bool fused_check = false;
  at::Device device = at::kCPU;
  at::Device placed = at::kCPU;  // the GPU "cuda" named, or the CPU
  models::Model model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  Data data;
  int64_t steps = 0;
  int64_t batch = 0;  // per rank
  std::optional<models::Model> eager;
  std::unique_ptr<torch::optim::Optimizer> eager_optimizer;
  std::optional<Float64Reference> reference;
  // The data-parallel step, with several ranks: unshard() gathers a
  // fully-sharded model whole into the module before it is compared or
  // evaluated.
  std::optional<spmd::SpmdStep> spmd;

  // With N ranks each step reads a global batch of N * --batch examples,
  // and each rank trains on its slice of it (the seed's DataParallel).
  data::Batch shard(const data::Batch& b) const {
    return ranks.world == 1 ? b
                            : data::Batch{b.inputs.narrow(0, ranks.rank * batch, batch),
                                          b.targets.narrow(0, ranks.rank * batch, batch)};
  }

  // The global batch's loss from a rank's: the mean of the ranks' (equal
  // shards, mean loss).
  double global_loss(double rank_loss) const {
    if (!ranks.group || ranks.world == 1) return rank_loss;
    std::vector<at::Tensor> l{at::full(
        {1}, rank_loss,
        at::TensorOptions(at::kDouble).device(ranks.group->backend() == "nccl" ? device : at::Device(at::kCPU)))};
    ranks.group->all_reduce_sum(l);
    return l[0].item<double>() / ranks.world;
  }
};

// The run's dataset and device checked, then its model, data, optimizer
// and eager copies made, in the order that keeps the seed's draws.
Run set_up(const TrainCommandOptions& o, Ranks ranks) {
  Run run;
  run.ranks = std::move(ranks);
  run.gpt = o.model == "gpt";
  run.dataset = o.dataset.empty() ? (run.gpt ? "synthetic" : "fashion-mnist") : o.dataset;
  if (run.gpt && run.dataset == "fashion-mnist")
    throw pipeline::PipelineError("the gpt model trains on token sequences: use --dataset synthetic");
  if (run.dataset == "synthetic" && o.epochs)
    throw pipeline::PipelineError("synthetic data is a stream without epochs: use --steps");
  run.compiled = o.backend != "eager";
  run.device = o.device == "cuda" && run.ranks.group
                   ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(run.ranks.rank))
                   : at::Device(o.device);
  require_usable(run.device, "train");
  run.deterministic = o.check_eager && run.device.is_cuda();
  if (run.deterministic) use_deterministic_kernels();

  torch::manual_seed(o.seed);
  run.model = models::make_model(o.model, o.size);
  run.model.module->to(run.device);
  // "cuda" names the current GPU; report the one the model is on.
  run.placed = run.model.module->parameters().front().device();
  run.model.module->train();
  TrainCommandOptions global = o;
  global.batch = o.batch * run.ranks.world;
  run.batch = o.batch;
  run.data = run.dataset == "synthetic" ? synthetic_data(global, run.model) : fashion_mnist_data(global);
  for (data::Batch& b : run.data.test_batches) b = on(b, run.device);
  run.steps = o.steps ? *o.steps
                      : (run.data.steps_per_epoch ? o.epochs.value_or(1) * run.data.steps_per_epoch : kSyntheticSteps);
  run.optimizer = o.optimizer.make(run.model.module->parameters());
  run.fused_check = o.check_eager && run.compiled && o.backend != "interpreter";
  if (o.check_eager) {
    run.eager.emplace(copy_of(o.model, o.size, run.model, run.device, at::kFloat));
    run.eager_optimizer = o.optimizer.make(run.eager->module->parameters());
  }
  if (run.fused_check) {
    run.reference.emplace(Float64Reference{copy_of(o.model, o.size, run.model, run.device, at::kDouble), nullptr});
    run.reference->optimizer = o.optimizer.make(run.reference->model.module->parameters());
  }
  return run;
}

void print_header(const TrainCommandOptions& o, const Run& run) {
  int64_t num_params = 0;
  for (const auto& p : run.model.module->parameters()) num_params += p.numel();
  std::cout << "model " << o.model << " (" << num_params << " parameters) on " << run.data.description << "\n"
            << "optimizer " << o.optimizer.kind << " lr " << o.optimizer.effective_lr() << ", batch " << o.batch;
  if (run.ranks.world > 1)
    std::cout << " per rank x " << run.ranks.world << " ranks (" << run.ranks.group->backend() << ", "
              << o.parallel_mode << ")";
  std::cout << ", " << run.steps << " steps";
  if (run.data.steps_per_epoch) std::cout << " (" << run.data.steps_per_epoch << " per epoch)";
  std::cout << ", backend " << o.backend << " on " << run.placed
            << (run.deterministic ? " (deterministic kernels)" : "") << "\n";
}

using StepFn = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

// The compiled training step (data-parallel over the ranks' group, if
// any), compiled for the first batch before the loop, so that throughput
// counts steps only. The step's builder counts and times its own
// compilations (and a recompile, should a batch need one) into `counters`
// and `timer`; the test forward's are not counted.
StepFn compile_step(const TrainCommandOptions& o, Run& run, const pipeline::Builder& builder,
                    runtime::PhaseTimer& timer, runtime::Counters& counters) {
  pipeline::Builder timed = builder;
  timed.instrument(std::make_shared<runtime::CounterRecorder>(counters))
      .instrument(std::make_shared<runtime::StageTimer>(timer));
  const data::Batch first = run.shard(on(run.data.train_batch(0), run.device));
  StepFn step;
  if (run.ranks.group) {
    spmd::SpmdOptions so;
    so.builder = timed;
    so.parallel_mode.group = run.ranks.group->name();
    so.parallel_mode.style = spmd::parse_data_parallel_style(o.parallel_mode);
    run.spmd = spmd::compile(run.model.module, *run.optimizer, models::loss_of(run.model), so);
    run.spmd->compile({first.inputs, first.targets});
    step = *run.spmd;
  } else {
    pipeline::TrainStep single = timed.compile_train_step(run.model.module, *run.optimizer, models::loss_of(run.model));
    single.compile({first.inputs, first.targets});
    step = single;
  }
  std::cout << "compile (" << o.backend << "): " << describe_stages(timer) << "\n";
  return step;
}

// What the loop measured: the last losses (rank 0's, then the global
// batch's), the seconds spent in steps, and for --check-eager the eager
// copy's, both loss curves and the first step's agreement.
struct Trained {
  double loss = 0, eager_loss = 0;
  double train_s = 0, eager_s = 0;
  double samples_per_s = 0;
  std::vector<double> losses, eager_losses;
  OneStepAgreement one_step;
};

// `run.steps` steps: the compiled `step` (eager steps with --backend eager),
// the eager copy's beside it, a progress bar on rank 0.
Trained train(Run& run, const StepFn& step, const std::vector<at::Tensor>& first_grads) {
  using clock = std::chrono::steady_clock;
  static std::ostream quiet(nullptr);
  const int rank = run.ranks.rank;
  Trained t;
  ProgressBar bar("train", run.steps, rank == 0 ? std::cerr : quiet, rank == 0 && isatty(2));
  const int64_t global_batch = run.batch * run.ranks.world;
  for (int64_t i = 0; i < run.steps; ++i) {
    const data::Batch b = on(run.data.train_batch(i), run.device), mine = run.shard(b);
    // Reading the loss (item()) waits for the step's kernels: the time is the step's on any device.
    auto start = clock::now();
    t.loss =
        (run.compiled ? step({mine.inputs, mine.targets}) : models::eager_train_step(run.model, *run.optimizer, mine))
            .item<double>();
    t.train_s += std::chrono::duration<double>(clock::now() - start).count();
    if (run.eager) {
      start = clock::now();
      t.eager_loss = models::eager_train_step(*run.eager, *run.eager_optimizer, b).item<double>();
      t.eager_s += std::chrono::duration<double>(clock::now() - start).count();
    }
    if (run.fused_check) {
      // Against eager's loss on the global batch: the ranks' mean.
      const double compiled_loss = run.global_loss(t.loss);
      t.losses.push_back(compiled_loss);
      t.eager_losses.push_back(t.eager_loss);
      if (i == 0) {
        if (run.spmd) run.spmd->unshard();
        const at::Tensor reference_loss =
            models::eager_train_step(run.reference->model, *run.reference->optimizer, in_float64(b));
        t.one_step = compare_one_step(at::scalar_tensor(compiled_loss, at::kDouble).to(at::kFloat),
                                      at::scalar_tensor(t.eager_loss, at::kDouble).to(at::kFloat), reference_loss,
                                      first_grads, *run.model.module, *run.eager->module, *run.reference->model.module);
        run.reference.reset();
      }
    }
    bar.update(i + 1, "loss " + fixed(t.loss, 4) + "  " +
                          fixed(static_cast<double>((i + 1) * global_batch) / t.train_s, 0) + " samples/s");
  }
  t.samples_per_s = static_cast<double>(run.steps * global_batch) / t.train_s;
  bar.finish("loss " + fixed(t.loss, 4) + (run.ranks.world > 1 ? " (rank 0)" : "") + "  " + fixed(t.samples_per_s, 0) +
             " samples/s");
  t.loss = run.global_loss(t.loss);
  return t;
}

// The test split's accuracy through the forward compiled by the same
// builder (its AOT inference path), or eagerly with --backend eager; the
// number of examples (or next tokens) counted in `counted`.
double compiled_test_accuracy(Run& run, const pipeline::Builder& builder, int64_t* counted) {
  std::function<at::Tensor(const at::Tensor&)> forward = run.model.forward;
  std::optional<autograd::AotModule> compiled_forward;
  if (run.compiled) {
    compiled_forward = builder.compile(run.model.module,
                                       [f = run.model.forward](torch::nn::Module&, const std::vector<at::Tensor>& in) {
                                         return std::vector<at::Tensor>{f(in.at(0))};
                                       });
    forward = [&compiled_forward](const at::Tensor& x) { return (*compiled_forward)({x}).at(0); };
  }
  return test_accuracy(*run.model.module, forward, run.data.test_batches, counted);
}

// --check-eager's verdict, printed and put in `j`: a fused backend's as
// Note [Agreement with eager for a fused backend] says, the interpreter's
// within --tolerance. Throws when they do not agree.
void check_agreement(const TrainCommandOptions& o, Run& run, const Trained& t, double accuracy,
                     nlohmann::ordered_json& j) {
  const int64_t global_batch = run.batch * run.ranks.world;
  const double diff = models::max_param_diff(*run.model.module, *run.eager->module);
  int64_t eager_counted = 0;
  const double eager_accuracy =
      test_accuracy(*run.eager->module, run.eager->forward, run.data.test_batches, &eager_counted);
  j["eager_final_loss"] = t.eager_loss;
  j["max_param_diff"] = diff;
  j["eager_test_accuracy"] = eager_accuracy;
  j["eager_samples_per_s"] = static_cast<double>(run.steps * global_batch) / t.eager_s;
  std::cout << "agreement with eager: max |param diff| " << sci(diff) << ", final loss " << fixed(t.loss, 6) << " vs "
            << fixed(t.eager_loss, 6) << " (|diff| " << sci(std::abs(t.loss - t.eager_loss)) << "), test accuracy "
            << fixed(100 * accuracy, 2) << "% vs " << fixed(100 * eager_accuracy, 2) << "%: ";
  bool agree = true;
  if (run.fused_check) {
    // See Note [Agreement with eager for a fused backend].
    const double curve = loss_curve_difference(t.losses, t.eager_losses);
    const double points = 100 * std::abs(accuracy - eager_accuracy);
    agree = t.one_step.ok() && curve <= kLossCurveRtol && points <= kAccuracyPoints;
    j["one_step"] = {
        {"loss", t.one_step.loss.ok}, {"gradients", t.one_step.gradients.ok}, {"parameters", t.one_step.parameters.ok}};
    j["loss_curve_max_rel_diff"] = curve;
    j["accuracy_diff_points"] = points;
    auto verdict = [](const runtime::SameResult& r) { return r.ok ? std::string("ok") : "DIFFER (" + r.reason + ")"; };
    std::cout << (agree ? "agree" : "DIFFER") << " as a fused backend should: one step from the same state: loss "
              << verdict(t.one_step.loss) << ", gradients " << verdict(t.one_step.gradients) << ", parameters "
              << verdict(t.one_step.parameters) << " (same(), float64 reference); loss curves within "
              << fixed(100 * curve, 2) << "% (at most 2%); test accuracy " << fixed(points, 2)
              << " points apart (at most 1)\n";
  } else {
    agree = diff <= o.tolerance;
    std::cout << (agree ? "agree" : "DIFFER") << " within " << sci(o.tolerance) << "\n";
  }
  if (o.json) std::cout << j.dump() << "\n";
  std::cout.flush();
  if (!agree)
    throw pipeline::PipelineError(run.fused_check
                                      ? "the compiled training does not agree with the eager copy (see above)"
                                      : "the compiled training ended more than --tolerance " + sci(o.tolerance) +
                                            " away from the eager copy");
}

// The results: final loss, throughput, test accuracy, counters, as text
// and (--json) as one JSON object, with --check-eager's verdict.
void report(const TrainCommandOptions& o, Run& run, const pipeline::Builder& builder, const Trained& t,
            const runtime::PhaseTimer& timer, const runtime::Counters& counters) {
  int64_t counted = 0;
  const double accuracy = compiled_test_accuracy(run, builder, &counted);
  std::cout << "train: final loss " << fixed(t.loss, 4) << ", " << fixed(t.samples_per_s, 0) << " samples/s";
  if (run.eager) {
    const double eager_rate = static_cast<double>(run.steps * run.batch * run.ranks.world) / t.eager_s;
    std::cout << " (eager copy: " << fixed(eager_rate, 0) << " samples/s; compiled/eager "
              << fixed(t.samples_per_s / eager_rate, 2) << "x)";
  }
  std::cout << "\ntest accuracy: " << fixed(100 * accuracy, 2) << "% of " << counted
            << (run.gpt ? " next tokens" : " examples")
            << (run.compiled ? " (the forward compiled by the " + o.backend + " backend)" : std::string()) << "\n";
  if (run.compiled) std::cout << "counters: " << describe_counters(counters) << "\n";

  nlohmann::ordered_json j;
  j["model"] = o.model;
  j["backend"] = o.backend;
  j["device"] = run.placed.str();
  j["deterministic"] = run.deterministic;
  j["dataset"] = run.dataset;
  j["optimizer"] = o.optimizer.kind;
  j["batch"] = o.batch;
  j["ranks"] = run.ranks.world;
  if (run.ranks.world > 1) j["parallel_mode"] = o.parallel_mode;
  j["steps"] = run.steps;
  j["final_loss"] = t.loss;
  j["test_accuracy"] = accuracy;
  j["samples_per_s"] = t.samples_per_s;
  j["compile_s"] = nlohmann::ordered_json::object();
  for (const auto& [stage, s] : ordered_stages(timer)) j["compile_s"][stage] = s;
  if (run.compiled) j["compile_s"]["total"] = total_stage_s(timer);
  j["counters"] = counters.snapshot();
  // Inductor and AOTAutograd count their disk caches' outcomes
  // process-wide, as torch's counters["inductor"] and
  // counters["aot_autograd"] (the test forward's compile too).
  auto all = runtime::default_counters().snapshot();
  for (const char* group : {"inductor", "aot_autograd"})
    if (all.contains(group)) j["counters"][group] = all[group];
  // The process's peaks so far: compiles, CUDA-graph captures, the steps,
  // the evaluation and an eager copy's training alike (runtime/memory.h).
  const runtime::MemoryPeaks peaks = runtime::memory_peaks(run.placed);
  j["memory"] = {{"peak_rss_bytes", peaks.rss_bytes}};
  if (peaks.device_allocated_bytes) {
    j["memory"]["peak_device_allocated_bytes"] = *peaks.device_allocated_bytes;
    j["memory"]["peak_device_reserved_bytes"] = peaks.device_reserved_bytes.value_or(0);
  }
  if (run.eager) return check_agreement(o, run, t, accuracy, j);
  if (o.json) std::cout << j.dump() << "\n";
  std::cout.flush();
}

void run_train_command(const TrainCommandOptions& o) {
  if (o.nproc > 1 && std::getenv("WORLD_SIZE") == nullptr) return launch_ranks(o);
  Ranks ranks = join_ranks(o);
  // Only rank 0 reports; the others print their errors only.
  if (ranks.rank != 0) std::cout.setstate(std::ios::failbit);
  Run run = set_up(o, std::move(ranks));
  print_header(o, run);
  pipeline::Builder builder;
  if (run.compiled) {
    builder.backend(o.backend);
    o.compile.apply(builder);
  }
  std::vector<at::Tensor> first_grads;
  if (run.fused_check)
    first_grads = compiled_gradients(builder, o.model, o.size, run.model, on(run.data.train_batch(0), run.device));
  runtime::PhaseTimer timer;
  runtime::Counters counters;
  StepFn step;
  if (run.compiled) step = compile_step(o, run, builder, timer, counters);
  std::cout.flush();
  const Trained trained = train(run, step, first_grads);
  if (run.spmd) run.spmd->unshard();  // evaluated and compared whole
  report(o, run, builder, trained, timer, counters);
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto o = std::make_shared<TrainCommandOptions>();
  CLI::App* cmd = app.add_subcommand("train", "train a zoo model through the compiled training step");
  cmd->add_option("--model", o->model, "model of the zoo")
      ->check(CLI::IsMember(models::model_names()))
      ->capture_default_str();
  cmd->add_option("--dataset", o->dataset, "training data (default: fashion-mnist, synthetic for gpt)")
      ->check(CLI::IsMember({"fashion-mnist", "synthetic"}));
  auto* epochs =
      cmd->add_option("--epochs", o->epochs, "passes over the training set (default 1)")->check(at_least_one());
  auto* steps = cmd->add_option("--steps", o->steps, "training steps (default: one epoch; 200 on synthetic data)")
                    ->check(at_least_one());
  epochs->excludes(steps);
  cmd->add_option("--batch", o->batch, "batch size; an epoch's last, smaller batch is dropped")
      ->check(at_least_one())
      ->capture_default_str();
  o->optimizer.add_to(*cmd);
  std::vector<std::string> backends = runtime::BackendRegistry::builtin().names();
  backends.insert(backends.begin(), "eager");
  cmd->add_option("--backend", o->backend, "eager (no compilation), or a compiler backend")
      ->check(CLI::IsMember(backends))
      ->capture_default_str();
  add_device_option(*cmd, o->device, "where the model, the batches and the optimizer state live");
  add_size_option(*cmd, o->size);
  o->compile.add_to(*cmd);
  cmd->add_flag("--check-eager", o->check_eager,
                "train an eager copy from the same weights on the same batches and compare (on a GPU both run "
                "deterministic kernels): the interpreter within --tolerance; a fused backend one step from the same "
                "state (float64 reference), the loss curves within 2% and test accuracy within 1 point");
  cmd->add_option("--tolerance", o->tolerance,
                  "with --check-eager and the interpreter: the largest parameter difference that counts as "
                  "agreement (exit 1 beyond)")
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "print one JSON object with the results as the last line");
  cmd->add_option("--seed", o->seed, "seed of the initial weights and of the batch order")->capture_default_str();
  cmd->add_option("--data-dir", o->data_dir, "where the Fashion-MNIST files are")->capture_default_str();
  cmd->add_option("--nproc", o->nproc,
                  "train data-parallel on N local ranks (spmd over Gloo on cpu, NCCL on cuda); --batch is per "
                  "rank, and --check-eager compares with one eager process on the global batch")
      ->check(at_least_one())
      ->capture_default_str();
  cmd->add_option("--parallel-mode", o->parallel_mode,
                  "with --nproc: replicate every parameter on every rank (DDP), or fully_shard parameters, "
                  "gradients and optimizer state over the ranks (FSDP)")
      ->check(CLI::IsMember({"replicate", "fully_shard"}))
      ->capture_default_str();
  cmd->callback([o] { run_train_command(*o); });
}

}  // namespace crucible::tools
