// The partitioner library's exception type.
#pragma once

#include <crucible/ir/error.h>

namespace crucible::partitioner {

/// Thrown when a joint graph breaks the contract of
/// Note [Joint graph contract]: tangents before primals, a forward output
/// that depends on a tangent, more forward outputs than outputs.
class PartitionError : public Error {
 public:
  using Error::Error;
};

}  // namespace crucible::partitioner
