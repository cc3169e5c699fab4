// Builds a Graph from declarations that carry the exact names, types and
// signature the text and JSON forms record. The parser and the JSON reader
// share it, so both read a graph back the same way.
#pragma once

#include "literal.h"

#include <crucible/ir/graph.h>

#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace crucible::ir::detail {

/// True for names the text form can write after '%': [A-Za-z0-9_.]+.
bool is_value_name(std::string_view name);

/// A result as declared: `%name : f32[2, 3]` (meta), `%t : Tensor` or
/// `%n : int` (type).
struct ResultDecl {
  std::string name;
  std::optional<TensorMeta> meta;
  std::string type;  ///< when there is no meta: "Tensor", "int", "float[]", ...
  int line = 0, column = 0;
};

/// One graph output: a Value, its kind, and the placeholder it refers to.
struct OutputDecl {
  Literal value;  ///< Kind::Value
  OutputKind kind = OutputKind::UserOutput;
  std::optional<Literal> input;  ///< Kind::Value naming a placeholder
};

/// Every method throws BuildError (with the line/column of the declaration
/// or literal at fault, where known).
class GraphBuilder {
 public:
  /// Placeholders come before every other node. `duplicate_of` names a
  /// placeholder (earlier or later).
  Node* placeholder(const ResultDecl& r, InputSpec spec, std::optional<Literal> duplicate_of);
  /// A tensor constant (r has meta; `value` its data, or None for a meta
  /// tensor) or a scalar one (r.type names its type; see constant_type).
  Node* constant(const ResultDecl& r, const Literal& value);
  /// A call of `op` with every schema argument given; `results` must match the
  /// schema's returns (a Tensor[] return takes all the names left over).
  Node* call(const c10::OperatorHandle& op, std::vector<Argument> args, const std::vector<ResultDecl>& results,
             int line, int column);
  void output(const std::vector<OutputDecl>& outputs, int line, int column);
  void annotate(Node* n, std::string source, const std::vector<std::string>& tags);

  /// Resolves an operator (cached). Throws BuildError with resolve_operator's message.
  const c10::OperatorHandle& op(std::string_view name, int line, int column);
  const Graph& graph() const { return g_; }
  /// The graph, once every statement is in.
  Graph finish();

 private:
  void check_free(const ResultDecl& r) const;
  void check_open(int line, int column, bool placeholder);
  void name_results(Node* n, const std::vector<ResultDecl>& results, std::string_view what);
  size_t placeholder_index(const Literal& l) const;

  Graph g_;
  bool body_started_ = false;
  bool finished_ = false;
  std::vector<std::pair<size_t, Literal>> duplicates_;
  std::unordered_map<const Value*, size_t> placeholder_index_;
  std::unordered_map<std::string, c10::OperatorHandle> ops_;
};

}  // namespace crucible::ir::detail
