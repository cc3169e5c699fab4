// Errors thrown by Crucible. Every library throws its own subclass of
// crucible::Error, with a message that names the node, op or input at fault
// and says what to do about it.
#pragma once

#include <stdexcept>
#include <string>

namespace crucible {

/// Base of every exception Crucible throws; catch this to catch them all.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace ir {

/// Thrown by the IR library: malformed graphs, unknown operators, verifier
/// failures, interpreter errors.
class IrError : public Error {
 public:
  using Error::Error;
};

/// Thrown by the text parser; what() reads "line L, column C: message".
class ParseError : public IrError {
 public:
  ParseError(int line, int column, const std::string& message)
      : IrError("line " + std::to_string(line) + ", column " + std::to_string(column) + ": " + message),
        line_(line),
        column_(column) {}
  int line() const { return line_; }
  int column() const { return column_; }

 private:
  int line_;
  int column_;
};

}  // namespace ir
}  // namespace crucible
