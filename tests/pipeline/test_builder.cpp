// The builder: each stage replaceable, instruments around every stage, and
// what it compiles equal to eager.
#include <crucible/autograd/aot_cache.h>
#include <crucible/autograd/aot_module.h>
#include <crucible/ir/graph.h>
#include <crucible/ir/parser.h>
#include <crucible/models/zoo.h>
#include <crucible/pipeline/builder.h>
#include <crucible/pipeline/error.h>
#include <crucible/pipeline/instruments.h>
#include <crucible/runtime/backend_registry.h>
#include <crucible/runtime/error.h>
#include <crucible/runtime/instruments.h>
#include <crucible/runtime/timing.h>
#include <crucible/tracer/decomposition.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <unistd.h>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "catch.h"
#include "graph_testing.h"
#include "testing.h"

using namespace crucible;
using namespace crucible::pipeline;
using namespace crucible::models;
using namespace crucible::data;

namespace {

// Records every event as "before:<stage>:<graph>,..." / "after:<stage>:<graph>"
// (":cached" after a compiler stage the graph cache served).
class Recorder : public ir::Instrument {
 public:
  explicit Recorder(std::string skip = {}) : skip_(std::move(skip)) {}
  bool should_run(const ir::StageEvent& e) override { return e.stage != skip_; }
  void before_stage(const ir::StageEvent& e) override { events.push_back("before:" + describe(e)); }
  void after_stage(const ir::StageEvent& e) override {
    events.push_back(std::string(e.failed ? "failed:" : "after:") + describe(e) + (e.cached ? ":cached" : ""));
  }
  std::vector<std::string> events;

 private:
  static std::string describe(const ir::StageEvent& e) {
    std::string s(e.stage);
    for (const ir::StageGraph& g : e.graphs) s += ":" + std::string(g.name);
    return s;
  }
  std::string skip_;
};

struct SmallMlp {
  Model model = make_mlp({.in_features = 6, .hidden = {5}, .num_classes = 3});
  std::vector<at::Tensor> batch = {at::randn({4, 6}), at::randint(0, 3, {4}, at::kLong)};
  LossFn loss() const { return loss_of(model); }
};

std::vector<at::Tensor> mlp_fn(const std::vector<at::Tensor>& in) {
  return {at::linear(at::relu(at::linear(in[0], in[1], in[2])), in[3]).sum(1)};
}

}  // namespace

TEST_CASE("builder: the defaults are DCE and CSE on the best registered backend, with its decompositions",
          "[pipeline][builder]") {
  // This program links crucible-inductor: its backends registered
  // themselves, and the inductor is the best (Note [Backends register
  // themselves]), traced with the core ATen decompositions it lowers from.
  const Builder b;
  REQUIRE(b.passes().size() == 2);
  CHECK(b.passes()[0].name == "dce");
  CHECK(b.passes()[1].name == "cse");
  CHECK(b.backend_name() == runtime::BackendRegistry::builtin().best().name);
  CHECK(b.backend_name() == "inductor");
  const size_t core = crucible::tracer::core_aten_decompositions().size();
  CHECK(b.trace_options().decompositions.size() == core);
  // The reference is one call away, without decompositions; a table chosen
  // explicitly, the empty one included, stays whatever the backend.
  CHECK(Builder().backend("interpreter").trace_options().decompositions.empty());
  CHECK(Builder().decompositions({}).trace_options().decompositions.empty());
  CHECK(Builder()
            .backend("interpreter")
            .decompositions(crucible::tracer::core_aten_decompositions())
            .trace_options()
            .decompositions.size() == core);
  // The backend's pre-grad passes: the inductor fuses bf16 and f16
  // attention, the interpreter runs none; a list chosen explicitly, the
  // empty one included, stays whatever the backend.
  REQUIRE(b.pre_grad_passes().size() == 1);
  CHECK(b.pre_grad_passes()[0].name == "fuse_flash_attention");
  CHECK_FALSE(b.pre_grad_passes_chosen());
  CHECK(Builder().backend("interpreter").pre_grad_passes().empty());
  CHECK(Builder().backend("interpreter").backend("inductor").pre_grad_passes().size() == 1);
  CHECK(Builder().pre_grad_passes({}).backend("inductor").pre_grad_passes().empty());
  CHECK(Builder().pre_grad_passes({"fuse_attention"}).backend("interpreter").pre_grad_passes()[0].name ==
        "fuse_attention");
  CHECK(Builder().pre_grad_passes({}).pre_grad_passes_chosen());
}

