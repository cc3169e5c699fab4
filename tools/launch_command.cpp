// `crucible launch --nproc N [--master-addr A] [--master-port P] [--grace S] -- COMMAND...`:
// start N local ranks of COMMAND with the torchrun environment (spmd/launch.h)
// and exit with the first failing rank's status.
#include "commands.h"

#include <crucible/spmd/launch.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdlib>
#include <memory>

namespace crucible::tools {

namespace {
std::vector<std::string>& stored_command_line() {
  static std::vector<std::string> args;
  return args;
}
}  // namespace

const std::vector<std::string>& command_line() { return stored_command_line(); }
void set_command_line(int argc, char** argv) { stored_command_line().assign(argv, argv + argc); }

void add_launch_command(CLI::App& app) {
  auto o = std::make_shared<spmd::LaunchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "launch", "start N local ranks of a command with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set (as torchrun)");
  cmd->add_option("--nproc", o->nproc, "ranks to start")->required()->check(CLI::PositiveNumber);
  cmd->add_option("--master-addr", o->master_addr, "the address rank 0's store listens on")->capture_default_str();
  cmd->add_option("--master-port", o->master_port, "its port (0: a free one)")->capture_default_str();
  auto grace_s = std::make_shared<double>(std::chrono::duration<double>(o->grace).count());
  cmd->add_option("--grace", *grace_s,
                  "seconds the other ranks have to end on their own once one failed, before SIGTERM "
                  "(and as long again before SIGKILL); a rank that reports a dead peer itself needs the "
                  "collectives' timeout (CRUCIBLE_DIST_TIMEOUT_S) on NCCL")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("command", o->command, "the command each rank runs (after --)")->required();
  cmd->callback([o, grace_s] {
    o->grace = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(*grace_s));
    if (const int code = spmd::launch(*o); code != 0) std::exit(code);
  });
}

}  // namespace crucible::tools
