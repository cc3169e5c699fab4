// `crucible launch --nproc N [--nnodes K --node-rank R] [--master-addr A]
// [--master-port P] [--grace S] -- COMMAND...`: start this node's N ranks of
// COMMAND with the torchrun environment (spmd/launch.h) and exit with the
// first failing rank's status. The node flags default to the NNODES,
// NODE_RANK, MASTER_ADDR and MASTER_PORT a cluster's job script sets.
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
      "launch",
      "start a node's N ranks of a command with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set (as torchrun)");
  cmd->add_option("--nproc", o->nproc, "ranks to start on this node")->required()->check(CLI::PositiveNumber);
  cmd->add_option("--nnodes", o->nnodes, "nodes in the job, each running this command with its --node-rank")
      ->envname("NNODES")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--node-rank", o->node_rank, "this node's index, from 0 (its ranks: node-rank * nproc, ...)")
      ->envname("NODE_RANK")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--master-addr", o->master_addr, "the address rank 0's store listens on (node 0's)")
      ->envname("MASTER_ADDR")
      ->capture_default_str();
  cmd->add_option("--master-port", o->master_port, "its port (0: a free one; several nodes must give the same)")
      ->envname("MASTER_PORT")
      ->capture_default_str();
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
