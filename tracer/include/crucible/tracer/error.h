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

/// A TraceError for an op whose result's value or shape depends on tensor
/// values (.item(), nonzero, masked_select): the graph cannot hold it. Its
/// own type because a caller may trace again another way that avoids the
/// op (Note [Pre-grad traces that read values] in pipeline/builder.cpp).
class DataDependentError : public TraceError {
 public:
  using TraceError::TraceError;
};

/// A TraceError for what only a functionalized trace can hold: a tensor
/// pointed by set_ at the Storage of a tensor no traced op wrote (ATen's
/// cuDNN RNN does so with its flattened weights). Its own type because a
/// caller that traced without functionalization may go on without that
/// trace (Note [Pre-grad traces that read values] in pipeline/builder.cpp).
class NeedsFunctionalizationError : public TraceError {
 public:
  using TraceError::TraceError;
};

}  // namespace crucible::tracer
