// The data library's exception type.
#pragma once

#include <crucible/ir/error.h>

namespace crucible::data {

/// Thrown by the data library: unreadable or corrupt dataset files, batches
/// or options that cannot be made. The message names the file or option and
/// says what to do.
class DataError : public Error {
 public:
  using Error::Error;
};

}  // namespace crucible::data
