// `crucible train --model M --dataset D [--epochs E | --steps N] [--batch B]
// [--lr X] [--optimizer sgd|adam|adamw] --backend B [--device cpu|cuda] [--check-eager] [--json]`:
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
#include <iostream>
#include <memory>
#include <optional>

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

void run_train_command(const TrainCommandOptions& o) {
  const bool distributed = std::getenv("WORLD_SIZE") != nullptr;
  if (o.nproc > 1 && !distributed) return launch_ranks(o);
  std::optional<spmd::ProcessGroup> group;
  if (distributed) {
    spmd::ProcessGroupOptions g = spmd::options_from_env();
    if (g.world_size != o.nproc && o.nproc != 1)
      throw pipeline::PipelineError("--nproc " + std::to_string(o.nproc) + " but WORLD_SIZE is " +
                                    std::to_string(g.world_size) + ": give one or the other");
    g.device = o.device;
    group = spmd::init_process_group(g);
  }
  const int world = group ? group->size() : 1, rank = group ? group->rank() : 0;
  // Only rank 0 reports; the others print their errors only.
  static std::ostream quiet(nullptr);
  if (rank != 0) std::cout.setstate(std::ios::failbit);
  const bool gpt = o.model == "gpt";
  const std::string dataset = o.dataset.empty() ? (gpt ? "synthetic" : "fashion-mnist") : o.dataset;
  if (gpt && dataset == "fashion-mnist")
    throw pipeline::PipelineError("the gpt model trains on token sequences: use --dataset synthetic");
  if (dataset == "synthetic" && o.epochs)
    throw pipeline::PipelineError("synthetic data is a stream without epochs: use --steps");
  const double lr = o.optimizer.effective_lr();
  const bool compiled = o.backend != "eager";
  const at::Device device =
      o.device == "cuda" && group ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(rank)) : at::Device(o.device);
  if (device.is_cuda() && !at::hasCUDA())
    throw pipeline::PipelineError(
        "--device cuda: no CUDA device is usable here (no GPU, or a LibTorch without "
        "CUDA); train with --device cpu");

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
  const bool deterministic = o.check_eager && device.is_cuda();
  if (deterministic) {
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
    at::globalContext().setBenchmarkCuDNN(false);
    at::globalContext().setAllowTF32CuDNN(false);
    at::globalContext().setFloat32MatmulPrecision("highest");
  }

  torch::manual_seed(o.seed);
  const models::Model model = models::make_model(o.model, o.size);
  model.module->to(device);
  // "cuda" names the current GPU; report the one the model is on.
  const at::Device placed = model.module->parameters().front().device();
  model.module->train();
  // With N ranks each step reads a global batch of N * --batch examples, and
  // each rank trains on its slice of it (the seed's DataParallel).
  TrainCommandOptions global = o;
  global.batch = o.batch * world;
  Data data = dataset == "synthetic" ? synthetic_data(global, model) : fashion_mnist_data(global);
  auto shard = [&](const data::Batch& b) {
    return world == 1
               ? b
               : data::Batch{b.inputs.narrow(0, rank * o.batch, o.batch), b.targets.narrow(0, rank * o.batch, o.batch)};
  };
  for (data::Batch& b : data.test_batches) b = on(b, device);
  const int64_t steps =
      o.steps ? *o.steps : (data.steps_per_epoch ? o.epochs.value_or(1) * data.steps_per_epoch : kSyntheticSteps);
  std::unique_ptr<torch::optim::Optimizer> optimizer = o.optimizer.make(model.module->parameters());

  std::optional<models::Model> eager;
  std::unique_ptr<torch::optim::Optimizer> eager_optimizer;
  // A fused backend's check (Note [Agreement with eager for a fused
  // backend]): a float64 copy for the first step, the backend's gradients
  // from identical state, both copies' losses at every step.
  const bool fused_check = o.check_eager && compiled && o.backend != "interpreter";
  std::optional<Float64Reference> reference;
  std::vector<at::Tensor> first_grads;
  std::vector<double> losses, eager_losses;
  if (o.check_eager) {
    eager.emplace(copy_of(o.model, o.size, model, device, at::kFloat));
    eager_optimizer = o.optimizer.make(eager->module->parameters());
  }
  if (fused_check) {
    reference.emplace(Float64Reference{copy_of(o.model, o.size, model, device, at::kDouble), nullptr});
    reference->optimizer = o.optimizer.make(reference->model.module->parameters());
  }

  int64_t num_params = 0;
  for (const auto& p : model.module->parameters()) num_params += p.numel();
  std::cout << "model " << o.model << " (" << num_params << " parameters) on " << data.description << "\n"
            << "optimizer " << o.optimizer.kind << " lr " << lr << ", batch " << o.batch;
  if (world > 1) std::cout << " per rank x " << world << " ranks (" << group->backend() << ")";
  std::cout << ", " << steps << " steps";
  if (data.steps_per_epoch) std::cout << " (" << data.steps_per_epoch << " per epoch)";
  std::cout << ", backend " << o.backend << " on " << placed << (deterministic ? " (deterministic kernels)" : "")
            << "\n";

  // Compile before the loop, so that throughput counts steps only.
  pipeline::Builder builder;
  if (compiled) {
    builder.backend(o.backend);
    o.compile.apply(builder);
  }
  if (fused_check) first_grads = compiled_gradients(builder, o.model, o.size, model, on(data.train_batch(0), device));
  runtime::PhaseTimer timer;
  runtime::Counters counters;
  std::function<at::Tensor(const std::vector<at::Tensor>&)> step;
  if (compiled) {
    // The step's builder counts and times its own compilations (and a
    // recompile, should a batch need one); the test forward's are not counted.
    pipeline::Builder timed = builder;
    timed.instrument(std::make_shared<runtime::CounterRecorder>(counters))
        .instrument(std::make_shared<runtime::StageTimer>(timer));
    const data::Batch first = shard(on(data.train_batch(0), device));
    if (group) {
      spmd::SpmdOptions so;
      so.builder = timed;
      so.parallel_mode.group = group->name();
      spmd::SpmdStep dp = spmd::compile(model.module, *optimizer, models::loss_of(model), so);
      dp.compile({first.inputs, first.targets});
      step = dp;
    } else {
      pipeline::TrainStep single = timed.compile_train_step(model.module, *optimizer, models::loss_of(model));
      single.compile({first.inputs, first.targets});
      step = single;
    }
    std::cout << "compile (" << o.backend << "): " << describe_stages(timer) << "\n";
  }
  std::cout.flush();

  // The global batch's loss from a rank's: the mean of the ranks' (equal
  // shards, mean loss).
  auto global_loss = [&](double rank_loss) {
    if (!group || world == 1) return rank_loss;
    std::vector<at::Tensor> l{
        at::full({1}, rank_loss,
                 at::TensorOptions(at::kDouble).device(group->backend() == "nccl" ? device : at::Device(at::kCPU)))};
    group->all_reduce_sum(l);
    return l[0].item<double>() / world;
  };
  using clock = std::chrono::steady_clock;
  double train_s = 0, eager_s = 0, loss = 0, eager_loss = 0;
  OneStepAgreement one_step;
  ProgressBar bar("train", steps, rank == 0 ? std::cerr : quiet, rank == 0 && isatty(2));
  const int64_t global_batch = o.batch * world;
  for (int64_t i = 0; i < steps; ++i) {
    const data::Batch b = on(data.train_batch(i), device), mine = shard(b);
    // Reading the loss (item()) waits for the step's kernels: the time is the step's on any device.
    auto start = clock::now();
    loss = (compiled ? step({mine.inputs, mine.targets}) : models::eager_train_step(model, *optimizer, mine))
               .item<double>();
    train_s += std::chrono::duration<double>(clock::now() - start).count();
    if (eager) {
      start = clock::now();
      eager_loss = models::eager_train_step(*eager, *eager_optimizer, b).item<double>();
      eager_s += std::chrono::duration<double>(clock::now() - start).count();
    }
    if (fused_check) {
      // Against eager's loss on the global batch: the ranks' mean.
      const double compiled_loss = global_loss(loss);
      losses.push_back(compiled_loss);
      eager_losses.push_back(eager_loss);
      if (i == 0) {
        const at::Tensor reference_loss =
            models::eager_train_step(reference->model, *reference->optimizer, in_float64(b));
        one_step = compare_one_step(at::scalar_tensor(compiled_loss, at::kDouble).to(at::kFloat),
                                    at::scalar_tensor(eager_loss, at::kDouble).to(at::kFloat), reference_loss,
                                    first_grads, *model.module, *eager->module, *reference->model.module);
        reference.reset();
      }
    }
    bar.update(i + 1, "loss " + fixed(loss, 4) + "  " +
                          fixed(static_cast<double>((i + 1) * global_batch) / train_s, 0) + " samples/s");
  }
  const double samples_per_s = static_cast<double>(steps * global_batch) / train_s;
  bar.finish("loss " + fixed(loss, 4) + (world > 1 ? " (rank 0)" : "") + "  " + fixed(samples_per_s, 0) + " samples/s");
  loss = global_loss(loss);

  // The test split through the forward compiled by the same builder (its AOT
  // inference path), or eagerly with --backend eager.
  std::function<at::Tensor(const at::Tensor&)> forward = model.forward;
  std::optional<autograd::AotModule> compiled_forward;
  if (compiled) {
    compiled_forward =
        builder.compile(model.module, [f = model.forward](torch::nn::Module&, const std::vector<at::Tensor>& in) {
          return std::vector<at::Tensor>{f(in.at(0))};
        });
    forward = [&compiled_forward](const at::Tensor& x) { return (*compiled_forward)({x}).at(0); };
  }
  int64_t counted = 0;
  const double accuracy = test_accuracy(*model.module, forward, data.test_batches, &counted);
  std::cout << "train: final loss " << fixed(loss, 4) << ", " << fixed(samples_per_s, 0) << " samples/s";
  if (eager) {
    const double eager_rate = static_cast<double>(steps * global_batch) / eager_s;
    std::cout << " (eager copy: " << fixed(eager_rate, 0) << " samples/s; compiled/eager "
              << fixed(samples_per_s / eager_rate, 2) << "x)";
  }
  std::cout << "\ntest accuracy: " << fixed(100 * accuracy, 2) << "% of " << counted
            << (gpt ? " next tokens" : " examples")
            << (compiled ? " (the forward compiled by the " + o.backend + " backend)" : std::string()) << "\n";
  if (compiled) std::cout << "counters: " << describe_counters(counters) << "\n";

  nlohmann::ordered_json j;
  j["model"] = o.model;
  j["backend"] = o.backend;
  j["device"] = placed.str();
  j["deterministic"] = deterministic;
  j["dataset"] = dataset;
  j["optimizer"] = o.optimizer.kind;
  j["batch"] = o.batch;
  j["ranks"] = world;
  j["steps"] = steps;
  j["final_loss"] = loss;
  j["test_accuracy"] = accuracy;
  j["samples_per_s"] = samples_per_s;
  j["compile_s"] = nlohmann::ordered_json::object();
  for (const auto& [stage, s] : ordered_stages(timer)) j["compile_s"][stage] = s;
  if (compiled) j["compile_s"]["total"] = total_stage_s(timer);
  j["counters"] = counters.snapshot();
  // Inductor and AOTAutograd count their disk caches' outcomes
  // process-wide, as torch's counters["inductor"] and
  // counters["aot_autograd"] (the test forward's compile too).
  auto all = runtime::default_counters().snapshot();
  for (const char* group : {"inductor", "aot_autograd"})
    if (all.contains(group)) j["counters"][group] = all[group];
  // The process's peaks so far: compiles, CUDA-graph captures, the steps,
  // the evaluation and an eager copy's training alike (runtime/memory.h).
  const runtime::MemoryPeaks peaks = runtime::memory_peaks(placed);
  j["memory"] = {{"peak_rss_bytes", peaks.rss_bytes}};
  if (peaks.device_allocated_bytes) {
    j["memory"]["peak_device_allocated_bytes"] = *peaks.device_allocated_bytes;
    j["memory"]["peak_device_reserved_bytes"] = peaks.device_reserved_bytes.value_or(0);
  }
  bool agree = true;
  if (eager) {
    const double diff = models::max_param_diff(*model.module, *eager->module);
    int64_t eager_counted = 0;
    const double eager_accuracy = test_accuracy(*eager->module, eager->forward, data.test_batches, &eager_counted);
    j["eager_final_loss"] = eager_loss;
    j["max_param_diff"] = diff;
    j["eager_test_accuracy"] = eager_accuracy;
    j["eager_samples_per_s"] = static_cast<double>(steps * global_batch) / eager_s;
    std::cout << "agreement with eager: max |param diff| " << sci(diff) << ", final loss " << fixed(loss, 6) << " vs "
              << fixed(eager_loss, 6) << " (|diff| " << sci(std::abs(loss - eager_loss)) << "), test accuracy "
              << fixed(100 * accuracy, 2) << "% vs " << fixed(100 * eager_accuracy, 2) << "%: ";
    if (fused_check) {
      // See Note [Agreement with eager for a fused backend].
      const double curve = loss_curve_difference(losses, eager_losses);
      const double points = 100 * std::abs(accuracy - eager_accuracy);
      agree = one_step.ok() && curve <= kLossCurveRtol && points <= kAccuracyPoints;
      j["one_step"] = {
          {"loss", one_step.loss.ok}, {"gradients", one_step.gradients.ok}, {"parameters", one_step.parameters.ok}};
      j["loss_curve_max_rel_diff"] = curve;
      j["accuracy_diff_points"] = points;
      auto verdict = [](const runtime::SameResult& r) {
        return r.ok ? std::string("ok") : "DIFFER (" + r.reason + ")";
      };
      std::cout << (agree ? "agree" : "DIFFER") << " as a fused backend should: one step from the same state: loss "
                << verdict(one_step.loss) << ", gradients " << verdict(one_step.gradients) << ", parameters "
                << verdict(one_step.parameters) << " (same(), float64 reference); loss curves within "
                << fixed(100 * curve, 2) << "% (at most 2%); test accuracy " << fixed(points, 2)
                << " points apart (at most 1)\n";
    } else {
      agree = diff <= o.tolerance;
      std::cout << (agree ? "agree" : "DIFFER") << " within " << sci(o.tolerance) << "\n";
    }
  }
  if (o.json) std::cout << j.dump() << "\n";
  std::cout.flush();
  if (!agree)
    throw pipeline::PipelineError(fused_check ? "the compiled training does not agree with the eager copy (see above)"
                                              : "the compiled training ended more than --tolerance " +
                                                    sci(o.tolerance) + " away from the eager copy");
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
  cmd->add_option("--device", o->device, "where the model, the batches and the optimizer state live")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
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
  cmd->callback([o] { run_train_command(*o); });
}

}  // namespace crucible::tools