TEST_CASE("builder: unknown passes and backends are refused by name", "[pipeline][builder][errors]") {
  Builder b = Builder().backend("interpreter");
  CHECK_THROWS_WITH(b.passes({"dce", "fuse_everything"}), CRUCIBLE_HAS_SUBSTR("fuse_everything"));
  CHECK_THROWS_WITH(b.backend("tpu"), CRUCIBLE_HAS_SUBSTR("'tpu'") && CRUCIBLE_HAS_SUBSTR("interpreter"));
}

TEST_CASE("backend registry: names, lookup, ranks", "[pipeline][builder]") {
  runtime::BackendRegistry r = runtime::BackendRegistry::builtin();
  CHECK(r.names() == std::vector<std::string>{"inductor", "inductor-cudagraphs", "interpreter"});
  CHECK_THROWS_AS(r.add({.name = "interpreter", .description = "again", .compile = ir::interpret}),
                  runtime::WrapperError);
  CHECK_THROWS_AS(r.add({.name = "empty", .description = "no compile function"}), runtime::WrapperError);
  r.add({.name = "fast", .description = "a better one", .compile = ir::interpret, .rank = 5});
  CHECK(r.best().name == "fast");
  CHECK(r.contains("fast"));
  CHECK(Builder().backend("fast", r).backend_name() == "fast");
}

TEST_CASE("builder: a train step's stages are AOTAutograd's inference path, each pass, backend, in order",
          "[pipeline][builder]") {
  torch::manual_seed(0);
  SmallMlp s;
  torch::optim::SGD opt(s.model.module->parameters(), torch::optim::SGDOptions(0.1));
  auto recorder = std::make_shared<Recorder>();
  Builder b = Builder().backend("interpreter");
  b.instrument(recorder);
  TrainStep step = b.compile_train_step(s.model.module, opt, s.loss());
  step.compile(s.batch);
  CHECK(recorder->events ==
        std::vector<std::string>{"before:compile", "before:collect_metadata", "after:collect_metadata",
                                 "before:trace_inference", "after:trace_inference:train_step",
                                 "before:inference_compiler:train_step", "before:name_state:train_step",
                                 "after:name_state:train_step", "before:dce:train_step", "after:dce:train_step",
                                 "before:cse:train_step", "after:cse:train_step", "before:backend:train_step",
                                 "after:backend:train_step", "after:inference_compiler:train_step", "after:compile"});
  recorder->events.clear();
  step(s.batch);  // compiled already: no stage runs
  CHECK(recorder->events.empty());
}

TEST_CASE("builder: should_run skips a pass; a failing stage still gets its after event", "[pipeline][builder]") {
  torch::manual_seed(0);
  SmallMlp s;
  torch::optim::SGD opt(s.model.module->parameters(), torch::optim::SGDOptions(0.1));
  SECTION("skip") {
    auto recorder = std::make_shared<Recorder>("cse");
    Builder b = Builder().backend("interpreter");
    b.instrument(recorder);
    b.compile_train_step(s.model.module, opt, s.loss()).compile(s.batch);
    CHECK(std::find(recorder->events.begin(), recorder->events.end(), "before:cse:train_step") ==
          recorder->events.end());
    CHECK(std::find(recorder->events.begin(), recorder->events.end(), "after:dce:train_step") !=
          recorder->events.end());
  }
  SECTION("failure") {
    auto recorder = std::make_shared<Recorder>();
    Builder b = Builder().backend("interpreter");
    b.instrument(recorder).add_pass({"explode", [](ir::Graph&) { throw std::runtime_error("boom"); }});
    CHECK_THROWS_WITH(b.compile_train_step(s.model.module, opt, s.loss()).compile(s.batch),
                      CRUCIBLE_HAS_SUBSTR("explode"));
    // The failing pass, then each stage around it, all failed.
    const auto explode = std::find(recorder->events.begin(), recorder->events.end(), "before:explode:train_step");
    REQUIRE(explode != recorder->events.end());
    CHECK(std::vector<std::string>(explode + 1, recorder->events.end()) ==
          std::vector<std::string>{"failed:explode", "failed:inference_compiler", "failed:compile"});
  }
}

