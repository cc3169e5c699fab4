// Graphviz DOT export of a graph, for looking at it (`dot -Tsvg g.dot`),
// like torch.fx.passes.graph_drawer.FxGraphDrawer.
#pragma once

#include <crucible/ir/graph.h>

#include <iosfwd>
#include <string>

namespace crucible::ir {

/// Writes `graph` as a DOT digraph, top to bottom in graph order. Every node
/// is a box labelled with its results (`%name : f32[2, 3]`), its op
/// (`aten::add.Tensor`; `placeholder` with the input kind and target;
/// `constant`; `output`) and its tags. Placeholders, constants and the output
/// have shapes of their own; nodes tagged `backward` are filled red, the rest
/// of the calls blue. One edge per use, from the producing node to the user,
/// labelled with the result's name when the producer has several.
void to_dot(const Graph& graph, std::ostream& os);
/// The same, as a string.
std::string to_dot(const Graph& graph);

}  // namespace crucible::ir
