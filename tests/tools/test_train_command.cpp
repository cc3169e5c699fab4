// `crucible train`: a short run as a user starts it, checked through its
// --json line (every field) and its error paths.
#include "catch.h"
#include "cli.h"
#include "data_dir.h"
#include "testing.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

using crucible::testing::run_cli;

namespace {

nlohmann::json last_line_json(const std::string& out) {
  std::string s = out;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  const size_t nl = s.rfind('\n');
  return nlohmann::json::parse(nl == std::string::npos ? s : s.substr(nl + 1));
}

// Note [Agreement with eager for a fused backend], as --json reports it,
// for a short run: the one-step checks passed, and the runs stayed within
// rounding of each other (far inside the bounds an epoch needs, 2% and 1
// point).
void require_fused_agreement(const nlohmann::json& j) {
  CHECK(j["backend"] == "inductor");
  CHECK(j["one_step"]["loss"] == true);
  CHECK(j["one_step"]["gradients"] == true);
  CHECK(j["one_step"]["parameters"] == true);
  CHECK(j["loss_curve_max_rel_diff"].get<double>() <= 0.01);
  CHECK(j["accuracy_diff_points"].get<double>() <= 0.5);
}

}  // namespace

TEST_CASE("crucible train --check-eager --json: every field, and the compiled run agrees with eager",
          "[tools][train]") {
  const auto r = run_cli(
      "train --model convnet --steps 40 --batch 32 --backend interpreter --check-eager --json "
      "--data-dir " +
      fashion_mnist_test_dir());
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const nlohmann::json j = last_line_json(r.out);
  for (const char* field : {"model", "backend", "steps", "final_loss", "test_accuracy", "samples_per_s", "compile_s",
                            "eager_final_loss", "max_param_diff", "eager_test_accuracy"}) {
    INFO(field);
    CHECK(j.contains(field));
  }
  CHECK(j["model"] == "convnet");
  CHECK(j["backend"] == "interpreter");
  CHECK(j["device"] == "cpu");
  CHECK(j["deterministic"] == false);
  CHECK(j["steps"] == 40);
  CHECK(j["samples_per_s"].get<double>() > 0);
  // Per-stage compile times: the metadata analysis, the trace, each pass, the backend, and the total.
  for (const char* stage : {"collect_metadata", "trace_inference", "name_state", "dce", "cse", "backend", "total"}) {
    INFO(stage);
    REQUIRE(j["compile_s"].contains(stage));
    CHECK(j["compile_s"][stage].get<double>() >= 0);
  }
  CHECK_FALSE(j["compile_s"].contains("compile"));  // it holds the others: the total
  // One compilation, of one graph; the batches keep their sizes, so no recompile.
  CHECK(j["counters"]["stats"]["compilations"] == 1);
  CHECK(j["counters"]["graphs"]["inference"] == 1);
  CHECK_FALSE(j["counters"].contains("recompiles"));
  // The same kernels on the same batches from the same weights (see
  // tests/pipeline/test_train_step.cpp): the two copies end bitwise equal.
  CHECK(j["max_param_diff"].get<double>() == 0.0);
  CHECK(j["final_loss"] == j["eager_final_loss"]);
  // 40 steps of Adam take a ConvNet well above chance (10%) on the test split;
  // the compiled forward scores the compiled model as eager scores its copy.
  CHECK(j["test_accuracy"].get<double>() > 0.4);
  CHECK(j["test_accuracy"].get<double>() <= 1.0);
  CHECK(j["test_accuracy"] == j["eager_test_accuracy"]);
  CHECK_THAT(r.out, CRUCIBLE_HAS_SUBSTR("agreement with eager: max |param diff|"));
  CHECK_THAT(r.out, CRUCIBLE_HAS_SUBSTR("test accuracy:"));
  // Progress goes to stderr; not a terminal here, so plain lines.
  CHECK_THAT(r.err, CRUCIBLE_HAS_SUBSTR("train 40/40 (100%)"));
}