TEST_CASE("builder: compile() runs the AOT path through the builder's partitioner, passes and backend",
          "[pipeline][builder]") {
  auto recorder = std::make_shared<Recorder>();
  int partitions = 0, compiles = 0, pass_runs = 0;
  Builder b = Builder().backend("interpreter");
  b.instrument(recorder)
      .partitioner([&](const ir::Graph& joint, size_t n) {
        ++partitions;
        return partitioner::default_partition(joint, n);
      })
      .passes({})
      .add_pass({"count", [&](ir::Graph&) { ++pass_runs; }})
      .backend("counting", [&](const ir::Graph& g, const std::vector<at::Tensor>& examples) {
        ++compiles;
        return ir::interpret(g, examples);
      });
  auto compiled = b.compile(mlp_fn);

  at::manual_seed(3);
  const std::vector<at::Tensor> eager_in = {at::randn({4, 6}), at::randn({5, 6}).requires_grad_(),
                                            at::randn({5}).requires_grad_(), at::randn({3, 5}).requires_grad_()};
  std::vector<at::Tensor> in;
  for (const auto& t : eager_in) in.push_back(t.detach().clone().requires_grad_(t.requires_grad()));
  const at::Tensor out = compiled(in)[0];
  const at::Tensor ref = mlp_fn(eager_in)[0];
  // The same kernels: the forward is bitwise eager's.
  REQUIRE_EQUAL_TENSORS(out.detach(), ref.detach());
  CHECK(partitions == 1);
  CHECK(compiles == 1);  // the backward compiles at the first backward
  out.sum().backward();
  ref.sum().backward();
  for (size_t i = 1; i < in.size(); ++i)
    REQUIRE_CLOSE(in[i].grad(), eager_in[i].grad(), crucible::testing::kGradRtol, crucible::testing::kGradAtol);
  CHECK(compiles == 2);
  CHECK(pass_runs == 2);
  // The first call compiles the forward; the first backward, lazily, the backward.
  CHECK(recorder->events == std::vector<std::string>{"before:compile",
                                                     "before:collect_metadata",
                                                     "after:collect_metadata",
                                                     "before:trace_joint",
                                                     "after:trace_joint:joint",
                                                     "before:partition:joint",
                                                     "after:partition:forward:backward",
                                                     "before:fw_compiler:forward",
                                                     "before:count:forward",
                                                     "after:count:forward",
                                                     "before:backend:forward",
                                                     "after:backend:forward",
                                                     "after:fw_compiler:forward",
                                                     "after:compile",
                                                     "before:compile",
                                                     "before:bw_compiler:backward",
                                                     "before:count:backward",
                                                     "after:count:backward",
                                                     "before:backend:backward",
                                                     "after:backend:backward",
                                                     "after:bw_compiler:backward",
                                                     "after:compile"});
}

