// The pipeline library's exception type.
#pragma once

#include <crucible/ir/error.h>

namespace crucible::pipeline {

/// Thrown by the pipeline library: unreadable or corrupt datasets, unknown
/// model names, optimizer configurations it cannot express as graph ops.
class PipelineError : public Error {
 public:
  using Error::Error;
};

}  // namespace crucible::pipeline
