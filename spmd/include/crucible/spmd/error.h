// The spmd library's exception type.
#pragma once

#include <crucible/ir/error.h>

namespace crucible::spmd {

/// Thrown for a process group that cannot be formed (a missing or bad
/// torchrun variable, a store that cannot be reached), a collective that
/// failed on some rank (a rank died, timed out, or issued other
/// collectives), ranks whose compiled graphs differ, and a train step the
/// data-parallel expansion cannot expand. Messages name the rank.
class SpmdError : public Error {
 public:
  using Error::Error;
};

}  // namespace crucible::spmd