TEST_CASE("builder: compile() shares compiled graphs between callables only when its compilers have a key",
          "[pipeline][builder]") {
  // Counts the backend stages this builder's compilers run (a graph-cache
  // hit skips them, Note [Builder compiler key]).
  auto count_backend_runs = [](Builder b, int callables) {
    auto recorder = std::make_shared<Recorder>();
    b.instrument(recorder);
    at::manual_seed(5);
    const std::vector<at::Tensor> data = {at::randn({4, 6}), at::randn({5, 6}), at::randn({5}), at::randn({3, 5})};
    for (int c = 0; c < callables; ++c) {
      auto compiled = b.compile(mlp_fn);  // a new callable: its own guard cache
      std::vector<at::Tensor> in, eager_in;
      for (size_t i = 0; i < data.size(); ++i) {
        in.push_back(data[i].clone().requires_grad_(i > 0));
        eager_in.push_back(data[i].clone().requires_grad_(i > 0));
      }
      const at::Tensor out = compiled(in)[0];
      const at::Tensor ref = mlp_fn(eager_in)[0];
      out.sum().backward();
      ref.sum().backward();
      // Shared or not, each callable computes eager's values and gradients
      // (same kernels; the backward may accumulate in another order).
      REQUIRE_EQUAL_TENSORS(out.detach(), ref.detach());
      for (size_t i = 1; i < in.size(); ++i)
        REQUIRE_CLOSE(in[i].grad(), eager_in[i].grad(), crucible::testing::kGradRtol, crucible::testing::kGradAtol);
    }
    const auto backend_runs = std::count_if(recorder->events.begin(), recorder->events.end(),
                                            [](const std::string& e) { return e.rfind("before:backend:", 0) == 0; });
    // Every compiler stage reports, served from the cache or not.
    const auto compiler_stages =
        std::count_if(recorder->events.begin(), recorder->events.end(), [](const std::string& e) {
          return e.rfind("after:fw_compiler:", 0) == 0 || e.rfind("after:bw_compiler:", 0) == 0;
        });
    const auto cached = std::count_if(recorder->events.begin(), recorder->events.end(),
                                      [](const std::string& e) { return e.ends_with(":cached"); });
    CHECK(compiler_stages == 2 * callables);
    CHECK(cached == 2 * callables - backend_runs);
    return backend_runs;
  };
  autograd::default_aot_cache()->clear();
  const Builder builtin = Builder().backend("interpreter");
  CHECK(builtin.compiler_key() == "backend=" + builtin.backend_name() + ";passes=dce,cse");
  // Forward and backward compiled once for both callables.
  CHECK(count_backend_runs(builtin, 2) == 2);

  Builder with_user_pass = Builder().backend("interpreter");
  with_user_pass.add_pass({"noop", [](ir::Graph&) {}});
  CHECK(with_user_pass.compiler_key().empty());
  CHECK(count_backend_runs(with_user_pass, 2) == 4);  // user code: never shared

  Builder named = with_user_pass;
  named.compiler_key("noop-pass-v1");  // the caller vouches for its compilers
  CHECK(count_backend_runs(named, 2) == 2);
}

TEST_CASE("builder: after_stage runs in reverse order, so the first instrument wraps the others",
          "[pipeline][builder]") {
  // Logs the outermost stage and the innermost one.
  struct Named : ir::Instrument {
    Named(std::string name, std::vector<std::string>& log) : name(std::move(name)), log(log) {}
    void before_stage(const ir::StageEvent& e) override {
      if (e.stage == "compile" || e.stage == "backend") log.push_back(name + ">" + std::string(e.stage));
    }
    void after_stage(const ir::StageEvent& e) override {
      if (e.stage == "compile" || e.stage == "backend") log.push_back(name + "<" + std::string(e.stage));
    }
    std::string name;
    std::vector<std::string>& log;
  };
  std::vector<std::string> log;
  torch::manual_seed(0);
  SmallMlp s;
  torch::optim::SGD opt(s.model.module->parameters(), torch::optim::SGDOptions(0.1));
  Builder b = Builder().backend("interpreter");
  b.passes({}).instrument(std::make_shared<Named>("a", log)).instrument(std::make_shared<Named>("b", log));
  b.compile_train_step(s.model.module, opt, s.loss()).compile(s.batch);
  CHECK(log == std::vector<std::string>{"a>compile", "b>compile", "a>backend", "b>backend", "b<backend", "a<backend",
                                        "b<compile", "a<compile"});
}

