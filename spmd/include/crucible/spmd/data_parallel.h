// The data-parallel expansion of a traced train step (the seed's
// DataParallel parallel mode, torch/distributed/_spmd/data_parallel.py, and
// _dedup_collectives in torch/distributed/_spmd/api.py), as graph passes.
#pragma once

#include <crucible/ir/graph.h>

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <optional>
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

// Note [Fully-sharded step]
// DataParallelStyle::FullyShard (ZeRO-3, PyTorch's FSDP2 fully_shard, and
// the seed's DataParallelStyle.FULLY_SHARD): each rank holds 1/N of every
// parameter the optimizer updates, of its gradient and of its optimizer
// state. spmd::compile cuts each such parameter along dim 0 into N chunks
// of ceil(d0 / N) rows, the last ones padded with zeros (a 0-dim parameter
// is one row), and points the module's parameter at rank r's chunk
// (Tensor::set_data: the tensor the optimizer holds stays the same one),
// as fully_shard leaves DTensor shards in the module; the optimizer's state
// for it is cut alike. The step then traces, around the user's loss
// (pipeline's TrainStepOptions::around_loss):
//   full = wait_tensor(all_gather_into_tensor(shard))[:d0]   before the loss
//          (the parameter points at `full` while the loss and its backward run)
//   g'   = wait_tensor(reduce_scatter_tensor(pad(grad), "avg"))
//          issued from a hook on the parameter, so where the backward
//          finishes its gradient
//   the optimizer's update on the shard, with g' and the state's chunk
// and the shard's update is written back into the module's parameter. A
// rank therefore holds the whole parameters only inside the step; the
// backends sink each wait to the first kernel reading it (Note [Sinking
// waits]), so the gathers are in flight while the step starts and each
// reduce_scatter while the rest of the backward runs. The gradient is the
// ranks' average, as under Replicate, so both styles train alike (bit for
// bit over 2 ranks: two addends sum alike in either order). Parameters the
// optimizer does not update (frozen) and buffers stay whole on every rank.
// The builder's pre-grad passes (the inductor's fuse_flash_attention) trace
// the loss alone over the parameters gathered whole for that trace
// (TrainStepOptions::around_pre_grad_trace: the whole model on each rank
// while it runs, at compile time), so their graph is the user's loss, and
// the step gathers around it as around the loss.
// schedule_fully_shard then places the gathers (Note [Scheduling a
// fully-sharded step]) and packs them into buckets (Note [Buckets of a
// fully-sharded step]). With DataParallelOptions::param_dtype (mixed
// precision) the shard is cast before its gather, and the gradient back
// to the shard's dtype before its reduce_scatter.
//
// Note [Scheduling a fully-sharded step]
// As traced, every gather is issued before the loss and its result is
// read until the backward is done with it: the whole model lives through
// the step. schedule_fully_shard moves them, as SimpleFSDP's reordering in
// Inductor does:
//  - reshard after forward (FSDP2's default, DataParallelOptions::
//    reshard_after_forward): where the backward reads a gathered parameter
//    (through views the forward took of it, as autograd saved them), it
//    reads a second gather, issued in the backward, and the views taken
//    again of that; the forward's is then dead after its last forward use.
//    What the backward reads through other ops (a cast under autocast) is
//    left as it is.
//  - prefetch: each gather is waited for just before its own first use,
//    and issued just before the wait for an earlier one, so that the
//    parameters gathered ahead of the one in use hold at most
//    `prefetch_bytes` (at least the next one), and are in flight while the
//    host waits (Gloo's waits block it). The backward's gathers are issued
//    no earlier than the forward's last one is waited for.
// Every rank schedules the same graph alike, so the collectives keep one
// order across ranks.
//
// Note [Buckets of a fully-sharded step]
// One collective per parameter costs its latency per parameter (GPT-2
// small: 222 gathers and 148 reduce_scatters a step; on the CPU, 4 to 7x
// replicate's step). schedule_fully_shard packs them into buckets of
// `bucket_bytes` as FSDP2 packs a module's parameters into one all_gather
// (its foreach_all_gather and foreach_reduce), and SimpleFSDP's bucketing
// in Inductor does by size:
//  - gathers, consecutive in the order of their first readers and of one
//    phase (forward or backward), dtype and group:
//      shards   = cat([shard_1.view(1, -1), ...], 1)
//      gathered = wait_tensor(all_gather_into_tensor(shards)).view(N, -1)
//      param_k  = split_with_sizes(gathered, numels, 1)[k].clone().view(sizes_k)
//    rank r's shards are row r of the gathered buffer, so each whole
//    parameter is a column block of it, copied out (as FSDP2's
//    split_with_sizes_copy); the buffer dies once the copies are made. The
//    bucket is prefetched and waited for as one gather.
//  - reduce_scatters, consecutive in graph order, where the bucket's last
//    gradient is complete (and no member's result is read before):
//      grads   = cat([pad(grad_1).view(N, -1), ...], 1)
//      reduced = wait_tensor(reduce_scatter_tensor(grads, "avg")).view(1, -1)
//      g'_k    = split_with_sizes(reduced, numels, 1)[k].view(shard sizes_k)
//    rank r's chunks of every gradient are row r, so the reduced row is
//    this rank's shards side by side, read in place.
// A bucket takes the next collective while it then holds at most
// bucket_bytes, so a parameter larger than that is gathered alone, without
// the copies; bucket_bytes 0 keeps one collective per parameter. The
// values are the same as unbucketed: the same elements are gathered, and
// summed over the same ranks.

