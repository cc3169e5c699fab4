// Exported training steps (Note [Exported training step] in
// pipeline/export.h) against the step in the process: two copies of a zoo
// model from the same weights, one trained by the compiled step, the other
// by the package loaded back (crucible::load_train_step), on the same
// batches, and a third trained from the package's own copies in another
// process (Note [Another process]). The package runs the kernels the
// process compiled, on the same operands in the same order, so all end
// bitwise equal. A package that is corrupt, altered, of another format or
// for other inputs is refused with an error that names the fault.
#include <crucible/inductor/error.h>
#include <crucible/inductor/options.h>
#include <crucible/inductor/package.h>
#include <crucible/ir/interpreter.h>
#include <crucible/loader/train_step.h>
#include <crucible/models/zoo.h>
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/error.h>
#include <crucible/pipeline/export.h>
#include <crucible/runtime/disk_cache.h>
#include <crucible/runtime/package.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/serialize.h>
#include <torch/utils.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "catch.h"
#include "graph_testing.h"
#include "testing.h"

using namespace crucible;
using namespace crucible::models;

namespace {

// A fresh directory (testing::temp_dir), removed where the test passes.
struct TempDir {
  std::filesystem::path path = testing::temp_dir("crucible_export");
  ~TempDir() {
    if (!std::uncaught_exceptions()) std::filesystem::remove_all(path);
  }
};

// One OpenMP thread while it lives. A compiled graph on the CPU picks each
// call's thread count from its timings (Note [Threads on a shared
// machine]), and ATen's kernels may round otherwise with another count: on
// a busy machine the process's step and the loaded one, each tuning its own,
// can then differ in the last bit. With one thread both run alike.
struct OneThread {
  int before = at::get_num_threads();
  OneThread() { at::set_num_threads(1); }
  ~OneThread() { at::set_num_threads(before); }
};

// Deterministic CUDA kernels while it lives (torch.use_deterministic_
// algorithms): cuDNN's default weight-gradient kernels and ATen's
// index_add accumulate with atomics in no fixed order, so two runs of the
// same kernels on the same operands may differ in the last bit.
struct DeterministicKernels {
  bool before = at::globalContext().deterministicAlgorithms();
  bool warn_only = at::globalContext().deterministicAlgorithmsWarnOnly();
  bool benchmark = at::globalContext().benchmarkCuDNN();
  DeterministicKernels() {
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
    at::globalContext().setBenchmarkCuDNN(false);
  }
  ~DeterministicKernels() {
    at::globalContext().setDeterministicAlgorithms(before, warn_only);
    at::globalContext().setBenchmarkCuDNN(benchmark);
  }
};

// Note [Another process]: the package trained in a process of its own. The
// test binary runs itself on the hidden test case "export worker" below,
// told by environment variables which package to train on which batches
// and where to write its losses and trained weights.
constexpr const char* kWorkerPackage = "CRUCIBLE_EXPORT_WORKER_PACKAGE";
constexpr const char* kWorkerBatches = "CRUCIBLE_EXPORT_WORKER_BATCHES";
constexpr const char* kWorkerOut = "CRUCIBLE_EXPORT_WORKER_OUT";

std::string saved(const std::vector<at::Tensor>& tensors) {
  std::ostringstream out;
  torch::save(tensors, out);
  return out.str();
}

std::vector<at::Tensor> loaded_tensors(const std::string& bytes) {
  std::vector<at::Tensor> tensors;
  std::istringstream in(bytes);
  torch::load(tensors, in);
  return tensors;
}

// The losses of the package in `package` trained by another process on
// `batches` (each step's inputs and targets), then its weights
// (named_module_state's order).
std::vector<at::Tensor> train_in_another_process(const std::string& package,
                                                 const std::vector<std::vector<at::Tensor>>& batches) {
  std::vector<at::Tensor> flat;
  for (const std::vector<at::Tensor>& b : batches) flat.insert(flat.end(), b.begin(), b.end());
  const std::string batches_file = package + ".batches.pt", out_file = package + ".out.pt";
  runtime::write_atomically(batches_file, saved(flat));
  ::setenv(kWorkerPackage, package.c_str(), 1);
  ::setenv(kWorkerBatches, batches_file.c_str(), 1);
  ::setenv(kWorkerOut, out_file.c_str(), 1);
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string log = package + ".log";
  const int rc = std::system(("'" + exe + "' 'export worker' > '" + log + "' 2>&1").c_str());
  for (const char* name : {kWorkerPackage, kWorkerBatches, kWorkerOut}) ::unsetenv(name);
  INFO("the worker's output:\n" << runtime::read_file(log));
  REQUIRE(rc == 0);
  std::vector<at::Tensor> out = loaded_tensors(runtime::read_file(out_file));
  for (const std::string& f : {batches_file, out_file, log}) std::filesystem::remove(f);
  return out;
}

template <typename Optimizer, typename Options>
void export_and_compare(const std::function<Model()>& make, const Options& options, const std::string& backend,
                        int64_t batch_size, int64_t steps, bool with_state = true, at::Device device = at::kCPU) {
  INFO("backend " << backend << " on " << device << (with_state ? "" : ", exported without state"));
  const OneThread one_thread;
  const DeterministicKernels deterministic;
  torch::manual_seed(0);
  const Model in_process = make(), loaded = make();
  in_process.module->to(device);
  loaded.module->to(device);
  copy_state(*in_process.module, *loaded.module);
  in_process.module->train();
  loaded.module->train();
  auto batch = [&](int64_t seed) {
    const data::Batch b = in_process.example_batch(batch_size, seed);
    return std::vector<at::Tensor>{b.inputs.to(device), b.targets.to(device)};
  };
  Optimizer optimizer(in_process.module->parameters(), options);
  const pipeline::TrainStep step =
      pipeline::Builder().backend(backend).compile_train_step(in_process.module, optimizer, loss_of(in_process));
  const std::vector<at::Tensor> example = batch(100);
  TempDir dir;
  pipeline::export_train_step(step, example, dir.path.string(), {.state = with_state, .cuda_archs = {}});
  if (!with_state) CHECK_THROWS_WITH(load_train_step(dir.path.string()), CRUCIBLE_HAS_SUBSTR("holds no weights"));

  // Without a module: the package's own copies, as exported (a copy of
  // the module's where the package holds none).
  const Model copy = make();
  copy.module->to(device);
  copy_state(*in_process.module, *copy.module);
  const LoadedTrainStep own =
      with_state ? load_train_step(dir.path.string()) : load_train_step(dir.path.string(), copy.module);
  auto named = in_process.module->named_parameters();
  for (const auto& [name, t] : own.named_module_state())
    if (named.contains(name)) CHECK(at::equal(t, named[name]));
  REQUIRE(own.example_batch().size() == 2);
  CHECK(at::equal(own.example_batch()[0], example[0]));

  // The package's own copies, trained by another process (Note [Another
  // process]) on the batches this one trains on next.
  std::vector<std::vector<at::Tensor>> batches;
  for (int64_t i = 0; i < steps; ++i) batches.push_back(batch(200 + i));
  const std::vector<at::Tensor> elsewhere =
      with_state ? train_in_another_process(dir.path.string(), batches) : std::vector<at::Tensor>{};

  // With a module: its parameters, trained as the process trains its twin.
  const LoadedTrainStep step_loaded = load_train_step(dir.path.string(), loaded.module);
  for (int64_t i = 0; i < steps; ++i) {
    const at::Tensor expected = step(batches[i]);
    const at::Tensor got = step_loaded(batches[i]);
    INFO("step " << i);
    REQUIRE(at::equal(got, expected));
    if (with_state) REQUIRE(at::equal(elsewhere.at(i).to(device), expected));
  }
  if (with_state) {
    const auto state = step_loaded.named_module_state();
    REQUIRE(elsewhere.size() == static_cast<size_t>(steps) + state.size());
    for (size_t k = 0; k < state.size(); ++k) {
      INFO("another process's " << state[k].first);
      REQUIRE(at::equal(elsewhere[steps + k].to(device), state[k].second));
    }
  }
  REQUIRE(step.num_compilations() == 1);
  auto trained = loaded.module->named_parameters();
  double moved = 0;
  for (const auto& p : in_process.module->named_parameters()) {
    INFO("parameter " << p.key());
    REQUIRE(at::equal(trained[p.key()], p.value()));
  }
  for (const auto& [name, t] : own.named_module_state())
    if (named.contains(name)) {
      const at::Tensor change = (named[name] - t).abs().max();
      moved = std::max(moved, change.item<double>());
    }
  CHECK(moved > 1e-4);  // the steps trained
}

}  // namespace

