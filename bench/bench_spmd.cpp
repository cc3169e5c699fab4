// crucible_spmd_bench: the data-parallel training step of spmd::compile and
// the all_reduce bandwidth under it, one process per rank:
//
//   crucible launch --nproc 2 -- crucible_spmd_bench --model=gpt --size=full --device=cuda
//   crucible_spmd_bench --model=gpt --size=full --device=cuda       # one process: the 1-GPU rows
//
// Our flags (before Google Benchmark's own): --model, --size (zoo names),
// --device cpu|cuda, --batch (per rank), --steps (timed steps per row),
// --backend (the step's backend), --matmul-precision highest|high (high lets
// cuBLAS use TF32, as torch.set_float32_matmul_precision does),
// --memory-format contiguous|channels-last (channels-last: the model's 4-D
// parameters and the images, as model.to(memory_format=torch.channels_last)),
// --remat auto|off|B (auto: the builder's default, Builder::remat; B, a
// memory budget in [0, 1]: rematerialization inside the step's graph
// wherever it lowers the peak, Note [Rematerialization in one graph], as
// `crucible train --partitioner min-cut --memory-budget B`), --remat-ban on|off (on: with
// MinCutOptions::ban_materialized_backwards), --pre-grad-passes P,Q,...
// (pre-grad passes by name, e.g. fuse_attention, in place of the backend's
// (the inductor's fuse_flash_attention); none: no pass; Note
// [Pre-grad passes in a training step]), --autocast off|bf16|f16 (the forward and the loss under
// autocast on the step's device, as `with torch.autocast(...)` around them;
// runtime::AutocastGuard), --broadcast-buffers on|off (SpmdOptions::
// broadcast_buffers: rank 0's buffers copied to every rank before each
// step, Note [Buffers across ranks]), --trace DIR (after a step row's timed steps,
// three more steps each recorded by PyTorch's profiler (Kineto: host ops
// and every GPU kernel, NCCL's included, with its stream) into
// DIR/<row>_<model>[_<MB>].rank<R>.step<K>.json, Chrome trace format;
// bench/trace_overlap.py reads them: how much of the all_reduce ran under
// the backward), --peak-tflops P (the device's peak TFLOPS for the step's
// dtype: an H100 SXM's or H200's dense bf16 is 989, TF32 495, fp32 67;
// BM_Step then counts MFU, the step's TFLOPS over P), --busy N (N processes
// that spin on the CPU for the whole run, as other jobs on a shared machine
// would: Note [Threads on a shared machine] in inductor/src/runtime/threads.cpp),
// --dist-backend auto|gloo|nccl (the group's; ranks beyond the GPUs share
// them, local rank modulo the count, which only Gloo allows: to compare a
// rank's memory under replicate and fully_shard on one GPU), --param-dtype
// off|bf16 (the fully-sharded rows: DataParallelOptions::param_dtype, the
// parameters gathered in bf16 over float32 shards, as FSDP2's
// MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=float32)).
//
// Under `crucible launch` the step rows count slowest_rank_ms: the most
// milliseconds a step took on any rank (each row is rank 0's own time).
// Memory (runtime/memory.h), in MiB: process_alloc_MiB and
// process_reserved_MiB, the caching allocator's peaks over the whole
// process up to the row's end (compile, CUDA-graph capture, warm-up and the
// timed steps: as torch.cuda.max_memory_allocated and max_memory_reserved
// count them; run one row per process for a row's own, as
// bench/zoo_gpu.sh does), step_alloc_MiB and step_reserved_MiB, their peaks
// over the timed steps alone (a CUDA graph's pool counts as reserved: its
// replays allocate nothing), and on the CPU process_rss_MiB, the resident
// set's peak. BM_Step's plan_MiB: what the backend's plan says one call of
// the step holds, its inputs included (runtime::PlannedMemory; without a
// CUDA graph, step_alloc_MiB measures the same); estimated_ms: the
// backend's cost model's time for a step (the inductor's roofline).
//
// Rows (real time; every iteration ends by reading the loss, which waits for
// the step's kernels):
//   BM_Step/<model>            the compiled step without spmd (each rank alone);
//                              TFLOPS: its graph's matmul, convolution and
//                              attention FLOPs (ir/flop_count.h) per second
//   BM_StepEager/<model>       the same step in eager LibTorch
//   BM_SpmdStep/<model>/<MB>   the data-parallel step, gradient buckets of MB MiB
//   BM_FullyShardStep/<model>/<MB>/b<B>  the fully-sharded step (parameters,
//                              gradients and optimizer state sharded), MB MiB
//                              of parameters gathered ahead of their use,
//                              gathers and gradients in buckets of B MiB (0:
//                              one collective per parameter)
//   BM_GradAllReduce/<model>/<MB>  that step's buckets alone, all_reduced one
//                              after another: the communication the step has
//                              to hide (hidden = this - (SpmdStep - Step));
//                              algbw and busbw as BM_AllReduce's
//   BM_AllReduce/<MB>          one all_reduce of MB MiB of float32; counters
//                              algbw and busbw in bytes/s as nccl-tests
//                              defines them (busbw = algbw * 2 (n - 1) / n)
//
// Every rank must run the same rows the same number of times, or a
// collective waits for a rank that never comes: the rows therefore have
// fixed iteration counts, and ranks other than 0 run them silently.
#include <crucible/ir/flop_count.h>
#include <crucible/models/zoo.h>
#include <crucible/partitioner/min_cut_partition.h>
#include <crucible/pipeline/builder.h>
#include <crucible/runtime/autocast.h>
#include <crucible/runtime/backend_registry.h>
#include <crucible/runtime/instruments.h>
#include <crucible/runtime/memory.h>
#include <crucible/spmd/api.h>
#include <crucible/spmd/collectives.h>
#include <crucible/spmd/process_group.h>

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <benchmark/benchmark.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