TEST_CASE("crucible train's default is inductor, checked against eager as a fused backend is", "[tools][train]") {
  const auto r = run_cli("train --model convnet --steps 40 --batch 32 --check-eager --json --data-dir " +
                         fashion_mnist_test_dir());
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const nlohmann::json j = last_line_json(r.out);
  require_fused_agreement(j);
  CHECK(j["test_accuracy"].get<double>() > 0.4);
  // The process's resident peak: LibTorch's own libraries alone are some
  // hundred MiB resident; no device figures on the CPU.
  CHECK(j["memory"]["peak_rss_bytes"].get<int64_t>() > (int64_t{100} << 20));
  CHECK_FALSE(j["memory"].contains("peak_device_allocated_bytes"));
  CHECK_THAT(r.out, CRUCIBLE_HAS_SUBSTR("as a fused backend should: one step from the same state: loss ok, "
                                        "gradients ok, parameters ok"));
}

TEST_CASE("crucible train --device cuda trains on the GPU and agrees with an eager copy there",
          "[tools][train][cuda]") {
  CRUCIBLE_REQUIRE_CUDA();
  // --check-eager runs both copies with deterministic kernels on a GPU, and
  // the traceable Adam rounds as torch::optim's does there: the same kernels
  // on the same operands, so the copies stay bitwise equal.
  const auto r = run_cli(
      "train --model convnet --steps 40 --batch 32 --device cuda --backend interpreter --check-eager --tolerance 0 "
      "--json --data-dir " +
      fashion_mnist_test_dir());
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const nlohmann::json j = last_line_json(r.out);
  CHECK(j["device"] == "cuda:0");
  CHECK(j["deterministic"] == true);
  CHECK(j["max_param_diff"].get<double>() == 0.0);
  CHECK(j["final_loss"] == j["eager_final_loss"]);
  CHECK(j["test_accuracy"].get<double>() > 0.4);
  CHECK(j["test_accuracy"] == j["eager_test_accuracy"]);
  // Two copies of the ConvNet and their Adam state were on the GPU at once.
  const int64_t allocated = j["memory"]["peak_device_allocated_bytes"].get<int64_t>();
  CHECK(allocated > 0);
  CHECK(j["memory"]["peak_device_reserved_bytes"].get<int64_t>() >= allocated);
}

TEST_CASE("crucible train --device cuda without a GPU says so", "[tools][train][errors]") {
  if (at::hasCUDA()) CRUCIBLE_SKIP("a CUDA device is present: the error path does not apply");
  const auto r = run_cli("train --model mlp --steps 1 --device cuda --data-dir " + fashion_mnist_test_dir());
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, CRUCIBLE_HAS_SUBSTR("--device cuda: no CUDA device is usable here"));
}

TEST_CASE("crucible train --backend eager compiles nothing", "[tools][train]") {
  const auto r = run_cli("train --model mlp --steps 5 --batch 16 --optimizer sgd --backend eager --json --data-dir " +
                         fashion_mnist_test_dir());
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const nlohmann::json j = last_line_json(r.out);
  CHECK(j["backend"] == "eager");
  CHECK(j["optimizer"] == "sgd");
  CHECK(j["compile_s"].empty());
  CHECK_FALSE(j.contains("max_param_diff"));
}

TEST_CASE("crucible train trains the GPT on synthetic tokens", "[tools][train]") {
  const auto r = run_cli("train --model gpt --steps 4 --batch 4 --optimizer adamw --json");
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const nlohmann::json j = last_line_json(r.out);
  CHECK(j["model"] == "gpt");
  CHECK(j["dataset"] == "synthetic");
  CHECK(j["steps"] == 4);
}