TEST_CASE("export_train_step: a loaded package trains bitwise as the step in the process", "[pipeline][export]") {
  for (const std::string backend : {"inductor", "interpreter"}) {
    export_and_compare<torch::optim::Adam>([] { return make_mlp(); }, torch::optim::AdamOptions(1e-3), backend, 16, 5);
    export_and_compare<torch::optim::Adam>([] { return make_mlp(); }, torch::optim::AdamOptions(1e-3), backend, 16, 5,
                                           /*with_state=*/false);
    const GptConfig gpt{.vocab_size = 32, .block_size = 16, .n_layer = 1, .n_head = 2, .n_embd = 32};
    export_and_compare<torch::optim::AdamW>([&] { return make_gpt(gpt); }, torch::optim::AdamWOptions(3e-3), backend, 4,
                                            3);
  }
  // The zoo's convolutional models, through the inductor (its C++ kernels
  // for batch norm, pooling and the convolutions' epilogues).
  const ResNetConfig resnet{.in_channels = 1, .image_size = 16, .width = 4, .blocks = {1, 1, 1, 1}};
  export_and_compare<torch::optim::Adam>([] { return make_convnet(); }, torch::optim::AdamOptions(1e-3), "inductor", 8,
                                         3);
  export_and_compare<torch::optim::AdamW>([&] { return make_resnet(resnet); }, torch::optim::AdamWOptions(1e-3),
                                          "inductor", 8, 3, /*with_state=*/false);
}