using namespace crucible;

struct Flags {
  std::string model = "gpt", size = "small", device = "cpu", backend = "interpreter", matmul_precision = "highest",
              memory_format = "contiguous", remat = "auto", remat_ban = "off", pre_grad_passes, autocast = "off",
              broadcast_buffers = "on", trace, dist_backend = "auto", param_dtype = "off";
  int64_t batch = 8, steps = 20, busy = 0;
  double peak_tflops = 0;  // the device's peak for the step's dtype; 0: no MFU
};

// Takes our --key=value flags out of argv, leaving Google Benchmark's.
Flags parse_flags(int& argc, char** argv) {
  Flags f;
  std::map<std::string, std::string*> strings{{"--model", &f.model},
                                              {"--size", &f.size},
                                              {"--device", &f.device},
                                              {"--backend", &f.backend},
                                              {"--matmul-precision", &f.matmul_precision},
                                              {"--memory-format", &f.memory_format},
                                              {"--remat", &f.remat},
                                              {"--remat-ban", &f.remat_ban},
                                              {"--pre-grad-passes", &f.pre_grad_passes},
                                              {"--autocast", &f.autocast},
                                              {"--broadcast-buffers", &f.broadcast_buffers},
                                              {"--trace", &f.trace},
                                              {"--dist-backend", &f.dist_backend},
                                              {"--param-dtype", &f.param_dtype}};
  std::map<std::string, int64_t*> ints{{"--batch", &f.batch}, {"--steps", &f.steps}, {"--busy", &f.busy}};
  std::map<std::string, double*> doubles{{"--peak-tflops", &f.peak_tflops}};
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq);
    if (eq != std::string::npos && strings.contains(key)) {
      *strings[key] = arg.substr(eq + 1);
    } else if (eq != std::string::npos && ints.contains(key)) {
      *ints[key] = std::stoll(arg.substr(eq + 1));
    } else if (eq != std::string::npos && doubles.contains(key)) {
      *doubles[key] = std::stod(arg.substr(eq + 1));
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  if (f.param_dtype != "off" && f.param_dtype != "bf16")
    throw std::runtime_error("--param-dtype must be off or bf16, not " + f.param_dtype);
  return f;
}

// --busy: processes that spin until this one ends (killed by the
// destructor, or by the kernel if this process dies first).
class BusyLoops {
 public:
  explicit BusyLoops(int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const pid_t pid = fork();
      if (pid < 0) throw std::runtime_error("--busy: fork failed");
      if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        volatile uint64_t spin = 0;
        for (;;) benchmark::DoNotOptimize(spin);
      }
      pids_.push_back(pid);
    }
  }
  ~BusyLoops() {
    for (const pid_t pid : pids_) kill(pid, SIGKILL);
    for (const pid_t pid : pids_) waitpid(pid, nullptr, 0);
  }
  BusyLoops(const BusyLoops&) = delete;
  BusyLoops& operator=(const BusyLoops&) = delete;

 private:
  std::vector<pid_t> pids_;
};

