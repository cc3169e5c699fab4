#include <crucible/partitioner/default_partition.h>

#include "split.h"

namespace crucible::partitioner {

PartitionResult default_partition(const ir::Graph& joint, size_t num_fwd_outputs) {
  return detail::split(joint, num_fwd_outputs, nullptr, "default_partition");
}

}  // namespace crucible::partitioner
