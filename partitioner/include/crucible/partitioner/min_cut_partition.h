// The min-cut rematerialization partition: what the forward saves for the
// backward chosen by a minimum cut over the joint graph, cheap ops recomputed
// in the backward instead of saved (torch/_functorch/partitioners.py's
// min_cut_rematerialization_partition, which compile_fx passes as its
// partition_fn).
#pragma once

#include <crucible/ir/pass_manager.h>
#include <crucible/partitioner/partition.h>

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <unordered_set>

namespace crucible::partitioner {

// Note [Min-cut partition]
// The joint graph becomes a flow network with two vertices per value, v_in
// and v_out, joined by an edge whose capacity is what saving v costs: its
// bytes (TensorMeta::nbytes) for a tensor, infinite for a value that cannot
// cross to the backward (a non-tensor). Every use u -> v adds an infinite
// edge u_out -> v_in. The source feeds, with infinite capacity, every
// primal and every value whose node may not be recomputed (the heuristics
// below): those exist only in the forward. Every value that depends on a
// tangent feeds the sink: it exists only in the backward. A minimum s-t cut
// (Boost.Graph's boykov_kolmogorov_max_flow) then cuts v_in -> v_out edges
// only, and their values are the cheapest set to save such that everything
// else the backward needs can be recomputed from them; the backward
// recomputes it (Note [Default partition] for how the graphs are built).
// Heuristics, each a MinCutOptions switch, as the seed's:
//  - ban_compute_intensive: matrix products and convolutions (mm, addmm,
//    bmm, baddbmm, matmul, convolution and its backward, attention) are
//    never recomputed: their FLOPs cost more than their bytes.
//  - an op that reads an input the function mutates (batch norm and its
//    running statistics) is never recomputed: the backward runs after the
//    runtime wrote the input's new value.
//  - side effects are never recomputed (Note [Order of side effects]):
//    random ops (recomputing one draws new numbers; with functionalized RNG,
//    crucible::philox_rand takes its seed and offset as inputs and is an
//    ordinary, cheap op: a dropout mask is drawn again in the backward
//    instead of saved), writes, collectives.
//  - only_recompute_cheap_ops: only what a fusing backend recomputes for
//    free is recomputed: pointwise ops (ATen's `pointwise` tag), views,
//    small reductions (sum, mean, amax, amin), and a few layout and factory
//    ops (cat, expand, clone, _to_copy, where, full, zeros, ones, ...).
//    Anything else (softmax, layer norm, batch norm, embedding) is saved.
//    Views being free to recompute, a value whose views the backward reads
//    is saved as its base plus geometry wherever that is cheaper: the cut
//    weighs the base's bytes against the views' (which count their own
//    elements, overlaps again), and the backward takes the views again.
//  - max_recompute_distance: a forward value more than this many uses away
//    from the first backward use is not recomputed (long chains cost time
//    for little memory).
//  - ban_materialized_backwards (off by default): a value that a
//    compute-intensive backward op (a matmul, a convolution; through views)
//    reads is not recomputed: it is materialized again there, so
//    recomputing it saves memory only until that op and costs a kernel
//    (GPT-2's GELU output, read by the weight gradient's matmul; the seed's
//    is_materialized_backwards). Most of what GPT-2's cut recomputes is
//    read so: with the ban, min-cut saves what the default partition saves
//    (15.55 GiB at GPT-2-small size, against 9.93 GiB without), and a
//    rematerialized training step keeps its memory and its speed
//    (bench/results/partitioner.md). Hence a switch.

// Note [Memory budget]
// memory_budget (PyTorch's activation_memory_budget) trades recomputation
// for memory beyond the heuristics: 1 keeps them (the min-cut above); 0
// saves the least any cut can, letting the backward recompute every op
// without side effects (matmuls and convolutions included); in between, the
// saved bytes aim at least + budget × (heuristic − least). The ops the
// heuristics keep in the forward are the knapsack's items, each with a
// recompute cost estimated by op class and bytes; the cheapest are let go
// first, and a binary search over how many (each step one min-cut; fewer
// constraints never save more) finds the fewest that meet the target. So a
// smaller budget never saves more bytes.

struct MinCutOptions {
  bool ban_compute_intensive = true;
  bool only_recompute_cheap_ops = true;
  size_t max_recompute_distance = 1000;
  bool ban_materialized_backwards = false;
  /// 0..1; see Note [Memory budget]. Values above 1 act as 1, below 0 as 0.
  double memory_budget = 1.0;
  /// remat_pass only: a cost model's time for a graph, in ms (a backend's
  /// runtime::BackendInfo::estimated_ms, the inductor's roofline); with it
  /// the rewrite is kept only where the model says it takes at most
  /// `max_slowdown` (a share: 0.02 is 2%) longer than the graph as it was.
  /// Empty: time is not weighed. The partitions ignore both.
  std::function<double(const ir::Graph&)> estimated_ms{};
  double max_slowdown = 0.02;
};

/// What the cut chose, for inspection (crucible compile --dump-dir).
struct MinCutReport {
  /// Joint-graph names of the saved values, and of the values both parts
  /// compute (the forward for its outputs, the backward again instead of
  /// saving them).
  std::unordered_set<std::string> saved, recomputed;
  /// Bytes of the saved tensors (the cut's capacity).
  double saved_bytes = 0;
  /// For each saved and recomputed value, why: the heuristic that keeps it
  /// in the forward (an input, compute-intensive, not a cheap op, side
  /// effects, ...), the cut (saving it costs fewer bytes than what it is
  /// recomputed from), or the cheap op the backward runs again.
  std::map<std::string, std::string> why;
};

/// The report as text: a summary line, then one line per value, the saved
/// then the recomputed (each by name), with its reason (what crucible compile --dump-dir writes to
/// partition.txt).
std::string to_text(const MinCutReport& report);

/// Splits `joint` per Note [Joint graph contract], saving what Note
/// [Min-cut partition] chooses. Same results and errors as
/// default_partition (PartitionError), with saved bytes never above its.
/// Throws PartitionError naming the value when a value the backward needs
/// has no metadata (its bytes are unknown). `report`, if given, receives
/// what was saved and recomputed.
PartitionResult min_cut_rematerialization_partition(const ir::Graph& joint, size_t num_fwd_outputs,
                                                    const MinCutOptions& options = {}, MinCutReport* report = nullptr);

// Note [Rematerialization in one graph]
// A whole training step is one graph (forward, backward and update: Note
// [Train step graph] in pipeline/train_step.h). Nothing is split, but the
// same question stands: which forward values stay alive into the backward.
// The backward region runs from the first node autograd ran (the tracer
// tags them "backward"): the backward and the update. The network of
// Note [Min-cut partition] is built over the whole graph with what the
// caller holds anyway (placeholders, constants and views of them) free to
// keep, the heuristics and memory budget as there. A forward value the
// backward reads and the cut does not keep is recomputed: the nodes that
// make it from kept values are copied in front of the first backward node
// that reads it, and the backward reads the copies. The original then dies
// at its last forward reader, where the executors free it, and a fusing
// backend computes the copies inside the backward's kernels. The cut runs
// after common-subexpression elimination, which would merge the copies
// back (Builder::add_pass appends it to the post-grad passes). The pass
// keeps the rewrite only where it lowers the graph's estimated peak: a cut
// that keeps fewer bytes alive by its own sum can leave the peak where it
// was, and then only costs recomputation (the ConvNet's training step on
// a CPU: the same planned peak, 20-28% slower; bench/results/partitioner.md).

struct RematReport {
  /// Bytes of the forward tensors the backward reads, other than the free
  /// ones: what stays alive into the backward without rematerialization,
  /// and with it (the cut's capacity).
  double kept_bytes_before = 0, kept_bytes_after = 0;
  /// Nodes copied into the backward.
  size_t recomputed_nodes = 0;
};

/// Rematerializes `graph` in place (Note [Rematerialization in one
/// graph]). A graph without a backward region, or whose cut keeps no fewer
/// bytes, is left as it is. Throws PartitionError naming a value the
/// backward reads that has no metadata.
RematReport rematerialize(ir::Graph& graph, const MinCutOptions& options = {});

/// What `graph` holds at its peak when its nodes run in order, each
/// tensor a call makes allocated there and freed after the last node that
/// reads it or a view of it (the outputs at the end), in bytes; the
/// placeholders and constants are not counted. A backend that fuses holds
/// less, for the graph rematerialized and the graph as it was alike.
/// Throws nothing.
double estimated_peak_bytes(const ir::Graph& graph);

/// rematerialize as a pass named "remat" that acts on training steps'
/// graphs (those with a Loss output) and leaves others as they are, for
/// the post-grad pass list (`crucible train --partitioner min-cut`): the
/// rewrite is kept only where it lowers estimated_peak_bytes (Note
/// [Rematerialization in one graph]) and, with options.estimated_ms, where
/// it is at most options.max_slowdown slower by that model
/// (`--remat-max-slowdown`; pipeline::Builder::remat runs it so by
/// default); where the model throws (a graph the backend cannot lower),
/// the graph is left as it was.
ir::Pass remat_pass(const MinCutOptions& options = {});

/// Bytes of the saved values of a partition's forward (its SavedValue
/// outputs), by their metadata.
double saved_bytes(const PartitionResult& partition);

}  // namespace crucible::partitioner