// The rows' shared set-up: the group (none in a single process), the
// device this rank uses, and the flags.
struct Shared {
  Flags flags;
  std::optional<spmd::ProcessGroup> group;
  at::Device device = at::kCPU;
  int world() const { return group ? group->size() : 1; }
};

Shared& context() {
  static Shared c;
  return c;
}

// A zoo model on this rank's device with AdamW (nanoGPT's optimizer) and a
// batch of its own (seeded by rank, as a rank's shard would differ).
struct Replica {
  models::Model model;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  std::vector<at::Tensor> batch;

  Replica() : model(make()) {
    const Shared& c = context();
    model.module->to(c.device);
    model.module->train();
    if (channels_last())
      for (at::Tensor& p : model.module->parameters())
        if (p.dim() == 4) p.set_data(p.data().contiguous(at::MemoryFormat::ChannelsLast));
    optimizer = std::make_unique<torch::optim::AdamW>(model.module->parameters(), torch::optim::AdamWOptions(3e-4));
    const data::Batch b = model.example_batch(c.flags.batch, 1 + (c.group ? c.group->rank() : 0));
    batch = {b.inputs.to(c.device), b.targets.to(c.device)};
    if (channels_last() && batch[0].dim() == 4) batch[0] = batch[0].contiguous(at::MemoryFormat::ChannelsLast);
  }
  static bool channels_last() {
    const std::string& f = context().flags.memory_format;
    if (f != "contiguous" && f != "channels-last")
      throw std::invalid_argument("--memory-format: contiguous or channels-last, not " + f);
    return f == "channels-last";
  }
  static models::Model make() {
    torch::manual_seed(0);
    return models::make_model(context().flags.model, context().flags.size);
  }
};

// The index of this rank's GPU.
c10::DeviceIndex gpu_index() {
  const at::Device& d = context().device;
  return d.has_index() ? d.index() : at::accelerator::getDeviceIndex();
}

// Runs `step` a few times untimed (the caching allocator, cuBLAS and cuDNN
// warm up), then once per iteration, reading the loss each time. Returns
// the seconds a timed step took, on average.
template <typename Step>
double time_steps(benchmark::State& state, Step&& step) {
  for (int i = 0; i < 3; ++i) step().template item<double>();
  const Shared& c = context();
  const runtime::MemoryPeaks before = runtime::memory_peaks(c.device);
  runtime::reset_memory_peaks(c.device);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) benchmark::DoNotOptimize(step().template item<double>());
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
                    static_cast<double>(state.iterations());
  if (c.group) {
    // Rank 0 reports its own time; a data-parallel step waits for the slowest.
    double slowest = 0;
    for (const std::string& v : c.group->all_gather_string("step_ms", std::to_string(ms)))
      slowest = std::max(slowest, std::stod(v));
    state.counters["slowest_rank_ms"] = slowest;
  }
  const runtime::MemoryPeaks steady = runtime::memory_peaks(c.device);
  auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
  state.counters["process_rss_MiB"] = mib(std::max(before.rss_bytes, steady.rss_bytes));
  if (steady.device_allocated_bytes) {
    state.counters["process_alloc_MiB"] = mib(std::max(*before.device_allocated_bytes, *steady.device_allocated_bytes));
    state.counters["process_reserved_MiB"] =
        mib(std::max(*before.device_reserved_bytes, *steady.device_reserved_bytes));
    state.counters["step_alloc_MiB"] = mib(*steady.device_allocated_bytes);
    state.counters["step_reserved_MiB"] = mib(*steady.device_reserved_bytes);
  }
  state.counters["samples/s"] =
      benchmark::Counter(static_cast<double>(c.flags.batch * c.world()), benchmark::Counter::kIsIterationInvariantRate);
  return ms / 1e3;
}