/// How parameters are laid out over the ranks (the seed's DataParallelStyle).
enum class DataParallelStyle {
  /// Every rank holds every parameter; gradients are all_reduced (DDP).
  Replicate,
  /// Every rank holds a shard of each parameter, gradient and optimizer
  /// state (FSDP2's fully_shard): Note [Fully-sharded step].
  FullyShard,
};

/// The style named "replicate" or "fully_shard"; throws SpmdError otherwise.
DataParallelStyle parse_data_parallel_style(const std::string& name);

/// How the expansion reduces gradients.
struct DataParallelOptions {
  /// The process group (process_group.h) the collectives run on.
  std::string group = "default";
  /// Replicate: a bucket closes once it holds this many bytes (DDP's
  /// default, 25 MiB). FullyShard: a bucket holds at most this many bytes
  /// of gathered parameters, or of gradients (Note [Buckets of a
  /// fully-sharded step]). 0: one collective per gradient or parameter.
  int64_t bucket_bytes = 25 * 1024 * 1024;
  /// Replicate (DDP) or FullyShard (FSDP).
  DataParallelStyle style = DataParallelStyle::Replicate;
  /// FullyShard: gather the parameters again in the backward instead of
  /// keeping the forward's (Note [Scheduling a fully-sharded step]).
  bool reshard_after_forward = true;
  /// FullyShard: bytes of parameters gathered ahead of the one in use.
  int64_t prefetch_bytes = 25 * 1024 * 1024;
  /// FullyShard: the dtype parameters are gathered in, and the loss and its
  /// backward compute in (FSDP2's MixedPrecisionPolicy::param_dtype, e.g.
  /// bf16); nullopt: the parameters' own. The shards, the optimizer's state
  /// and its update stay in the parameters' dtype (the fp32 master copy).
  /// Gradients are cast back to it before the reduce_scatter, so the ranks
  /// sum them in it (FSDP2's reduce_dtype = float32), and the batch's
  /// floating-point tensors are cast to param_dtype before the loss
  /// (FSDP2's cast_forward_inputs). spmd::compile throws SpmdError when it
  /// is set under Replicate.
  std::optional<c10::ScalarType> param_dtype;
};

/// What schedule_fully_shard made.
struct FullyShardReport {
  /// Parameters held as shards.
  size_t parameters = 0;
  /// Parameters gathered: one per parameter the step reads, plus a second
  /// in the backward for each it gathers again (`regathers`).
  size_t gathers = 0;
  size_t regathers = 0;
  /// Collectives the step issues, gathers and gradients packed into buckets.
  size_t all_gathers = 0;
  size_t reduce_scatters = 0;
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

/// Reschedules the crucible::all_gather_into_tensor nodes of a fully-sharded
/// step (each read by one wait_tensor): Note [Scheduling a fully-sharded
/// step]. Leaves `parameters` 0. A graph without gathers is left as it is.
FullyShardReport schedule_fully_shard(ir::Graph& graph, const DataParallelOptions& options);

/// Merges collectives with the same target and arguments (the seed's
/// _dedup_collectives): a later one's uses go to the first, and it is
/// erased. Returns the number of nodes removed.
size_t dedup_collectives(ir::Graph& graph);

}  // namespace crucible::spmd
