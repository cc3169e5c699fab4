// `crucible bench [--model M,...] [--stage S,...] [--json FILE] [-- FLAGS...]`:
// runs the per-stage pipeline benchmarks (bench/bench_pipeline.cpp), linked
// into this command, through Google Benchmark; FLAGS go to Google Benchmark
// as they are (--benchmark_repetitions=3, ...).
#include "commands.h"

#include <crucible/models/zoo.h>
#include <crucible/pipeline/error.h>

#include <bench_pipeline.h>
#include <benchmark/benchmark.h>
#include <CLI/CLI.hpp>

#include <memory>

namespace crucible::tools {
namespace {

struct BenchCommandOptions {
  std::vector<std::string> models;
  std::vector<std::string> stages;
  std::string json;
  bool list = false;
};

std::string alternatives(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : "|") + n;
  return "(" + out + ")";
}

void run_bench_command(const BenchCommandOptions& o, const std::vector<std::string>& extra) {
  std::vector<std::string> stages = o.stages;
  if (stages.empty())
    for (const auto& [stage, fn] : bench::pipeline_stages()) stages.push_back(stage);
  const std::vector<std::string>& models = o.models.empty() ? models::model_names() : o.models;
  std::vector<std::string> args = {
      "crucible bench", "--benchmark_filter=^BM_Pipeline" + alternatives(stages) + "/" + alternatives(models) + "$"};
  if (o.list) args.push_back("--benchmark_list_tests=true");
  if (!o.json.empty()) {
    args.push_back("--benchmark_out=" + o.json);
    args.push_back("--benchmark_out_format=json");
  }
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int argc = static_cast<int>(args.size());
  benchmark::Initialize(&argc, argv.data());
  if (argc > 1)
    throw pipeline::PipelineError(std::string("crucible bench: Google Benchmark does not know the flag ") + argv[1]);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchCommandOptions>();
  CLI::App* cmd =
      app.add_subcommand("bench",
                         "per-stage compile times and a training step, compiled vs eager, for the zoo's models "
                         "(Google Benchmark; flags after -- go to it)");
  std::vector<std::string> stages;
  for (const auto& [stage, fn] : bench::pipeline_stages()) stages.push_back(stage);
  cmd->add_option("--model", o->models, "models to run (default: all)")
      ->delimiter(',')
      ->check(CLI::IsMember(models::model_names()));
  cmd->add_option("--stage", o->stages, "stages to run (default: all)")->delimiter(',')->check(CLI::IsMember(stages));
  cmd->add_option("--json", o->json, "also write Google Benchmark's JSON results to this file");
  cmd->add_flag("--list", o->list, "list the benchmarks instead of running them");
  cmd->allow_extras();
  cmd->callback([o, cmd] { run_bench_command(*o, cmd->remaining()); });
}

}  // namespace crucible::tools
