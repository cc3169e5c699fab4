// The pipeline library's exception type.
#pragma once

#include <crucible/ir/error.h>

namespace crucible::pipeline {

/// Thrown by the pipeline library: builder stages it cannot set up, training
/// steps and optimizer configurations it cannot express as graph ops.
class PipelineError : public Error {
 public:
  using Error::Error;
};

}  // namespace crucible::pipeline
