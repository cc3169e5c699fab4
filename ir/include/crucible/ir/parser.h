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
#pragma once

#include <crucible/ir/graph.h>

#include <string_view>

namespace crucible::ir {

/// Parses the text form. Operators are resolved in the dispatcher.
/// Throws ParseError (line and column of the fault, what was expected) on
/// malformed text, unknown operators, undefined or duplicate names.
Graph parse(std::string_view text);

}  // namespace crucible::ir
