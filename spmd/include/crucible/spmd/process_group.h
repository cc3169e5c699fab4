// Process groups over PyTorch's c10d: a TCPStore rendezvous from the
// torchrun environment, and c10d's own ProcessGroupGloo (CPU tensors) or
// ProcessGroupNCCL (CUDA tensors) behind it, registered by name so that the
// functional collectives of collectives.h, which name their group with a
// string as _c10d_functional's do, find it. Mirrors
// torch.distributed.init_process_group's env:// rendezvous.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace at {
class Tensor;
}

namespace crucible::spmd {

/// How to form a group. The defaults are a one-rank group on the CPU.
struct ProcessGroupOptions {
  /// The name collectives use to find the group.
  std::string name = "default";
  /// "gloo" (CPU tensors, and CUDA tensors where LibTorch is a CUDA build),
  /// "nccl" (CUDA tensors, one GPU per rank; needs a CUDA build of LibTorch
  /// with NCCL), or "auto": nccl when `device` is "cuda", else gloo.
  std::string backend = "auto";
  /// The device of the tensors the group reduces: "cpu" or "cuda" (NCCL
  /// makes cuda:local_rank this rank's device).
  std::string device = "cpu";
  int rank = 0;
  int world_size = 1;
  /// The rank on this machine (the CUDA device a rank uses).
  int local_rank = 0;
  /// The TCPStore rank 0 serves and every rank connects to.
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 29500;
  /// How long a rank waits for the others: at the rendezvous, and for each
  /// collective. A rank that died or hangs makes the others throw within
  /// about this time (c10d's default is 30 minutes; ours is shorter so a
  /// failure surfaces while someone is watching).
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

/// The options torchrun's environment gives: RANK, WORLD_SIZE, LOCAL_RANK
/// (default RANK), MASTER_ADDR (default 127.0.0.1), MASTER_PORT (default
/// 29500), and CRUCIBLE_DIST_TIMEOUT_S (seconds, default 300). A process
/// with neither RANK nor WORLD_SIZE set is rank 0 of 1. Throws SpmdError
/// naming a variable that is set but not a number in range, or RANK or
/// WORLD_SIZE set without the other.
ProcessGroupOptions options_from_env();

namespace detail {
struct GroupState;
}

/// A formed group. Copies share it; the group lives while any copy, or its
/// registration, does.
class ProcessGroup {
 public:
  const std::string& name() const;
  /// "gloo" or "nccl".
  const std::string& backend() const;
  int rank() const;
  int size() const;
  std::chrono::milliseconds timeout() const;
  /// "rank R of N (backend, group 'name')", for messages.
  std::string describe() const;

  /// Blocking collectives for the host side of a step (state broadcast,
  /// checks): in place on `tensors`, which live on the group's device.
  /// Throw SpmdError naming this rank when another rank failed or timed out.
  void broadcast(std::vector<at::Tensor>& tensors, int root) const;
  void all_reduce_sum(std::vector<at::Tensor>& tensors) const;
  /// Every rank's `value` under `key`, in rank order, through the store (no
  /// tensors: works for any backend). A collective: every rank makes its calls
  /// in the same order, and a call is matched with the other ranks' call of
  /// the same index, whatever earlier calls of the same `key` left in the
  /// store; `key` names the call in errors. Throws SpmdError naming the first
  /// rank that did not publish within the timeout.
  std::vector<std::string> all_gather_string(const std::string& key, const std::string& value) const;

  /// The state behind the group (its c10d backend and store), for the
  /// collectives' kernels.
  const std::shared_ptr<detail::GroupState>& state() const { return state_; }
  explicit ProcessGroup(std::shared_ptr<detail::GroupState> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<detail::GroupState> state_;
};

/// Forms the group (rank 0 serves the TCPStore; every rank connects to it
/// and builds the c10d backend) and registers it under `options.name`,
/// replacing an earlier group of that name. Blocks until every rank has
/// joined. Throws SpmdError when the store cannot be reached (naming the
/// address and port tried), the ranks do not all join within the timeout,
/// the options are inconsistent (rank outside [0, world_size), an unknown
/// backend or device), or the backend is not built into this LibTorch.
ProcessGroup init_process_group(const ProcessGroupOptions& options);

/// The group registered under `name`. Throws SpmdError if there is none
/// (naming init_process_group).
ProcessGroup resolve_process_group(const std::string& name);

/// Forgets the group registered under `name` (a no-op if there is none);
/// the group closes once no copy is held.
void destroy_process_group(const std::string& name);

}  // namespace crucible::spmd