// --trace: three steps after the timed ones, each alone in a trace of its
// own (the device is idle before and after it, so the trace holds one whole
// step), as torch.profiler.profile(activities=[CPU, CUDA]) records them.
template <typename Step>
void trace_steps(const std::string& row, Step&& step) {
  const Shared& c = context();
  if (c.flags.trace.empty()) return;
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const std::set<ActivityType> activities = c.device.is_cuda()
                                                ? std::set<ActivityType>{ActivityType::CPU, ActivityType::CUDA}
                                                : std::set<ActivityType>{ActivityType::CPU};
  const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
  std::filesystem::create_directories(c.flags.trace);
  for (int k = 0; k < 3; ++k) {
    if (c.device.is_cuda()) at::accelerator::synchronizeDevice(gpu_index());
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
    step().template item<double>();
    if (c.device.is_cuda()) at::accelerator::synchronizeDevice(gpu_index());
    prof::disableProfiler()->save(c.flags.trace + "/" + row + ".rank" + std::to_string(c.group ? c.group->rank() : 0) +
                                  ".step" + std::to_string(k) + ".json");
  }
}

// The bucket sizes (bytes) of the latest BM_SpmdStep per bucket size, for
// BM_GradAllReduce, which runs after it (rows run in registration order).
std::map<int64_t, std::vector<int64_t>>& buckets_of() {
  static std::map<int64_t, std::vector<int64_t>> m;
  return m;
}

// The step's builder: the backend asked for; inductor (and
// inductor-cudagraphs) with the core decompositions, which turn softmax,
// layer norm, GELU and the loss into the pointwise ops and reductions it fuses.
pipeline::Builder builder() {
  pipeline::Builder b;
  b.backend(context().flags.backend);  // the inductor's bring the core decompositions
  std::vector<std::string> pre_grad;
  for (std::stringstream list(context().flags.pre_grad_passes); list.good();) {
    std::string name;
    std::getline(list, name, ',');
    if (!name.empty()) pre_grad.push_back(name);
  }
  if (pre_grad == std::vector<std::string>{"none"})
    b.pre_grad_passes({});
  else if (!pre_grad.empty())
    b.pre_grad_passes(pre_grad);  // else the backend's
  if (context().flags.remat == "off") {
    b.remat(std::nullopt);
  } else if (context().flags.remat != "auto") {
    partitioner::MinCutOptions options;
    options.memory_budget = std::stod(context().flags.remat);
    options.ban_materialized_backwards = context().flags.remat_ban == "on";
    b.remat(options);
  }
  return b;
}

// The model's loss, its forward and loss under autocast where --autocast
// asks for it.
pipeline::LossFn loss_fn(const models::Model& model) {
  pipeline::LossFn loss = models::loss_of(model);
  const std::string& a = context().flags.autocast;
  if (a == "off") return loss;
  if (a != "bf16" && a != "f16") throw std::invalid_argument("--autocast: off, bf16 or f16, not " + a);
  const at::ScalarType dtype = a == "bf16" ? at::kBFloat16 : at::kHalf;
  return [loss, dtype, device = context().device.type()](torch::nn::Module& m, const std::vector<at::Tensor>& batch) {
    runtime::AutocastGuard autocast(device, dtype);
    return loss(m, batch);
  };
}

void step_alone(benchmark::State& state) {
  Replica r;
  pipeline::TrainStep step = builder().compile_train_step(r.model.module, *r.optimizer, loss_fn(r.model));
  step.compile(r.batch);
  const double seconds = time_steps(state, [&] { return step(r.batch); });
  // The step's matmul, convolution and attention FLOPs, from its graph.
  const double tflops = static_cast<double>(ir::count_flops(step.graph()).total) / 1e12 / seconds;
  state.counters["TFLOPS"] = tflops;
  if (const double peak = context().flags.peak_tflops; peak > 0) state.counters["MFU"] = tflops / peak;
  // What the backend's plan says a call holds, the inputs (state and
  // batch) included: to set beside step_alloc_MiB (runtime/memory.h).
  const runtime::BackendRegistry registry = runtime::BackendRegistry::builtin();
  if (const runtime::BackendInfo& info = registry.get(context().flags.backend); info.plan_memory) {
    const runtime::PlannedMemory m = info.plan_memory(step.graph());
    state.counters["plan_MiB"] = static_cast<double>(m.input_bytes + m.peak_bytes) / (1 << 20);
  }
  if (const runtime::BackendInfo& info = registry.get(context().flags.backend); info.estimated_ms)
    state.counters["estimated_ms"] = info.estimated_ms(step.graph());
  trace_steps("Step_" + context().flags.model, [&] { return step(r.batch); });
}

