// `crucible bench [--model M,...] [--stage S,...] [--json FILE] [--list] [-- FLAGS...]`:
// runs the per-stage pipeline benchmarks (BM_Pipeline<Stage>/<model>,
// bench/bench_pipeline.cpp) of the crucible_bench binary, which this command
// starts in its place rather than links (the benchmarks reach inductor's
// internals); FLAGS go to Google Benchmark as they are
// (--benchmark_repetitions=3, ...).
#include "commands.h"

#include <crucible/models/zoo.h>
#include <crucible/pipeline/error.h>

#include <unistd.h>

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

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

// crucible_bench beside this command (both installed into bin/), else where
// this build made it.
std::filesystem::path bench_binary() {
  std::vector<std::filesystem::path> candidates;
  std::error_code ec;
  if (const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec); !ec)
    candidates.push_back(self.parent_path() / "crucible_bench");
  candidates.emplace_back(CRUCIBLE_BENCH);
  for (const std::filesystem::path& p : candidates)
    if (std::filesystem::is_regular_file(p, ec)) return p;
  throw pipeline::PipelineError(std::string("crucible bench: the crucible_bench binary is neither beside this command "
                                            "nor at ") +
                                CRUCIBLE_BENCH + "; build it (./x build, with Google Benchmark installed)");
}

[[noreturn]] void run_bench_command(const BenchCommandOptions& o, const std::vector<std::string>& extra) {
  const std::vector<std::string>& models = o.models.empty() ? models::model_names() : o.models;
  const std::string stages = o.stages.empty() ? "[A-Za-z]+" : alternatives(o.stages);
  const std::filesystem::path binary = bench_binary();
  std::vector<std::string> args = {binary.string(),
                                   "--benchmark_filter=^BM_Pipeline" + stages + "/" + alternatives(models) + "$"};
  if (o.list) args.push_back("--benchmark_list_tests=true");
  if (!o.json.empty()) {
    args.push_back("--benchmark_out=" + o.json);
    args.push_back("--benchmark_out_format=json");
  }
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(argv[0], argv.data());
  throw pipeline::PipelineError("crucible bench: could not start " + binary.string() + ": " + std::strerror(errno));
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchCommandOptions>();
  CLI::App* cmd =
      app.add_subcommand("bench",
                         "per-stage compile times and a training step, compiled vs eager, for the zoo's models "
                         "(Google Benchmark's crucible_bench; flags after -- go to it)");
  cmd->add_option("--model", o->models, "models to run (default: all)")
      ->delimiter(',')
      ->check(CLI::IsMember(models::model_names()));
  cmd->add_option("--stage", o->stages, "stages to run, by name (default: all; --list shows them)")->delimiter(',');
  cmd->add_option("--json", o->json, "also write Google Benchmark's JSON results to this file");
  cmd->add_flag("--list", o->list, "list the benchmarks instead of running them");
  cmd->allow_extras();
  cmd->callback([o, cmd] { run_bench_command(*o, cmd->remaining()); });
}

}  // namespace crucible::tools
