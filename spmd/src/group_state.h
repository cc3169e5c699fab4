// What a ProcessGroup holds: c10d's store and backend. Private to spmd: only
// its sources include c10d's headers.
#pragma once

#include <crucible/spmd/process_group.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace crucible::spmd::detail {

/// An exception's message without the C++ backtrace c10::Error appends.
inline std::string message_of(const std::exception& e) {
  std::string what = e.what();
  if (const size_t cut = what.find("\nException raised from"); cut != std::string::npos) what.resize(cut);
  return what;
}

struct GroupState {
  ProcessGroupOptions options;
  std::string backend_name;  // "gloo" or "nccl"
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  // Gloo reduces with SUM and the result is divided when waited for.
  bool native_avg = false;
  // all_gather_string calls so far. Every rank makes them in the same order,
  // so the count tells one call's keys from another's: keys the store already
  // holds from an earlier call of the same name (an earlier step's graph
  // hash) are never read back as this call's.
  std::atomic<uint64_t> string_gathers{0};
};

/// The NCCL collectives whose wait_tensor only made the stream wait
/// (Note [Waiting for NCCL]), kept while an object of this lives on the
/// thread: an SpmdStep call makes one, and blocks on them once the step is
/// launched, so a rank that died or hangs is an error within the group's
/// timeout. Collectives not awaited when it goes are forgotten.
class AwaitedCollectives {
 public:
  AwaitedCollectives();
  ~AwaitedCollectives();
  AwaitedCollectives(const AwaitedCollectives&) = delete;
  AwaitedCollectives& operator=(const AwaitedCollectives&) = delete;
  /// Blocks until every kept collective completes (each within its group's
  /// timeout) and forgets them. Throws SpmdError naming the rank and the
  /// group when one failed or timed out.
  void await();

  struct Entry {
    c10::intrusive_ptr<c10d::Work> work;
    int64_t numel = 0;
    ProcessGroup group;
    const char* what = "crucible::wait_tensor: an all_reduce";  // the collective, as its error names it
  };

 private:
  std::vector<Entry> entries_;
  AwaitedCollectives* outer_;
  friend void keep_awaited(Entry entry);
};

/// Sets this rank's `value` for the group's next all_gather_string of `key`
/// without waiting for the other ranks' (a rank that will not gather: Note
/// [A rank that fails to compile] in api.cpp). Throws what the store throws.
void publish_string(const ProcessGroup& group, const std::string& key, const std::string& value);

/// Keeps `entry` in the thread's innermost AwaitedCollectives, if any.
void keep_awaited(AwaitedCollectives::Entry entry);

/// Broadcasts `tensor` (on the device the group's backend serves) from
/// `root` in place, waited for as wait_tensor waits (Note [Waiting for
/// NCCL]): on NCCL the current stream waits for it and the innermost
/// AwaitedCollectives keeps it, on Gloo the host waits within the timeout.
/// Throws SpmdError starting with `what` (a static string naming the
/// broadcast) and naming the rank and the group when it fails.
void broadcast_awaited(const ProcessGroup& group, at::Tensor& tensor, int root, const char* what);

}  // namespace crucible::spmd::detail