// A step whose loss reads a tensor from outside the module (a lifted input,
// Note [Lifted tensors]): the package holds its value at export, and a
// loader given the tensor itself reads it at every step, as the process
// does, so a change in place reaches both.
TEST_CASE("export_train_step: a lifted tensor is packaged, or bound by name at load", "[pipeline][export][lifted]") {
  const OneThread one_thread;
  torch::manual_seed(1);
  auto in_process = std::make_shared<torch::nn::LinearImpl>(6, 3);
  auto loaded = std::make_shared<torch::nn::LinearImpl>(6, 3);
  copy_state(*in_process, *loaded);
  at::Tensor scale = at::rand({3}) + 0.5;
  torch::optim::Adam optimizer(in_process->parameters(), torch::optim::AdamOptions(1e-2));
  const pipeline::TrainStep step =
      pipeline::Builder()
          .backend("inductor")
          .compile_train_step(in_process, optimizer, [&scale](torch::nn::Module& m, const std::vector<at::Tensor>& b) {
            return (static_cast<torch::nn::LinearImpl&>(m).forward(b[0]) * scale - b[1]).pow(2).mean();
          });
  auto batch = [](int64_t seed) {
    const at::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed);
    return std::vector<at::Tensor>{at::randn({4, 6}, g), at::randn({4, 3}, g)};
  };
  TempDir dir;
  const std::string d = dir.path.string();
  pipeline::export_train_step(step, batch(0), d);

  // Its value at export, without the tensor: a copy that no later change reaches.
  const LoadedTrainStep own = load_train_step(d);
  const auto named = own.named_lifted_inputs();
  REQUIRE(named.size() == 1);
  const std::string name = named[0].first;
  CHECK(at::equal(named[0].second, scale));
  CHECK(named[0].second.data_ptr() != scale.data_ptr());

  // Bound by name: the process's step and the loaded one read `scale` as it
  // is at each step.
  const LoadedTrainStep bound = load_train_step(d, loaded, {{name, scale}});
  REQUIRE(bound.named_lifted_inputs()[0].second.data_ptr() == scale.data_ptr());
  for (int64_t i = 0; i < 4; ++i) {
    if (i == 2) scale.mul_(2.0);  // changed in place: both read it
    INFO("step " << i);
    REQUIRE(at::equal(bound(batch(10 + i)), step(batch(10 + i))));
  }
  REQUIRE(step.num_compilations() == 1);
  REQUIRE(at::equal(loaded->weight, in_process->weight));
  REQUIRE(at::equal(loaded->bias, in_process->bias));

  // A name the step does not read, a tensor of other sizes, and a package
  // without values whose lifted tensor is not given.
  CHECK_THROWS_WITH(load_train_step(d, loaded, {{"not.a.tensor", scale}}), CRUCIBLE_HAS_SUBSTR("reads no lifted"));
  CHECK_THROWS_WITH(load_train_step(d, loaded, {{name, at::ones({4})}}), CRUCIBLE_HAS_SUBSTR("was exported for"));
  pipeline::export_train_step(step, batch(0), d, {.state = false, .cuda_archs = {}});
  CHECK_THROWS_WITH(load_train_step(d, loaded), CRUCIBLE_HAS_SUBSTR("holds no value of it"));
  CHECK_NOTHROW(load_train_step(d, loaded, {{name, scale}}));
}

