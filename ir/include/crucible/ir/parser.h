// Reads the text form that printer.h writes.
//
// Grammar (one statement per line; blank lines and lines starting with '#'
// are ignored):
//
//   %x : f32[8, 16] = placeholder()
//   %w : f32[16, 16] grad = placeholder(kind=parameter, target="fc.weight")
//   %c : f32[3] = constant([1.0, 2.0, 3.0])
//   %add : f32[8, 16] = aten::add.Tensor(%x, %w, alpha=1) {source="fc", tags=[backward]}
//   %a : f32[4, 6], %b : f32[4, 1], %c_1 : f32[4, 1] = aten::native_layer_norm(%x, [6], None, None, 1e-05)
//   return (%add, %loss : loss, %gw : gradient(%w))
//
// A tensor type is `dtype[sizes]` followed, where they differ from the
// defaults, by `stride=[...]`, `offset=N`, `@device`, `grad`. Positional
// schema arguments print bare, keyword-only ones as `name=value`.
//
// The details the examples leave open:
// - Names: `%` then [A-Za-z0-9_.]+. Each is defined once; a use must follow
//   its definition.
// - Result types: a tensor type as above (its attributes may come in any
//   order), `Tensor` for a tensor result without metadata (an output a
//   backward op did not compute), or the c10 type's name for other results
//   (`%n : int = aten::sym_size.int(%x, 0)`), checked against the schema.
//   A Tensor[] return takes as many results as are declared after the
//   schema's other returns; an op that returns nothing is written without
//   `%... =`.
// - Placeholders come first and take `kind=` (user_input when left out),
//   `target="..."` and `duplicate_of=%name` (another placeholder).
// - Arguments: positional ones in schema order, then `name=value` for any
//   argument (keyword-only ones must be given so); arguments left out take
//   the schema's default. The printer writes every argument.
// - Constants: ints `-3`; floats `0.5`, `1e-05`, `nan`, `inf`, `-inf` (the
//   printer writes the shortest text that reads back exactly, always with a
//   '.' or an exponent); `True`/`False`; `None`; strings in double quotes
//   with \" \\ \n \t \r \xHH escapes; lists `[1, 2]`. The schema's type says
//   what a word means: a dtype (`f32`), a layout (`strided`, `sparse_coo`,
//   ...), a memory format (`contiguous_format`, `channels_last`, ...) or a
//   device (`cpu`, `cuda:0`). An int given for a float argument reads as a
//   float; a Scalar keeps int vs float vs bool. Tensor?[] lists hold `None`
//   entries; a `%value` may also stand for a whole non-tensor argument.
// - Constant nodes: a tensor's elements in row-major order as one flat list
//   (exact for every float dtype: float32 and narrower print as float32;
//   bool as True/False), laid out with the declared strides and offset;
//   `constant()` for a tensor on the meta device. Scalar constant nodes are
//   typed int, float, bool, str, Device, NoneType, int[], float[], bool[] or
//   str[].
// - Any statement may end with `{source="...", tags=[name, "any text"]}`.
// - `return (...)` is the last statement; each output may carry `: kind` or
//   `: kind(%placeholder)` (the input a gradient or mutation refers to).
// - '#' starts a comment anywhere outside a string.
#pragma once

#include <crucible/ir/graph.h>

#include <string_view>

namespace crucible::ir {

/// Parses the text form. Operators are resolved in the dispatcher.
/// Throws ParseError (line and column of the fault, what was expected) on
/// malformed text, unknown operators (with resolve_operator's message),
/// undefined or duplicate names, bad dtypes or devices, wrong argument counts
/// or kinds, result counts that do not match the schema, and tensor
/// constants whose data does not match their type.
Graph parse(std::string_view text);

}  // namespace crucible::ir