TEST_CASE("builder: compile() over a module gives eager's loss and fills the module's gradients",
          "[pipeline][builder]") {
  torch::manual_seed(0);
  SmallMlp compiled, eager;
  copy_state(*compiled.model.module, *eager.model.module);
  auto recorder = std::make_shared<Recorder>();
  const autograd::AotModule f =
      Builder()
          .backend("interpreter")
          .instrument(recorder)
          .compile(compiled.model.module,
                   [loss = compiled.loss()](torch::nn::Module& m, const std::vector<at::Tensor>& in) {
                     return std::vector<at::Tensor>{loss(m, in)};
                   });
  const at::Tensor loss = f(compiled.batch).at(0);
  loss.backward();
  const at::Tensor eager_loss = eager.loss()(*eager.model.module, compiled.batch);
  eager_loss.backward();
  // The same kernels: the forward is bitwise eager's.
  REQUIRE_EQUAL_TENSORS(loss.detach(), eager_loss.detach());
  auto eager_params = eager.model.module->named_parameters();
  for (const auto& p : compiled.model.module->named_parameters()) {
    INFO(p.key());
    REQUIRE(p.value().grad().defined());
    REQUIRE_CLOSE(p.value().grad(), eager_params[p.key()].grad(), crucible::testing::kGradRtol,
                  crucible::testing::kGradAtol);
  }
  auto has = [&](const std::string& event) {
    return std::find(recorder->events.begin(), recorder->events.end(), event) != recorder->events.end();
  };
  CHECK(has("before:partition:joint"));
  CHECK(has("after:partition:forward:backward"));
  REQUIRE(recorder->events.size() >= 2);
  CHECK(recorder->events[recorder->events.size() - 2] == "after:bw_compiler:backward");
  CHECK(recorder->events.back() == "after:compile");
}

TEST_CASE("builder: runtime wrappers run around the backend", "[pipeline][builder]") {
  struct CountingWrapper : runtime::GraphWrapper {
    std::string_view name() const override { return "CountingWrapper"; }
    ir::CompiledFn post_compile(ir::CompiledFn fn, const runtime::GraphRequest&) override {
      return [this, fn](std::vector<at::Tensor>& args) {
        ++calls;
        return fn(args);
      };
    }
    int calls = 0;
  };
  auto wrapper = std::make_shared<CountingWrapper>();
  torch::manual_seed(0);
  SmallMlp s;
  torch::optim::SGD opt(s.model.module->parameters(), torch::optim::SGDOptions(0.1));
  TrainStep step =
      Builder().backend("interpreter").add_wrapper(wrapper).compile_train_step(s.model.module, opt, s.loss());
  step(s.batch);
  step(s.batch);
  CHECK(wrapper->calls == 2);
}