TEST_CASE("load_train_step: corrupt, altered, mismatched packages and batches are refused",
          "[pipeline][export][errors]") {
  torch::manual_seed(0);
  const Model model = make_mlp();
  torch::optim::Adam optimizer(model.module->parameters(), torch::optim::AdamOptions(1e-3));
  const pipeline::TrainStep step =
      pipeline::Builder().backend("inductor").compile_train_step(model.module, optimizer, loss_of(model));
  const data::Batch example = model.example_batch(8, 1);
  TempDir dir;
  const std::string d = dir.path.string();
  pipeline::export_train_step(step, {example.inputs, example.targets}, d);
  const LoadedTrainStep loaded = load_train_step(d);

  // Batches of other sizes or dtypes: the guards, before anything runs.
  const data::Batch other = model.example_batch(4, 1);
  CHECK_THROWS_WITH(loaded({other.inputs, other.targets}), CRUCIBLE_HAS_SUBSTR("export again for batches"));
  CHECK_THROWS_WITH(loaded({example.inputs.to(at::kDouble), example.targets}), CRUCIBLE_HAS_SUBSTR("batch tensor 0"));
  CHECK_THROWS_WITH(loaded({example.inputs}), CRUCIBLE_HAS_SUBSTR("takes more"));

  // A module that is not the exported one.
  const Model gpt = make_gpt();
  CHECK_THROWS_WITH(load_train_step(d, gpt.module), CRUCIBLE_HAS_SUBSTR("has no parameter or buffer"));
  MlpConfig wider;
  wider.hidden = {300, 128};
  CHECK_THROWS_WITH(load_train_step(d, make_mlp(wider).module), CRUCIBLE_HAS_SUBSTR("was exported for"));

  // A file altered: its checksum; a file missing; the manifest's format.
  const std::string graph = runtime::read_file(d + "/inductor_graph.txt");
  std::string altered = graph;
  altered[altered.size() / 2] = altered[altered.size() / 2] == '1' ? '2' : '1';
  runtime::write_atomically(d + "/inductor_graph.txt", altered);
  CHECK_THROWS_WITH(load_train_step(d), CRUCIBLE_HAS_SUBSTR("fails its checksum"));
  runtime::write_atomically(d + "/inductor_graph.txt", graph);
  CHECK_NOTHROW(load_train_step(d));
  std::filesystem::remove(d + "/state.pt");
  CHECK_THROWS_WITH(load_train_step(d), CRUCIBLE_HAS_SUBSTR("state.pt is missing"));
  const std::string manifest = runtime::read_file(d + "/manifest.json");
  std::string older = manifest;
  older.replace(older.find(runtime::kPackageFormat), std::string(runtime::kPackageFormat).size(),
                "crucible-train-step-0");
  runtime::write_atomically(d + "/manifest.json", older);
  CHECK_THROWS_WITH(load_train_step(d), CRUCIBLE_HAS_SUBSTR("this loader reads"));
  std::filesystem::remove(d + "/manifest.json");
  CHECK_THROWS_AS(load_train_step(d), runtime::PackageError);
  CHECK_THROWS_WITH(load_train_step(d), CRUCIBLE_HAS_SUBSTR("not an exported training step"));
}

