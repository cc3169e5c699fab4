// Local rank launching, as torchrun does for one machine: start N processes
// of a command with the torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), wait for them, and stop the
// rest as soon as one fails.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace crucible::spmd {

struct LaunchOptions {
  /// Processes to start (>= 1).
  int nproc = 1;
  /// The command and its arguments (argv; searched on PATH).
  std::vector<std::string> command;
  std::string master_addr = "127.0.0.1";
  /// 0: a free port on this machine, picked when launching.
  uint16_t master_port = 0;
  /// After one rank fails, the others have this long to end on their own
  /// (a collective with the failed rank fails in them, and they say so),
  /// then get SIGTERM, and SIGKILL after as long again.
  std::chrono::milliseconds grace{std::chrono::seconds(5)};
  /// Extra environment for every rank ("NAME=value").
  std::vector<std::string> env;
};

/// Starts the ranks and waits for all of them. With more than one rank and
/// no OMP_NUM_THREADS in the environment (or `env`), each rank gets
/// OMP_NUM_THREADS=1, as torchrun gives them, and a line on standard error
/// says so. Returns 0 when every rank
/// exited with 0; otherwise the exit status of the first rank that failed
/// (128 + the signal for a rank killed by one), after stopping the others.
/// Writes one line per failed rank to standard error ("rank R exited with
/// S"). Throws SpmdError when `nproc` < 1, the command is empty, or a
/// process cannot be started.
int launch(const LaunchOptions& options);

/// A TCP port on this machine no socket listens on now (bound to port 0 and
/// released, as torchrun picks one). Throws SpmdError if no socket can be
/// bound.
uint16_t free_port();

}  // namespace crucible::spmd
