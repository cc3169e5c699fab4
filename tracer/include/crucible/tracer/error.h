// The exception the tracer throws.
#pragma once

#include <crucible/ir/error.h>

namespace crucible::tracer {

/// Thrown while capturing a graph: data-dependent ops, tensors too large to
/// become constants, ops without a kernel in fake mode, unknown operators in a
/// decomposition table. The message names the op or input and says what to do.
class TraceError : public Error {
 public:
  using Error::Error;
};

}  // namespace crucible::tracer
