// AotConfig: the compilers and options of an AOTAutograd compilation
// (torch/_functorch/aot_autograd.py's AOTConfig).
#pragma once

#include <crucible/ir/backend.h>
#include <crucible/ir/interpreter.h>
#include <crucible/partitioner/default_partition.h>
#include <crucible/tracer/decomposition.h>

#include <cstddef>
#include <optional>

namespace crucible::autograd {

struct AotConfig {
  /// Compiles the forward part of the partitioned joint graph.
  ir::Backend fw_compiler = ir::interpret;
  /// Compiles the backward part, lazily at the first backward call.
  ir::Backend bw_compiler = ir::interpret;
  /// Compiles the whole graph when no gradient is needed (no input requires
  /// grad, or grad mode is off).
  ir::Backend inference_compiler = ir::interpret;
  /// Splits the joint graph; see partitioner/partition.h.
  partitioner::PartitionFn partition_fn = partitioner::default_partition;
  /// Ops rewritten while tracing.
  tracer::DecompositionTable decompositions;
  /// At most this many compilations per function (one per distinct input
  /// metadata, see Note [AOT cache guards]); a call needing one more throws
  /// AotError. Unset: no limit.
  std::optional<size_t> recompile_limit;
};

}  // namespace crucible::autograd