// models::eager_train_step, with loss_fn's loss.
void step_eager(benchmark::State& state) {
  Replica r;
  const pipeline::LossFn loss = loss_fn(r.model);
  time_steps(state, [&] {
    r.optimizer->zero_grad();
    at::Tensor l = loss(*r.model.module, r.batch);
    l.backward();
    r.optimizer->step();
    return l.detach();
  });
}

void step_spmd(benchmark::State& state, int64_t bucket_mb) {
  Replica r;
  spmd::SpmdOptions o;
  o.builder = builder();
  o.parallel_mode.group = context().group->name();
  o.parallel_mode.bucket_bytes = bucket_mb << 20;
  o.broadcast_buffers = context().flags.broadcast_buffers == "on";
  spmd::SpmdStep step = spmd::compile(r.model.module, *r.optimizer, loss_fn(r.model), o);
  step.compile(r.batch);
  time_steps(state, [&] { return step(r.batch); });
  trace_steps("SpmdStep_" + context().flags.model + "_" + std::to_string(bucket_mb), [&] { return step(r.batch); });
  buckets_of()[bucket_mb] = step.report().data_parallel.bucket_bytes;
  state.counters["buckets"] = static_cast<double>(buckets_of()[bucket_mb].size());
}

// The fully-sharded step (Note [Fully-sharded step]): parameters gathered
// ahead of their use up to `prefetch_mb` MiB, reshard after forward, and
// buckets of `bucket_mb` MiB (0: one collective per parameter).
void step_fully_shard(benchmark::State& state, int64_t prefetch_mb, int64_t bucket_mb) {
  Replica r;
  spmd::SpmdOptions o;
  o.builder = builder();
  o.parallel_mode.group = context().group->name();
  o.parallel_mode.style = spmd::DataParallelStyle::FullyShard;
  o.parallel_mode.prefetch_bytes = prefetch_mb << 20;
  o.parallel_mode.bucket_bytes = bucket_mb << 20;
  if (context().flags.param_dtype == "bf16") o.parallel_mode.param_dtype = at::kBFloat16;
  o.broadcast_buffers = context().flags.broadcast_buffers == "on";
  spmd::SpmdStep step = spmd::compile(r.model.module, *r.optimizer, loss_fn(r.model), o);
  step.compile(r.batch);
  time_steps(state, [&] { return step(r.batch); });
  trace_steps(
      "FullyShardStep_" + context().flags.model + "_" + std::to_string(prefetch_mb) + "_b" + std::to_string(bucket_mb),
      [&] { return step(r.batch); });
  state.counters["all_gathers"] = static_cast<double>(step.report().fully_shard.all_gathers);
  state.counters["reduce_scatters"] = static_cast<double>(step.report().fully_shard.reduce_scatters);
}

// One all_reduce per tensor, in order, through the functional collectives the
// step's graph runs (each issued on a copy of its tensor, waited after the
// last is issued); reading an element of the last one waits for all of them.
double all_reduce(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> reduced;
  for (const at::Tensor& t : tensors)
    reduced.push_back(spmd::all_reduce(t, spmd::ReduceOp::Sum, context().group->name()));
  for (const at::Tensor& r : reduced) spmd::wait_tensor(r);
  return reduced.back().flatten()[0].item<double>();
}

// algbw and busbw of `bytes` all_reduced per iteration, in bytes per
// second (printed as e.g. "busbw=352G/s"), as nccl-tests defines them.
void count_bandwidth(benchmark::State& state, int64_t bytes) {
  const double n = context().world();
  state.counters["algbw"] =
      benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["busbw"] =
      benchmark::Counter(static_cast<double>(bytes) * 2 * (n - 1) / n, benchmark::Counter::kIsIterationInvariantRate);
}

void grad_all_reduce(benchmark::State& state, int64_t bucket_mb) {
  if (!buckets_of().contains(bucket_mb)) {
    state.SkipWithError("BM_GradAllReduce reduces the buckets BM_SpmdStep measured: run that row first");
    return;
  }
  std::vector<at::Tensor> buckets;
  int64_t bytes = 0;
  for (const int64_t b : buckets_of().at(bucket_mb)) {
    buckets.push_back(at::zeros({b / 4}, at::TensorOptions(at::kFloat).device(context().device)));
    bytes += b;
  }
  for (int i = 0; i < 3; ++i) all_reduce(buckets);
  for (auto _ : state) benchmark::DoNotOptimize(all_reduce(buckets));
  state.counters["buckets"] = static_cast<double>(buckets.size());
  state.counters["MiB"] = static_cast<double>(bytes) / (1 << 20);
  count_bandwidth(state, bytes);
}