TEST_CASE("crucible train: a second process finds the traced graph and the kernels in the disk caches",
          "[tools][train]") {
  // Note [AOT trace cache]: the new process runs the metadata analysis on
  // meta tensors, whose fingerprint stands for the real analysis (Note [Fake
  // fingerprints]), then reads the graph its trace made instead of tracing
  // again, and the backend's own caches serve the kernels; it trains to the
  // same loss.
  const std::string dir = crucible::testing::temp_dir("train-cache");
  const char* old = std::getenv("CRUCIBLE_INDUCTOR_CACHE_DIR");
  const std::optional<std::string> saved = old ? std::optional<std::string>(old) : std::nullopt;
  ::setenv("CRUCIBLE_INDUCTOR_CACHE_DIR", dir.c_str(), 1);
  std::vector<nlohmann::json> runs;
  for (int process = 0; process < 2; ++process) {
    const auto r = run_cli("train --model gpt --steps 3 --batch 4 --optimizer adamw --json");
    INFO(r.out << r.err);
    REQUIRE(r.exit_code == 0);
    runs.push_back(last_line_json(r.out));
  }
  if (saved)
    ::setenv("CRUCIBLE_INDUCTOR_CACHE_DIR", saved->c_str(), 1);
  else
    ::unsetenv("CRUCIBLE_INDUCTOR_CACHE_DIR");
  const nlohmann::json& cold = runs[0]["counters"]["aot_autograd"];
  const nlohmann::json& warm = runs[1]["counters"]["aot_autograd"];
  CHECK(cold.value("trace_cache_miss", 0) >= 1);
  CHECK(cold.value("trace_cache_hit", 0) == 0);
  CHECK(warm.value("trace_cache_hit", 0) == cold.value("trace_cache_miss", 0));
  CHECK(warm.value("trace_cache_miss", 0) == 0);
  // The analysis runs on meta tensors (--trace-mode auto): no fake
  // fingerprint is taken in front of it (Note [Fake fingerprints]).
  CHECK(cold.value("fingerprint_miss", 0) == 0);
  CHECK(warm.value("fingerprint_hit", 0) == 0);
  CHECK(runs[1]["counters"]["inductor"].value("fxgraph_cache_miss", 0) == 0);
  // The same graph and kernels on the same batches: the same arithmetic, up
  // to the matmuls' (MKL may pick its kernels by the buffers' alignment).
  CHECK_THAT(runs[1]["final_loss"].get<double>(),
             Catch::Matchers::WithinRel(runs[0]["final_loss"].get<double>(), 1e-5));
}

TEST_CASE("crucible train: a missing dataset names the path and the package", "[tools][train][errors]") {
  const auto r = run_cli("train --model mlp --steps 2 --json --data-dir /nonexistent/fashion-mnist");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, CRUCIBLE_HAS_SUBSTR("/nonexistent/fashion-mnist/train-images-idx3-ubyte.gz"));
  CHECK_THAT(r.err, CRUCIBLE_HAS_SUBSTR("dataset-fashion-mnist"));
  CHECK(r.out.find('{') == std::string::npos);
}

TEST_CASE("crucible train refuses contradictory options", "[tools][train][errors]") {
  SECTION("the gpt on images") {
    const auto r = run_cli("train --model gpt --dataset fashion-mnist --steps 1");
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, CRUCIBLE_HAS_SUBSTR("--dataset synthetic"));
  }
  SECTION("--epochs and --steps together") {
    const auto r = run_cli("train --model mlp --epochs 1 --steps 3");
    CHECK(r.exit_code != 0);
    CHECK_THAT(r.err, CRUCIBLE_HAS_SUBSTR("excludes"));
  }
  SECTION("an unknown backend") {
    const auto r = run_cli("train --model mlp --backend tpu");
    CHECK(r.exit_code != 0);
    CHECK_THAT(r.err, CRUCIBLE_HAS_SUBSTR("tpu"));
  }
  SECTION("counts and rates out of range, said in words") {
    for (const char* args : {"--epochs -1", "--batch 0", "--steps 0"}) {
      const auto r = run_cli(std::string("train --model mlp ") + args);
      CHECK(r.exit_code != 0);
      CHECK_THAT(r.err, CRUCIBLE_HAS_SUBSTR("must be at least 1"));
      CHECK(r.err.find("1797693") == std::string::npos);
    }
    const auto budget = run_cli("train --model mlp --partitioner min-cut --memory-budget 1.5");
    CHECK(budget.exit_code != 0);
    CHECK_THAT(budget.err, CRUCIBLE_HAS_SUBSTR("--memory-budget: must be from 0 to 1 (got 1.5)"));
    const auto r = run_cli("train --model mlp --lr -0.5");
    CHECK(r.exit_code != 0);
    CHECK_THAT(r.err, CRUCIBLE_HAS_SUBSTR("--lr: must be greater than 0 (got -0.5)"));
  }
}

TEST_CASE("crucible train --decompositions core trains as eager within rounding", "[tools][train]") {
  // Adam on the decomposed softmax, layer norm and nll_loss: sums in another
  // order than the fused kernels, compounded over 10 steps.
  const auto r = run_cli(
      "train --model gpt --steps 10 --batch 4 --backend interpreter --check-eager --decompositions core "
      "--tolerance 1e-3 --json");
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const nlohmann::json j = last_line_json(r.out);
  CHECK(j["max_param_diff"].get<double>() <= 1e-3);
  CHECK(j["max_param_diff"].get<double>() > 0);  // not the fused kernels: not bitwise
}