TEST_CASE("export_train_step: a user backend cannot be exported", "[pipeline][export][errors]") {
  const Model model = make_mlp();
  torch::optim::Adam optimizer(model.module->parameters(), torch::optim::AdamOptions(1e-3));
  const pipeline::TrainStep step =
      pipeline::Builder()
          .backend("mine", [](const ir::Graph& g, const std::vector<at::Tensor>&) { return ir::interpret(g); })
          .compile_train_step(model.module, optimizer, loss_of(model));
  const data::Batch example = model.example_batch(8, 1);
  TempDir dir;
  CHECK_THROWS_AS(pipeline::export_train_step(step, {example.inputs, example.targets}, dir.path.string()),
                  pipeline::PipelineError);
}

// A GPU step's package holds cubins (Note [Packaged cubins]) and its CUDA
// graph policy: every zoo model, with and without CUDA graphs, loaded in
// the process that compiled it, trains as that process's step does, bit
// for bit. (The package holds the process's autotuning choices too.)
TEST_CASE("export_train_step: a GPU package trains bitwise as the step in the process", "[pipeline][export][cuda]") {
  if (!testing::test_device().is_cuda() || testing::compile_only())
    CRUCIBLE_SKIP("needs CRUCIBLE_TEST_DEVICE=cuda and a GPU");
  const at::Device cuda = testing::test_device();
  const GptConfig gpt{.vocab_size = 32, .block_size = 16, .n_layer = 1, .n_head = 2, .n_embd = 32};
  const ResNetConfig resnet{.in_channels = 1, .image_size = 16, .width = 4, .blocks = {1, 1, 1, 1}};
  for (const std::string backend : {"inductor", "inductor-cudagraphs"}) {
    export_and_compare<torch::optim::Adam>([] { return make_mlp(); }, torch::optim::AdamOptions(1e-3), backend, 16, 4,
                                           true, cuda);
    export_and_compare<torch::optim::Adam>([] { return make_convnet(); }, torch::optim::AdamOptions(1e-3), backend, 8,
                                           3, true, cuda);
    export_and_compare<torch::optim::AdamW>([&] { return make_gpt(gpt); }, torch::optim::AdamWOptions(3e-3), backend, 4,
                                            3, true, cuda);
    export_and_compare<torch::optim::AdamW>([&] { return make_resnet(resnet); }, torch::optim::AdamWOptions(1e-3),
                                            backend, 8, 3, /*with_state=*/false, cuda);
  }
}

