// The models library's exception type.
#pragma once

#include <crucible/ir/error.h>

namespace crucible::models {

/// Thrown by the model zoo: unknown model names or sizes, configurations it
/// cannot build, modules whose state does not match. The message says what
/// is known or expected.
class ModelError : public Error {
 public:
  using Error::Error;
};

}  // namespace crucible::models