void all_reduce_bandwidth(benchmark::State& state, int64_t mb) {
  const int64_t bytes = mb << 20;
  std::vector<at::Tensor> t{at::ones({bytes / 4}, at::TensorOptions(at::kFloat).device(context().device))};
  for (int i = 0; i < 3; ++i) all_reduce(t);
  for (auto _ : state) benchmark::DoNotOptimize(all_reduce(t));
  count_bandwidth(state, bytes);
}

void register_rows() {
  const Shared& c = context();
  const std::string& m = c.flags.model;
  auto fixed = [&](benchmark::internal::Benchmark* b, int64_t iterations) {
    b->Iterations(iterations)->UseRealTime()->Unit(benchmark::kMillisecond);
  };
  fixed(benchmark::RegisterBenchmark(("BM_StepEager/" + m).c_str(), step_eager), c.flags.steps);
  fixed(benchmark::RegisterBenchmark(("BM_Step/" + m).c_str(), step_alone), c.flags.steps);
  if (c.world() < 2) return;
  for (const int64_t mb : {1, 4, 25, 100}) {
    const std::string suffix = m + "/" + std::to_string(mb);
    fixed(benchmark::RegisterBenchmark(("BM_SpmdStep/" + suffix).c_str(), step_spmd, mb), c.flags.steps);
    fixed(benchmark::RegisterBenchmark(("BM_GradAllReduce/" + suffix).c_str(), grad_all_reduce, mb), c.flags.steps);
  }
  for (const auto& [prefetch, bucket] : {std::pair{4, 0}, std::pair{25, 0}, std::pair{25, 25}, std::pair{100, 25}})
    fixed(benchmark::RegisterBenchmark(
              ("BM_FullyShardStep/" + m + "/" + std::to_string(prefetch) + "/b" + std::to_string(bucket)).c_str(),
              step_fully_shard, int64_t{prefetch}, int64_t{bucket}),
          c.flags.steps);
  for (const int64_t mb : {1, 4, 25, 100, 1024})
    fixed(benchmark::RegisterBenchmark(("BM_AllReduce/" + std::to_string(mb)).c_str(), all_reduce_bandwidth, mb), 20);
}

// Ranks other than 0 run every row and report none.
class Silent : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  Shared& c = context();
  c.flags = parse_flags(argc, argv);
  at::globalContext().setFloat32MatmulPrecision(c.flags.matmul_precision);
  if (std::getenv("WORLD_SIZE") != nullptr) {
    spmd::ProcessGroupOptions g = spmd::options_from_env();
    g.device = c.flags.device;
    g.backend = c.flags.dist_backend;
    c.group = spmd::init_process_group(g);
    c.device = c.flags.device == "cuda"
                   ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(
                                               g.local_rank % std::max<int>(1, static_cast<int>(at::getNumGPUs()))))
                   : at::Device(at::kCPU);
  } else {
    c.device = at::Device(c.flags.device);
  }
  const bool reporting = !c.group || c.group->rank() == 0;
  // Only rank 0 writes --benchmark_out; the others would race it for the file.
  int kept = 1;
  for (int i = 1; i < argc; ++i)
    if (reporting || std::string(argv[i]).rfind("--benchmark_out", 0) != 0) argv[kept++] = argv[i];
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_rows();
  const BusyLoops busy(c.flags.busy);
  if (reporting) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    Silent silent;
    benchmark::RunSpecifiedBenchmarks(&silent);
  }
  benchmark::Shutdown();
  // What the compilers did: trace modes, cache outcomes, passes that
  // changed a graph (runtime/instruments.h).
  if (reporting) std::cerr << runtime::default_counters().report();
  // The group goes before CUDA does: `c` outlives main, and an NCCL group
  // destroyed after CUDA has shut down aborts the process at exit.
  if (c.group) {
    spmd::destroy_process_group(c.group->name());
    c.group.reset();
  }
  return 0;
}