TEST_CASE("crucible train --nproc 2: two Gloo ranks end where one eager process on the global batch ends",
          "[tools][train][spmd]") {
  const auto r = run_cli(
      "train --model convnet --steps 30 --batch 16 --nproc 2 --backend interpreter --check-eager --json --data-dir " +
      fashion_mnist_test_dir());
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const nlohmann::json j = last_line_json(r.out);
  CHECK(j["ranks"] == 2);
  CHECK(j["batch"] == 16);
  // Averaged gradients sum in another order than one process's: float32
  // rounding, not bitwise (tests/spmd measures ~1e-8 after 10 SGD steps; Adam
  // over 30 steps moves a few 1e-6). The default --tolerance is 1e-4.
  CHECK(j["max_param_diff"].get<double>() <= 1e-4);
  // The reported loss is the global batch's (the mean over ranks).
  CHECK(std::abs(j["final_loss"].get<double>() - j["eager_final_loss"].get<double>()) < 1e-4);

  // Through inductor (the default), checked as a fused backend: each step's
  // loss is the ranks' mean, set against eager's on the global batch.
  const auto fused = run_cli("train --model convnet --steps 10 --batch 16 --nproc 2 --check-eager --json --data-dir " +
                             fashion_mnist_test_dir());
  INFO(fused.out << fused.err);
  REQUIRE(fused.exit_code == 0);
  require_fused_agreement(last_line_json(fused.out));
}

TEST_CASE("crucible train --parallel-mode fully_shard: sharded ranks end where one eager process ends",
          "[tools][train][spmd]") {
  // The model is compared and evaluated whole, after SpmdStep::unshard();
  // the tolerances are the replicated run's above, as the ranks average
  // the same gradients (tests/spmd: bit for bit as replicate over 2 ranks).
  const auto r = run_cli(
      "train --model convnet --steps 30 --batch 16 --nproc 2 --parallel-mode fully_shard --backend interpreter "
      "--check-eager --json --data-dir " +
      fashion_mnist_test_dir());
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("2 ranks (gloo, fully_shard)") != std::string::npos);
  const nlohmann::json j = last_line_json(r.out);
  CHECK(j["parallel_mode"] == "fully_shard");
  CHECK(j["max_param_diff"].get<double>() <= 1e-4);
  CHECK(std::abs(j["final_loss"].get<double>() - j["eager_final_loss"].get<double>()) < 1e-4);
  CHECK(j["test_accuracy"].get<double>() == j["eager_test_accuracy"].get<double>());

  // Through inductor: the first step's check reads the whole model between
  // two steps, which the next one shards again.
  const auto fused = run_cli(
      "train --model convnet --steps 10 --batch 16 --nproc 2 --parallel-mode fully_shard --check-eager --json "
      "--data-dir " +
      fashion_mnist_test_dir());
  INFO(fused.out << fused.err);
  REQUIRE(fused.exit_code == 0);
  require_fused_agreement(last_line_json(fused.out));
}

TEST_CASE("crucible launch starts the ranks with the torchrun environment and reports a failing one",
          "[tools][launch]") {
  const auto ok = run_cli("launch --nproc 3 -- sh -c 'test $WORLD_SIZE = 3 && echo rank=$RANK'");
  INFO(ok.out << ok.err);
  CHECK(ok.exit_code == 0);
  for (const char* line : {"rank=0", "rank=1", "rank=2"}) CHECK_THAT(ok.out, CRUCIBLE_HAS_SUBSTR(line));
  const auto bad = run_cli("launch --nproc 2 -- sh -c 'exit 7'");
  CHECK(bad.exit_code == 7);
  CHECK_THAT(bad.err, CRUCIBLE_HAS_SUBSTR("exited with 7"));
  // --grace: rank 0 ends a second after rank 1 failed; inside a grace of
  // 20 s it ends on its own and says so, with none it is stopped first.
  const std::string late = " -- sh -c 'if [ $RANK = 1 ]; then exit 7; fi; sleep 1; echo rank0-ended'";
  const auto graced = run_cli("launch --nproc 2 --grace 20" + late);
  CHECK(graced.exit_code == 7);
  CHECK_THAT(graced.out, CRUCIBLE_HAS_SUBSTR("rank0-ended"));
  const auto stopped = run_cli("launch --nproc 2 --grace 0" + late);
  CHECK(stopped.exit_code == 7);
  CHECK(stopped.out.find("rank0-ended") == std::string::npos);
}
