// The text form of a graph: one node per line, names, dtypes and shapes.
// print(parse(print(g))) == print(g) for every graph (see parser.h).
#pragma once

#include <crucible/ir/graph.h>

#include <iosfwd>
#include <string>

namespace crucible::ir {

/// Writes `graph` in the text form (grammar in parser.h).
void print(const Graph& graph, std::ostream& os);
/// The text form as a string.
std::string to_text(const Graph& graph);

}  // namespace crucible::ir
