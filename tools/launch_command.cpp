// `crucible launch --nproc N [--master-addr A] [--master-port P] -- COMMAND...`:
// start N local ranks of COMMAND with the torchrun environment (spmd/launch.h)
// and exit with the first failing rank's status.
#include "commands.h"

#include <crucible/spmd/launch.h>

#include <CLI/CLI.hpp>

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
  cmd->add_option("command", o->command, "the command each rank runs (after --)")->required();
  cmd->callback([o] {
    if (const int code = spmd::launch(*o); code != 0) std::exit(code);
  });
}

}  // namespace crucible::tools
