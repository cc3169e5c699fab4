// The autograd library's exception type.
#pragma once

#include <crucible/ir/error.h>

namespace crucible::autograd {

/// Thrown by AOTAutograd: a function it cannot compile yet (input mutation
/// on the autograd path), a recompile limit reached, a compiled call given
/// inputs it was not compiled for.
class AotError : public Error {
 public:
  using Error::Error;
};

}  // namespace crucible::autograd
