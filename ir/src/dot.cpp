#include <crucible/ir/dot.h>

#include <ostream>
#include <sstream>
#include <unordered_map>

namespace crucible::ir {

namespace {

// A DOT string literal's body: quotes and backslashes escaped, so `\n`
// line breaks are the only escapes Graphviz sees.
std::string escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c == '\n' ? ' ' : c;
  }
  return out;
}

std::string type_of(const Value* v) {
  if (!v->is_tensor()) return v->type()->str();
  return v->has_meta() ? to_string(v->meta()) : "Tensor";
}

std::string label(const Graph& g, const Node* n, size_t placeholder_index) {
  std::string l;
  for (const auto& r : n->results()) l += escape("%" + r->name() + " : " + type_of(r.get())) + "\\n";
  switch (n->kind()) {
    case NodeKind::Placeholder: {
      l += "placeholder";
      if (placeholder_index < g.signature().inputs.size()) {
        const InputSpec& spec = g.signature().inputs[placeholder_index];
        l += " (" + std::string(to_string(spec.kind));
        if (!spec.target.empty()) l += " " + escape(spec.target);
        l += ")";
      }
      break;
    }
    case NodeKind::Call:
      l += escape(n->target());
      break;
    case NodeKind::Constant:
      l += "constant";
      break;
    case NodeKind::Output:
      l += "output";
      break;
  }
  if (!n->tags().empty()) {
    l += "\\n[";
    for (size_t i = 0; i < n->tags().size(); ++i) l += (i ? ", " : "") + escape(n->tags()[i]);
    l += "]";
  }
  return l;
}

std::string_view style(const Node* n) {
  switch (n->kind()) {
    case NodeKind::Placeholder:
      return "shape=invhouse, fillcolor=\"#d9ead3\"";
    case NodeKind::Constant:
      return "shape=note, fillcolor=\"#fff2cc\"";
    case NodeKind::Output:
      return "shape=house, fillcolor=\"#d9d2e9\"";
    case NodeKind::Call:
      break;
  }
  return n->has_tag("backward") ? "fillcolor=\"#f4cccc\", color=\"#cc0000\", penwidth=2" : "fillcolor=\"#cfe2f3\"";
}

}  // namespace

void to_dot(const Graph& graph, std::ostream& os) {
  os << "digraph crucible {\n"
        "  rankdir=TB;\n"
        "  node [shape=box, style=\"rounded,filled\", fontname=\"monospace\", fontsize=10];\n"
        "  edge [fontname=\"monospace\", fontsize=9];\n";
  std::unordered_map<const Node*, size_t> ids;
  size_t placeholders = 0;
  for (const Node* n : graph.nodes()) {
    const size_t id = ids.size();
    ids[n] = id;
    os << "  n" << id << " [label=\"" << label(graph, n, n->is_placeholder() ? placeholders++ : 0) << "\", "
       << style(n);
    if (!n->source().empty()) os << ", tooltip=\"" << escape(n->source()) << "\"";
    os << "];\n";
  }
  for (const Node* n : graph.nodes())
    for (const Value* v : n->inputs()) {
      os << "  n" << ids.at(v->node()) << " -> n" << ids.at(n);
      if (v->node()->num_results() > 1) os << " [label=\"" << escape(v->name()) << "\"]";
      os << ";\n";
    }
  os << "}\n";
}

std::string to_dot(const Graph& graph) {
  std::ostringstream os;
  to_dot(graph, os);
  return os.str();
}

}  // namespace crucible::ir
