// Literals: the syntax-free middle between a node's arguments and the text
// and JSON forms. The printer and the JSON writer turn Arguments into
// Literals and write them; the parser and the JSON reader read Literals and
// turn them back into Arguments, guided by the schema argument's type. Which
// IValue a constant becomes is decided here, once, for both forms.
#pragma once

#include <crucible/ir/graph.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace crucible::ir::detail {

/// A fault in a literal or a graph statement. line/column point at the
/// literal at fault (0 when unknown); the parser turns this into a
/// ParseError, the JSON reader into an IrError naming the field.
class BuildError : public std::runtime_error {
 public:
  BuildError(const std::string& message, int line = 0, int column = 0)
      : std::runtime_error(message), line(line), column(column) {}
  int line, column;
};

struct Literal {
  enum class Kind : uint8_t {
    None,
    Bool,
    Int,
    Float,
    String,  ///< s: the (unescaped) text
    Name,    ///< s: a dtype, layout, memory format or device word ("f32", "channels_last", "cuda:0")
    Value,   ///< s: a Value's name, without '%'
    List,    ///< items
  };
  Kind kind = Kind::None;
  /// Float: the value is a float32 (or narrower) tensor element, written with
  /// float precision. Set by tensor_data().
  bool single = false;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  ///< see Kind; for a parsed Float, its source text (read again as float32 if needed)
  std::vector<Literal> items;
  int line = 0, column = 0;  ///< where it was read (text form only)

  static Literal none() { return {}; }
  static Literal of_bool(bool v) {
    Literal l;
    l.kind = Kind::Bool;
    l.b = v;
    return l;
  }
  static Literal of_int(int64_t v) {
    Literal l;
    l.kind = Kind::Int;
    l.i = v;
    return l;
  }
  static Literal of_float(double v) {
    Literal l;
    l.kind = Kind::Float;
    l.f = v;
    return l;
  }
  static Literal of(Kind k, std::string s) {
    Literal l;
    l.kind = k;
    l.s = std::move(s);
    return l;
  }
};

/// "int 3", "a string", ... for error messages.
std::string describe(const Literal& l);

/// True for Tensor, Tensor?, Tensor[] and Tensor?[] schema types: their
/// arguments are Values, not constants.
bool is_tensor_slot(const c10::TypePtr& type);

/// An argument as a Literal; `formal` is its schema argument (its real_type
/// says whether an int is a dtype, layout or memory format). Throws IrError
/// for constants the text form cannot hold (tensors, generators, complex).
Literal literal_of(const Argument& a, const c10::Argument& formal);
/// The inverse: Values are looked up in `g` (a Value may also stand for a
/// whole non-tensor argument). Ints passed for float arguments become
/// floats. Throws BuildError.
Argument argument_of(const Literal& l, const c10::Argument& formal, const Graph& g);

/// A constant of type `type` as a Literal, and back (throw IrError / BuildError).
Literal literal_of(const c10::IValue& v, const c10::TypePtr& type);
c10::IValue ivalue_of(const Literal& l, const c10::TypePtr& type);

/// The type of a scalar constant node from its text-form name ("int",
/// "float[]", "Device", ...); nullptr for a type constant nodes cannot hold.
c10::TypePtr constant_type(std::string_view name);

/// A tensor's elements in row-major logical order: Bool, Int or Float
/// literals by dtype (float32 and narrower floats marked `single`). Throws
/// IrError for complex and quantized dtypes.
Literal tensor_data(const at::Tensor& t);
/// A tensor with metadata `meta` (strides, offset, device, requires_grad
/// included) holding `data` in row-major order; empty data for meta tensors.
/// Throws BuildError on a wrong element count or kind.
at::Tensor make_tensor(const Literal& data, const TensorMeta& meta);

/// Appends the shortest text that reads back as exactly `v` (as float32 when
/// `single`), always with a '.' or an exponent so it reads back as a float;
/// "nan", "inf", "-inf" for the non-finite values.
void append_float(std::string& out, double v, bool single);

}  // namespace crucible::ir::detail