// NVRTC builds a GPU step's cubins without the GPU: a package for other
// architectures is written anywhere, and a loader refuses one without its
// GPU's architecture by naming what the package has.
TEST_CASE("write_compiled: a GPU graph's package holds cubins for each architecture asked for",
          "[pipeline][export][nvrtc]") {
  const Model m = make_mlp();
  torch::optim::Adam optimizer(m.module->parameters(), torch::optim::AdamOptions(1e-3));
  const pipeline::TrainStep step =
      pipeline::Builder().backend("interpreter").compile_train_step(m.module, optimizer, loss_of(m));
  const data::Batch b = m.example_batch(8, 1);
  step.compile({b.inputs, b.targets});
  ir::Graph g = step.graph().clone();
  testing::relabel_device(g, at::Device(at::kCUDA, 0));
  inductor::InductorOptions options;
  options.cache_dir = testing::temp_dir("crucible-export-nvrtc");
  TempDir dir;
  const std::string d = dir.path.string();
  const std::vector<std::string> files = inductor::write_compiled(g, d, options, {"sm_80", "sm_90"});
  const nlohmann::json info = nlohmann::json::parse(runtime::read_file(d + "/inductor.json"));
  CHECK(info.at("device") == "cuda:0");
  CHECK(info.at("cuda").at("archs") == nlohmann::json({"sm_80", "sm_90"}));
  const size_t units = info.at("cuda").at("units").get<size_t>();
  REQUIRE(units >= 1);
  for (const std::string arch : {"sm_80", "sm_90"})
    for (size_t u = 0; u < units; ++u) {
      const std::string name = "inductor_" + arch + "_" + std::to_string(u) + ".cubin";
      INFO(name);
      CHECK(std::find(files.begin(), files.end(), name) != files.end());
      CHECK(runtime::read_file(d + "/" + name)
                .compare(0, 4,
                         "\x7f"
                         "ELF") == 0);
    }
  // The two architectures' cubins differ: each is its own machine code.
  CHECK(runtime::read_file(d + "/inductor_sm_80_0.cubin") != runtime::read_file(d + "/inductor_sm_90_0.cubin"));

  // With sm_80's cubins alone, a GPU of another architecture (the test
  // machines' H100 and H200 are sm_90) is told which the package has;
  // without a GPU, the loader says there is none.
  inductor::write_compiled(g, d, options, {"sm_80"});
  const bool gpu = testing::test_device().is_cuda() && !testing::compile_only();
  if (gpu)
    CHECK_THROWS_WITH(inductor::load_compiled(d), CRUCIBLE_HAS_SUBSTR("holds kernels for sm_80; CUDA device 0 is"));
  else
    CHECK_THROWS_AS(inductor::load_compiled(d), inductor::InductorError);

  // A virtual architecture's PTX, which the driver compiles when loading:
  // compute_80's runs on the sm_90 GPUs too (forward compatibility).
  const std::vector<std::string> ptx_files = inductor::write_compiled(g, d, options, {"compute_80"});
  for (size_t u = 0; u < units; ++u) {
    const std::string name = "inductor_compute_80_" + std::to_string(u) + ".ptx";
    INFO(name);
    REQUIRE(std::find(ptx_files.begin(), ptx_files.end(), name) != ptx_files.end());
    const std::string ptx = runtime::read_file(d + "/" + name);
    CHECK(ptx.find(".target sm_80") != std::string::npos);
    CHECK(ptx.find(".entry") != std::string::npos);
  }
  if (gpu)
    CHECK_NOTHROW(inductor::load_compiled(d));
  else
    CHECK_THROWS_AS(inductor::load_compiled(d), inductor::InductorError);
}

// Note [Another process]: trains the package named by the environment on
// its batches, one OpenMP thread and deterministic kernels as its parent,
// and writes the losses and the trained weights. Hidden: run by
// train_in_another_process only.
TEST_CASE("export worker", "[.]") {
  const char* package = std::getenv(kWorkerPackage);
  if (!package) CRUCIBLE_SKIP("run by the export tests, in a process of its own");
  const OneThread one_thread;
  const DeterministicKernels deterministic;
  const LoadedTrainStep step = load_train_step(package);
  const std::vector<at::Tensor> flat = loaded_tensors(runtime::read_file(std::getenv(kWorkerBatches)));
  std::vector<at::Tensor> out;
  for (size_t i = 0; i + 1 < flat.size(); i += 2) out.push_back(step({flat[i], flat[i + 1]}).cpu());
  for (const auto& [name, t] : step.named_module_state()) out.push_back(t.cpu());
  runtime::write_atomically(std::getenv(kWorkerOut), saved(out));
}
