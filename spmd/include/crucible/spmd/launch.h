// Rank launching, as torchrun does: start a node's N processes of a command
// with the torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
// wait for them, and stop the rest as soon as one fails. Several nodes:
// the same launch on each, with its node rank, all naming node 0's address
// and one port (torchrun's --nnodes, --node-rank, --master-addr,
// --master-port with its static rendezvous): rank 0, on node 0, serves the
// TCPStore every rank meets at (process_group.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace crucible::spmd {

struct LaunchOptions {
  /// Processes to start on this node (>= 1).
  int nproc = 1;
  /// Nodes in the job (>= 1), each running this launch with `nproc`
  /// processes, and this node's index among them (0 <= node_rank <
  /// nnodes). Node r's ranks are r * nproc ... r * nproc + nproc - 1.
  int nnodes = 1;
  int node_rank = 0;
  /// The command and its arguments (argv; searched on PATH).
  std::vector<std::string> command;
  /// Where rank 0's store listens: node 0's address.
  std::string master_addr = "127.0.0.1";
  /// 0: a free port on this machine, picked when launching (one node
  /// only: the nodes of a job must all name the same port).
  uint16_t master_port = 0;
  /// After one rank fails, the others have this long to end on their own
  /// (a collective with the failed rank fails in them, and they say so),
  /// then get SIGTERM, and SIGKILL after as long again.
  std::chrono::milliseconds grace{std::chrono::seconds(5)};
  /// Extra environment for every rank ("NAME=value").
  std::vector<std::string> env;
};

/// Starts this node's ranks and waits for all of them. With more than one
/// rank on the node and no OMP_NUM_THREADS in the environment (or `env`),
/// each rank gets OMP_NUM_THREADS=1, as torchrun gives them, and a line on
/// standard error says so. Returns 0 when every rank exited with 0;
/// otherwise the exit status of the first rank that failed (128 + the
/// signal for a rank killed by one), after stopping the node's others (the
/// other nodes' ranks see the failure in their collectives, within their
/// timeout, as a dead rank: Note [A failed collective]). Writes one line
/// per failed rank to standard error ("rank R exited with S", R the global
/// rank). Throws SpmdError when `nproc` or `nnodes` < 1, `node_rank` is
/// outside [0, nnodes), several nodes are asked for without a port, the
/// command is empty, or a process cannot be started.
int launch(const LaunchOptions& options);

/// A TCP port on this machine no socket listens on now (bound to port 0 and
/// released, as torchrun picks one). Throws SpmdError if no socket can be
/// bound.
uint16_t free_port();

}  // namespace crucible::spmd
