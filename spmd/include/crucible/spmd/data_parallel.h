// The data-parallel expansion of a traced train step (the seed's
// DataParallel parallel mode, torch/distributed/_spmd/data_parallel.py, and
// _dedup_collectives in torch/distributed/_spmd/api.py), as graph passes.
#pragma once

#include <crucible/ir/graph.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace crucible::spmd {

// Note [Data-parallel expansion]
// Every rank traces the same step on its own shard of the global batch, and
// the step tags each gradient before the optimizer reads it
// (crucible::tag_grad, collectives.h). The expansion replaces the tags with
// an average over the ranks, as DDP does: the gradient a rank's update reads
// is the mean of the ranks' gradients, which is the gradient of the global
// batch when the loss is a mean over equal shards (a loss that sums over the
// batch is scaled by 1/world_size, as under DDP). Gradients are packed into
// buckets in the order the backward computes them (DDP packs by reversed
// parameter order, an estimate of the same); a bucket is
//   red = crucible::all_reduce_bucket(bucket, "avg", group)   right after its
//                                                            last gradient
//   w   = crucible::wait_tensor(red)                         just before the
//   g'  = view(split_with_sizes(w, numels)[i], sizes)        first read of any
// so the bucket's communication runs while the rest of the backward
// computes (Gloo runs it on its own threads, NCCL on its own stream) and is
// waited for only where the update needs it. all_reduce_bucket packs the
// gradients into the buffer it reduces, so each gradient is copied once;
// a bucket of one gradient is all_reduce(g). Buckets hold one dtype and one device, and
// close once they reach `bucket_bytes`; bucket_bytes 0 gives one collective
// per gradient. Gradients that are one Value (tied parameters) share a slot.
// The ranks' graphs are the same graph, so every rank issues the same
// collectives in the same order (Note [Order of side effects] in
// ir/effects.h).

/// How the expansion reduces gradients.
struct DataParallelOptions {
  /// The process group (process_group.h) the collectives run on.
  std::string group = "default";
  /// A bucket closes once it holds this many bytes (DDP's default, 25 MiB);
  /// 0: one all_reduce per gradient.
  int64_t bucket_bytes = 25 * 1024 * 1024;
};

/// What the expansion made.
struct DataParallelReport {
  /// Distinct gradients reduced (tags of one Value count once).
  size_t gradients = 0;
  /// Bytes of each bucket, in the order the collectives are issued.
  std::vector<int64_t> bucket_bytes;
};

/// Replaces every crucible::tag_grad of `graph` by a bucketed all_reduce
/// (Note [Data-parallel expansion]). A graph without tags is left as it is.
/// Throws SpmdError when a tagged gradient has no metadata.
DataParallelReport expand_data_parallel(ir::Graph& graph, const DataParallelOptions& options);

/// Merges collectives with the same target and arguments (the seed's
/// _dedup_collectives): a later one's uses go to the first, and it is
/// erased. Returns the number of nodes removed.
size_t dedup_collectives(ir::Graph& graph);

}  // namespace crucible::spmd
