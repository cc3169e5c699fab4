// The autograd library's exception type.
#pragma once

#include <crucible/ir/error.h>

namespace crucible::autograd {

/// Thrown by AOTAutograd: a function it cannot compile (an output viewing
/// an input with another dtype, aliased written inputs with no common base,
/// a random op without a Philox form, the traced function itself failing),
/// the export checks, a recompile limit reached, a compiled call given
/// inputs it was not compiled for. The message names the input, output or op
/// and says what to do.
class AotError : public Error {
 public:
  using Error::Error;
};

}  // namespace crucible::autograd
