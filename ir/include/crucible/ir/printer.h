// The text form of a graph: one node per line, names, dtypes and shapes.
// print(parse(print(g))) == print(g) for every graph (see parser.h).
#pragma once

#include <crucible/ir/graph.h>

#include <iosfwd>
#include <string>

namespace crucible::ir {

/// Writes `graph` in the text form (grammar in parser.h): every argument,
/// every result's type and metadata, the signature, sources and tags.
/// Throws IrError for what the text form cannot hold: a tensor or complex
/// constant inside an argument, a symbolic int, a Value name outside
/// [A-Za-z0-9_.]+, a signature index past the placeholders.
void print(const Graph& graph, std::ostream& os);
/// The text form as a string.
std::string to_text(const Graph& graph);

}  // namespace crucible::ir
