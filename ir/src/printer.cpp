#include <crucible/ir/error.h>
#include <crucible/ir/printer.h>

#include "graph_builder.h"
#include "literal.h"
#include "text_lexer.h"

#include <cctype>
#include <charconv>
#include <ostream>

namespace crucible::ir {

namespace {

using detail::Literal;

void append_int(std::string& out, int64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void write_literal(std::string& out, const Literal& l) {
  switch (l.kind) {
    case Literal::Kind::None:
      out += "None";
      break;
    case Literal::Kind::Bool:
      out += l.b ? "True" : "False";
      break;
    case Literal::Kind::Int:
      append_int(out, l.i);
      break;
    case Literal::Kind::Float:
      detail::append_float(out, l.f, l.single);
      break;
    case Literal::Kind::String:
      detail::append_quoted(out, l.s);
      break;
    case Literal::Kind::Name:
      out += l.s;
      break;
    case Literal::Kind::Value:
      out += '%';
      out += l.s;
      break;
    case Literal::Kind::List:
      out += '[';
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i) out += ", ";
        write_literal(out, l.items[i]);
      }
      out += ']';
      break;
  }
}

bool is_identifier(std::string_view s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

void write_value(std::string& out, const Value* v) {
  out += '%';
  out += v->name();
}

void write_result(std::string& out, const Value* v) {
  if (!detail::is_value_name(v->name()))
    throw IrError("value '" + v->name() + "' cannot be printed: the text form's names are [A-Za-z0-9_.]+; rename it");
  write_value(out, v);
  out += " : ";
  if (!v->is_tensor()) {
    out += v->type()->str();
  } else if (v->has_meta()) {
    out += to_string(v->meta());
  } else {
    out += "Tensor";
  }
}

class Printer {
 public:
  explicit Printer(const Graph& g) : g_(g), placeholders_(g.placeholders()) {}

  std::string run() {
    std::string out;
    out.reserve(g_.num_nodes() * 80);
    for (Node* n : g_.nodes()) node(out, n);
    return out;
  }

 private:
  const Value* placeholder(size_t index) const {
    if (index >= placeholders_.size())
      throw IrError("the signature refers to placeholder " + std::to_string(index) + ", the graph has " +
                    std::to_string(placeholders_.size()));
    return placeholders_[index];
  }

  void node(std::string& out, const Node* n) {
    for (size_t k = 0; k < n->num_results(); ++k) {
      if (k) out += ", ";
      write_result(out, n->result(k));
    }
    if (n->num_results()) out += " = ";
    switch (n->kind()) {
      case NodeKind::Placeholder:
        placeholder_call(out);
        break;
      case NodeKind::Constant:
        constant(out, n);
        break;
      case NodeKind::Call:
        call(out, n);
        break;
      case NodeKind::Output:
        output(out, n);
        break;
    }
    if (!n->source().empty() || !n->tags().empty()) {
      out += " {";
      if (!n->source().empty()) {
        out += "source=";
        detail::append_quoted(out, n->source());
        if (!n->tags().empty()) out += ", ";
      }
      if (!n->tags().empty()) {
        out += "tags=[";
        for (size_t i = 0; i < n->tags().size(); ++i) {
          if (i) out += ", ";
          const auto& t = n->tags()[i];
          if (is_identifier(t))
            out += t;
          else
            detail::append_quoted(out, t);
        }
        out += ']';
      }
      out += '}';
    }
    out += '\n';
  }

  void placeholder_call(std::string& out) {
    const size_t index = next_placeholder_++;
    if (index >= g_.signature().inputs.size())
      throw IrError("the signature has no InputSpec for placeholder " + std::to_string(index));
    const InputSpec& spec = g_.signature().inputs[index];
    out += "placeholder(";
    const char* sep = "";
    if (spec.kind != InputKind::UserInput) {
      out += "kind=";
      out += to_string(spec.kind);
      sep = ", ";
    }
    if (!spec.target.empty()) {
      out += sep;
      out += "target=";
      detail::append_quoted(out, spec.target);
      sep = ", ";
    }
    if (spec.duplicate_of) {
      out += sep;
      out += "duplicate_of=";
      write_value(out, placeholder(*spec.duplicate_of));
    }
    out += ')';
  }

  void constant(std::string& out, const Node* n) {
    const c10::IValue& c = n->constant_value();
    out += "constant(";
    if (!c.isTensor()) {
      write_literal(out, detail::literal_of(c, n->result()->type()));
    } else if (!c.toTensor().is_meta()) {  // meta tensors have no data to print
      write_literal(out, detail::tensor_data(c.toTensor()));
    }
    out += ')';
  }

  void call(std::string& out, const Node* n) {
    out += n->target();
    out += '(';
    const auto& formals = n->schema().arguments();
    for (size_t i = 0; i < n->args().size(); ++i) {
      if (i) out += ", ";
      if (formals[i].kwarg_only()) {
        out += formals[i].name();
        out += '=';
      }
      try {
        write_literal(out, detail::literal_of(n->arg(i), formals[i]));
      } catch (const IrError& e) {
        throw IrError(n->target() + " (%" + (n->num_results() ? n->result()->name() : std::string("?")) +
                      "): " + e.what());
      }
    }
    out += ')';
  }

  void output(std::string& out, const Node* n) {
    const auto& specs = g_.signature().outputs;
    out += "return (";
    for (size_t i = 0; i < n->args().size(); ++i) {
      if (i) out += ", ";
      write_value(out, n->arg(i).value());
      const OutputSpec spec = i < specs.size() ? specs[i] : OutputSpec{};
      if (spec.kind == OutputKind::UserOutput && !spec.input_index) continue;
      out += " : ";
      out += to_string(spec.kind);
      if (spec.input_index) {
        // A backward graph's gradient names a primal of the forward graph,
        // not one of its own placeholders (saved values and tangents): by index.
        const size_t i = *spec.input_index;
        const auto& inputs = g_.signature().inputs;
        const bool own =
            i < inputs.size() && inputs[i].kind != InputKind::Tangent && inputs[i].kind != InputKind::SavedValue;
        out += '(';
        if (own)
          write_value(out, placeholder(i));
        else
          out += std::to_string(i);
        out += ')';
      }
    }
    out += ')';
  }

  const Graph& g_;
  std::vector<Value*> placeholders_;
  size_t next_placeholder_ = 0;
};

}  // namespace

std::string to_text(const Graph& graph) { return Printer(graph).run(); }

void print(const Graph& graph, std::ostream& os) {
  const std::string text = to_text(graph);
  os.write(text.data(), static_cast<std::streamsize>(text.size()));
}

}  // namespace crucible::ir