TEST_CASE("instruments: stage timer, graph dumps and verification", "[pipeline][builder]") {
  torch::manual_seed(0);
  SmallMlp s;
  torch::optim::SGD opt(s.model.module->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  runtime::PhaseTimer timer;
  auto stage_timer = std::make_shared<runtime::StageTimer>(timer);
  const std::string dir = std::filesystem::temp_directory_path() / ("crucible_dump_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto dumper = std::make_shared<GraphDumper>(GraphDumpOptions{
      .dir = dir, .svg = false, .code = [](const ir::Graph& g) {
        return std::vector<runtime::GeneratedFile>{{"kernel.txt", std::to_string(g.num_nodes()) + " nodes"}};
      }});
  // Only these instruments: the process-wide defaults stay untouched.
  Builder b = Builder().backend("interpreter");
  b.instruments({stage_timer, dumper, std::make_shared<GraphVerifier>()});
  b.compile_train_step(s.model.module, opt, s.loss()).compile(s.batch);

  // One phase per stage, each run once, nested as the stages ran.
  const std::vector<runtime::PhaseStats> phases = timer.phases();
  const std::vector<std::pair<std::string, std::string>> expected = {{"compile", ""},
                                                                     {"collect_metadata", "compile"},
                                                                     {"trace_inference", "compile"},
                                                                     {"inference_compiler", "compile"},
                                                                     {"name_state", "inference_compiler"},
                                                                     {"dce", "inference_compiler"},
                                                                     {"cse", "inference_compiler"},
                                                                     {"backend", "inference_compiler"}};
  REQUIRE(phases.size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    CHECK(phases[i].name == expected[i].first);
    CHECK(phases[i].parent == expected[i].second);
    CHECK(phases[i].calls() == 1);
  }
  CHECK(timer.total_ms("trace_inference") > 0);
  CHECK(timer.total_ms("compile") >= timer.total_ms("inference_compiler"));
  // The traced graph, then each pass that changed it: the named state first.
  REQUIRE(std::filesystem::exists(dir + "/train_step.00.trace_inference.txt"));
  REQUIRE(std::filesystem::exists(dir + "/train_step.00.trace_inference.dot"));
  REQUIRE(std::filesystem::exists(dir + "/train_step.01.name_state.txt"));
  // The backend stage writes the generated code, after the graphs of the passes.
  const std::string code = dumper->files().back();
  CHECK(code.ends_with(".code.kernel.txt"));
  CHECK(code.find("/train_step.") != std::string::npos);
  for (const std::string& f : dumper->files()) CHECK(std::filesystem::exists(f));
  std::filesystem::remove_all(dir);
}

