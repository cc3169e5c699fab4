// The runtime library's exception type.
#pragma once

#include <crucible/ir/error.h>

namespace crucible::runtime {

/// Thrown by the runtime library: a wrapper chain misused, a compiled call
/// given inputs it cannot take, malformed arguments to same(), a backend the
/// registry does not know.
class WrapperError : public Error {
 public:
  using Error::Error;
};

}  // namespace crucible::runtime
