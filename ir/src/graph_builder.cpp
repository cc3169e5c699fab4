#include "graph_builder.h"

#include <crucible/ir/error.h>

#include <algorithm>
#include <cctype>

namespace crucible::ir::detail {

bool is_value_name(std::string_view name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
  });
}

void GraphBuilder::check_free(const ResultDecl& r) const {
  if (!is_value_name(r.name))
    throw BuildError("'" + r.name + "' is not a value name (letters, digits, '_' and '.')", r.line, r.column);
  if (g_.find_value(r.name)) throw BuildError("%" + r.name + " is defined twice", r.line, r.column);
}

void GraphBuilder::check_open(int line, int column, bool placeholder) {
  if (finished_) throw BuildError("nothing may follow the output (return) statement", line, column);
  if (placeholder && body_started_)
    throw BuildError("placeholders come before every other node; move this one up", line, column);
  if (!placeholder) body_started_ = true;
}

// Gives the results their declared names (add_call derived them from a
// hint) and checks the declared types against the schema's.
void GraphBuilder::name_results(Node* n, const std::vector<ResultDecl>& results, std::string_view what) {
  for (size_t k = 0; k < results.size(); ++k) {
    Value* v = n->result(k);
    const ResultDecl& d = results[k];
    if (v->name() != d.name) {
      if (Value* sibling = g_.find_value(d.name)) g_.rename(sibling, g_.unique_name(d.name + "_"));
      g_.rename(v, d.name);
    }
    if (v->is_tensor()) {
      if (d.meta) {
        v->set_meta(*d.meta);
      } else if (d.type != "Tensor") {
        throw BuildError("%" + d.name + " is a tensor (" + std::string(what) +
                             "): expected a tensor type such as f32[2, 3], or Tensor, not " + d.type,
                         d.line, d.column);
      }
    } else if (d.meta || d.type != v->type()->str()) {
      throw BuildError("%" + d.name + " has type " + v->type()->str() + " (" + std::string(what) + "), not " +
                           (d.meta ? to_string(*d.meta) : d.type),
                       d.line, d.column);
    }
  }
}

Node* GraphBuilder::placeholder(const ResultDecl& r, InputSpec spec, std::optional<Literal> duplicate_of) {
  check_open(r.line, r.column, true);
  check_free(r);
  if (!r.meta)
    throw BuildError("placeholder %" + r.name + " needs a tensor type with dtype and sizes, such as f32[2, 3]", r.line,
                     r.column);
  Value* v = g_.add_placeholder(r.name, *r.meta, std::move(spec));
  if (v->name() != r.name) g_.rename(v, r.name);
  const size_t index = placeholder_index_.size();
  placeholder_index_[v] = index;
  if (duplicate_of) duplicates_.emplace_back(index, std::move(*duplicate_of));
  return v->node();
}

Node* GraphBuilder::constant(const ResultDecl& r, const Literal& value) {
  check_open(r.line, r.column, false);
  check_free(r);
  Value* v;
  if (r.meta) {
    v = g_.add_constant(make_tensor(value, *r.meta), r.name);
  } else {
    const c10::TypePtr type = constant_type(r.type);
    if (!type)
      throw BuildError("constant %" + r.name + " of type " + r.type +
                           ": constants are tensors (f32[2, 3]) or int, float, bool, str, Device, NoneType, "
                           "int[], float[], bool[], str[]",
                       r.line, r.column);
    v = g_.add_constant(ivalue_of(value, type), r.name);
  }
  name_results(v->node(), {r}, "a constant");
  return v->node();
}

Node* GraphBuilder::call(const c10::OperatorHandle& op, std::vector<Argument> args,
                         const std::vector<ResultDecl>& results, int line, int column) {
  check_open(line, column, false);
  for (size_t k = 0; k < results.size(); ++k) {
    check_free(results[k]);
    for (size_t j = 0; j < k; ++j)
      if (results[j].name == results[k].name)
        throw BuildError("%" + results[k].name + " is defined twice", results[k].line, results[k].column);
  }
  const auto& returns = op.schema().returns();
  const bool has_list = std::any_of(returns.begin(), returns.end(), [](const c10::Argument& r) {
    auto list = r.type()->cast<c10::ListType>();
    return list && list->getElementType()->kind() == c10::TypeKind::TensorType;
  });
  const std::string target = operator_name(op);
  std::optional<size_t> list_size;
  if (has_list && results.size() + 1 >= returns.size()) {
    list_size = results.size() + 1 - returns.size();
  } else if (has_list || results.size() != returns.size()) {
    throw BuildError(target + " returns " + std::to_string(returns.size()) + " value(s)" +
                         (has_list ? " (one of them a Tensor[])" : "") + ", " + std::to_string(results.size()) +
                         " declared",
                     line, column);
  }
  Node* n;
  try {
    n = g_.add_call(op, std::move(args), list_size, results.empty() ? std::string_view() : results[0].name);
  } catch (const IrError& e) {
    throw BuildError(e.what(), line, column);
  }
  name_results(n, results, "a result of " + target);
  return n;
}

size_t GraphBuilder::placeholder_index(const Literal& l) const {
  if (l.kind == Literal::Kind::Int) {
    if (l.i < 0) throw BuildError("an input index must not be negative", l.line, l.column);
    return static_cast<size_t>(l.i);
  }
  Value* v = g_.find_value(l.s);
  if (!v) throw BuildError("undefined value %" + l.s, l.line, l.column);
  auto it = placeholder_index_.find(v);
  if (it == placeholder_index_.end()) throw BuildError("%" + l.s + " is not a placeholder", l.line, l.column);
  return it->second;
}

void GraphBuilder::output(const std::vector<OutputDecl>& outputs, int line, int column) {
  check_open(line, column, false);
  std::vector<Value*> values;
  std::vector<OutputSpec> specs;
  for (const OutputDecl& o : outputs) {
    Value* v = g_.find_value(o.value.s);
    if (!v) throw BuildError("undefined value %" + o.value.s, o.value.line, o.value.column);
    values.push_back(v);
    specs.push_back({o.kind, o.input ? std::optional<size_t>(placeholder_index(*o.input)) : std::nullopt});
  }
  g_.set_output(std::move(values));
  g_.signature().outputs = std::move(specs);
  finished_ = true;
}

void GraphBuilder::annotate(Node* n, std::string source, const std::vector<std::string>& tags) {
  n->set_source(std::move(source));
  for (const auto& t : tags) n->add_tag(t);
}

const c10::OperatorHandle& GraphBuilder::op(std::string_view name, int line, int column) {
  std::string key(name);
  auto it = ops_.find(key);
  if (it != ops_.end()) return it->second;
  try {
    return ops_.emplace(std::move(key), resolve_operator(name)).first->second;
  } catch (const IrError& e) {
    throw BuildError(e.what(), line, column);
  }
}

Graph GraphBuilder::finish() {
  for (const auto& [index, name] : duplicates_) g_.signature().inputs[index].duplicate_of = placeholder_index(name);
  return std::move(g_);
}

}  // namespace crucible::ir::detail