TEST_CASE("instruments: a dump of a compilation the graph cache serves still holds its graphs", "[pipeline][builder]") {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("crucible_dump_cached_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  autograd::default_aot_cache()->clear();
  at::manual_seed(5);
  const std::vector<at::Tensor> data = {at::randn({4, 6}), at::randn({5, 6}), at::randn({5}), at::randn({3, 5})};
  auto run = [&](const Builder& b) {
    std::vector<at::Tensor> in;
    for (size_t i = 0; i < data.size(); ++i) in.push_back(data[i].clone().requires_grad_(i > 0));
    const at::Tensor out = b.compile(mlp_fn)(in)[0];
    REQUIRE_EQUAL_TENSORS(out.detach(), mlp_fn(data)[0]);
    out.sum().backward();
  };
  run(Builder().backend("interpreter"));  // fills the graph cache
  auto dumper = std::make_shared<GraphDumper>(GraphDumpOptions{.dir = dir, .svg = false});
  Builder b = Builder().backend("interpreter");
  b.instrument(dumper);
  run(b);  // another callable: its forward and backward come from the cache
  for (const char* file : {"/forward.01.fw_compiler.cached.txt", "/backward.01.bw_compiler.cached.txt"}) {
    INFO(file);
    REQUIRE(std::filesystem::exists(dir + file));
  }
  std::ifstream cached(dir + "/forward.01.fw_compiler.cached.txt");
  std::stringstream text;
  text << cached.rdbuf();
  CHECK(ir::parse(text.str()).num_nodes() > 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("instruments: counters count compilations, compiled graphs, cache outcomes and recompiles",
          "[pipeline][builder]") {
  runtime::Counters counters;
  Builder b = Builder().backend("interpreter");
  b.instruments({std::make_shared<runtime::CounterRecorder>(counters)}).compiler_key("");
  auto compiled = b.compile(mlp_fn);
  at::manual_seed(6);
  for (int64_t batch : {4, 4, 7}) {
    std::vector<at::Tensor> in = {at::randn({batch, 6}), at::randn({5, 6}).requires_grad_(),
                                  at::randn({5}).requires_grad_(), at::randn({3, 5}).requires_grad_()};
    const at::Tensor out = compiled(in)[0];
    REQUIRE_EQUAL_TENSORS(out.detach(), mlp_fn(in)[0].detach());
    out.sum().backward();
  }
  // Batch 4, then 7 (a recompile): each compiles a forward, then a backward lazily.
  CHECK(counters.get("stats", "compilations") == 4);
  CHECK(counters.get("graphs", "forward") == 2);
  CHECK(counters.get("graphs", "backward") == 2);
  const auto snapshot = counters.snapshot();
  REQUIRE(snapshot.contains("recompiles"));
  REQUIRE(snapshot.at("recompiles").size() == 1);
  INFO(counters.report());
  CHECK(snapshot.at("recompiles").begin()->first.find("size") != std::string::npos);
  CHECK(snapshot.at("recompiles").begin()->second == 1);
  CHECK_FALSE(snapshot.contains("graph_cache"));  // no key: no cache
}

TEST_CASE("builder: a training step traced in fake mode (meta tensors) trains as eager", "[pipeline][builder]") {
  torch::manual_seed(0);
  SmallMlp compiled, eager;
  copy_state(*compiled.model.module, *eager.model.module);
  torch::optim::Adam compiled_opt(compiled.model.module->parameters(), torch::optim::AdamOptions(1e-2));
  torch::optim::Adam eager_opt(eager.model.module->parameters(), torch::optim::AdamOptions(1e-2));
  tracer::TraceOptions fake;
  fake.mode = tracer::TraceMode::Fake;
  TrainStep step = Builder()
                       .backend("interpreter")
                       .trace_options(fake)
                       .compile_train_step(compiled.model.module, compiled_opt, compiled.loss());
  for (int i = 0; i < 5; ++i) {
    const at::Tensor loss = step(compiled.batch);
    eager_opt.zero_grad();
    const at::Tensor eager_loss = eager.model.loss(eager.model.forward(compiled.batch[0]), compiled.batch[1]);
    eager_loss.backward();
    eager_opt.step();
    // The same kernels at run time; fake mode changes only how the graph was found.
    REQUIRE_EQUAL_TENSORS(loss, eager_loss.detach());
  }
  auto eager_params = eager.model.module->named_parameters();
  for (const auto& p : compiled.model.module->named_parameters())
    REQUIRE_EQUAL_TENSORS(p.value().detach(), eager_params[p.key()].detach());
}

TEST_CASE("builder: pre-grad, joint and post-grad passes run where Note [Pass phases] says", "[pipeline][builder]") {
  at::manual_seed(3);
  // Dead work and a repeated subexpression for the passes to find.
  auto fn = [](const std::vector<at::Tensor>& in) {
    at::Tensor a = at::tanh(in[0] * 2.0), b = at::tanh(in[0] * 2.0);
    at::Tensor dead = at::exp(in[1]);
    (void)dead;
    return std::vector<at::Tensor>{(a * b * in[1]).sum()};
  };
  auto recorder = std::make_shared<Recorder>();
  Builder b = Builder().backend("interpreter");
  b.pre_grad_passes({"cse", "dce"}).joint_passes({"dce"}).passes({"dce"}).instrument(recorder).compiler_key("");
  // The graph cache's key names every phase's passes (Note [Builder compiler key]).
  Builder keyed = Builder().backend("interpreter");
  keyed.pre_grad_passes({"cse", "dce"}).joint_passes({"dce"}).passes({"dce"});
  CHECK(keyed.compiler_key() == "backend=" + keyed.backend_name() + ";pre_grad=cse,dce;joint=dce;passes=dce");
  const std::vector<at::Tensor> data = {at::randn({5}), at::randn({5})};
  const std::vector<at::Tensor> c_in = {data[0].clone().requires_grad_(), data[1].clone()};
  const std::vector<at::Tensor> e_in = {data[0].clone().requires_grad_(), data[1].clone()};
  auto compiled = b.compile(fn);
  const at::Tensor got = compiled(c_in)[0];
  got.backward();
  const at::Tensor expected = fn(e_in)[0];
  expected.backward();
  // CSE merged the two tanh's before AOTAutograd saw them: the same kernels, bitwise.
  REQUIRE_EQUAL_TENSORS(got.detach(), expected.detach());
  REQUIRE_CLOSE(c_in[0].grad(), e_in[0].grad(), testing::kGradRtol, testing::kGradAtol);
  auto has = [&](const std::string& event) {
    return std::find(recorder->events.begin(), recorder->events.end(), event) != recorder->events.end();
  };
  CHECK(has("after:trace:pre_grad"));
  CHECK(has("after:cse:pre_grad"));
  CHECK(has("after:dce:pre_grad"));
  CHECK(has("after:dce:joint"));
  CHECK(has("after:partition:forward:backward"));
  CHECK(has("after:dce:forward"));
  CHECK(has("after:dce:backward"));
}

TEST_CASE("builder: an AOT wrapper joins AOTAutograd's chain, around the compiled callable", "[pipeline][builder]") {
  // Sees the request after the metadata analysis and counts the calls of what it wraps.
  struct Counting : autograd::AotWrapper {
    std::string_view name() const override { return "Counting"; }
    void pre_compile(autograd::AotRequest& request) override {
      outputs = request.fw_metadata.output_info.size();
      ++compiles;
    }
    ir::CompiledFn post_compile(ir::CompiledFn compiled, const autograd::AotRequest&) override {
      return [this, compiled = std::move(compiled)](std::vector<at::Tensor>& args) {
        ++calls;
        return compiled(args);
      };
    }
    size_t outputs = 0, compiles = 0, calls = 0;
  };
  auto counting = std::make_shared<Counting>();
  Builder b = Builder().backend("interpreter");
  b.add_aot_wrapper(counting);
  CHECK(b.compiler_key().empty());  // user code joined the chain: Note [Builder compiler key]
  auto f = b.compile(mlp_fn);
  const std::vector<at::Tensor> in = {at::randn({4, 6}), at::randn({5, 6}), at::randn({5}), at::randn({3, 5})};
  for (int i = 0; i < 3; ++i) REQUIRE_EQUAL_TENSORS(f(in)[0], mlp_fn(in)[0]);
  CHECK(counting->compiles == 1);
  CHECK(counting->outputs == 1);
  CHECK(counting->calls == 3);
  CHECK_THROWS_AS(Builder().backend("interpreter").add_aot_wrapper(nullptr), PipelineError);
}

TEST_CASE(
    "builder: the core ATen decompositions leave no fused softmax, gelu, layer norm or nll_loss in a GPT "
    "train step, which trains as eager within rounding",
    "[pipeline][builder][decomp]") {
  torch::manual_seed(4);
  Model compiled = make_model("gpt"), eager = make_model("gpt");
  copy_state(*compiled.module, *eager.module);
  torch::optim::SGD c_opt(compiled.module->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD e_opt(eager.module->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  Builder b = Builder().backend("interpreter");
  b.decompositions(tracer::core_aten_decompositions());
  TrainStep step = b.compile_train_step(compiled.module, c_opt, loss_of(compiled));
  for (int64_t i = 0; i < 5; ++i) {
    const Batch batch = compiled.example_batch(4, static_cast<uint64_t>(i));
    const at::Tensor loss = step({batch.inputs, batch.targets});
    const at::Tensor eager_loss = eager_train_step(eager, e_opt, batch);
    // The decomposed reductions add in another order than the fused kernels:
    // float rounding, compounded over five SGD steps.
    REQUIRE_CLOSE(loss, eager_loss, 1e-4, 1e-5);
  }
  CHECK(max_param_diff(*compiled.module, *eager.module) < 1e-4);
  for (const auto& [name, decomposition] : tracer::core_aten_decompositions()) {
    INFO(name);
    CHECK(testing::count_calls(step.graph(), name) == 0);
  }
  CHECK(testing::count_calls(step.graph(), "aten::exp") > 0);  // the softmaxes' math is in the graph
}
