// The inductor library's exception type.
#pragma once

#include <crucible/ir/error.h>

namespace crucible::inductor {

/// Thrown by inductor: an unusable cache directory, a C++ compiler that
/// failed on generated code (the message names the source file and quotes the
/// compiler), a generated library that does not load.
class InductorError : public Error {
 public:
  using Error::Error;
};

}  // namespace crucible::inductor
