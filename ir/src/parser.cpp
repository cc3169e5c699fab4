#include <crucible/ir/error.h>
#include <crucible/ir/parser.h>

#include "graph_builder.h"
#include "literal.h"
#include "text_lexer.h"

#include <charconv>

namespace crucible::ir {

namespace {

using detail::BuildError;
using detail::Literal;
using detail::Token;

class Parser {
 public:
  explicit Parser(std::string_view text) : toks_(detail::tokenize(text)) {}

  Graph run() {
    try {
      while (true) {
        while (peek().kind == Token::Kind::Newline) ++pos_;
        if (peek().kind == Token::Kind::End) break;
        statement();
      }
      return b_.finish();
    } catch (const BuildError& e) {
      const Token& s = stmt_ ? *stmt_ : peek();
      throw ParseError(e.line ? e.line : s.line, e.line ? e.column : s.column, e.what());
    } catch (const c10::Error& e) {  // a kernel refusing a constant's layout, say
      const Token& s = stmt_ ? *stmt_ : peek();
      throw ParseError(s.line, s.column, e.what_without_backtrace());
    }
  }

 private:
  const Token& peek(size_t k = 0) const { return toks_[std::min(pos_ + k, toks_.size() - 1)]; }
  const Token& next() {
    const Token& t = peek();
    if (t.kind != Token::Kind::End) ++pos_;
    return t;
  }
  [[noreturn]] static void fail(const Token& at, const std::string& msg) { throw ParseError(at.line, at.column, msg); }
  static std::string show(const Token& t) {
    switch (t.kind) {
      case Token::Kind::End:
        return "the end of the text";
      case Token::Kind::Newline:
        return "the end of the line";
      case Token::Kind::Name:
        return "'%" + std::string(t.text) + "'";
      case Token::Kind::String:
        return "a string";
      default:
        return "'" + std::string(t.text) + "'";
    }
  }
  const Token& expect(char p) {
    if (!peek().is(p)) fail(peek(), std::string("expected '") + p + "', got " + show(peek()));
    return next();
  }
  const Token& expect(Token::Kind kind, const char* what) {
    if (peek().kind != kind) fail(peek(), std::string("expected ") + what + ", got " + show(peek()));
    return next();
  }
  bool accept(char p) {
    if (!peek().is(p)) return false;
    ++pos_;
    return true;
  }
  // `key=` ahead?
  bool at_keyword() const { return peek().kind == Token::Kind::Ident && peek(1).is('='); }
  static Literal at(Literal l, const Token& t) {
    l.line = t.line;
    l.column = t.column;
    return l;
  }

  int64_t integer(const Token& t) {
    int64_t v = 0;
    auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
    if (r.ec != std::errc() || r.ptr != t.text.data() + t.text.size())
      fail(t, "integer out of range: " + std::string(t.text));
    return v;
  }

  // --- statements -------------------------------------------------------------------

  void statement() {
    stmt_ = &peek();
    Node* n;
    if (peek().is_ident("return")) {
      n = output();
    } else if (peek().kind == Token::Kind::OpName) {
      n = call({});
    } else if (peek().kind == Token::Kind::Name) {
      std::vector<detail::ResultDecl> results;
      do results.push_back(result_decl());
      while (accept(','));
      expect('=');
      const Token& rhs = peek();
      if (rhs.is_ident("placeholder") || rhs.is_ident("constant")) {
        if (results.size() != 1) fail(rhs, std::string(rhs.text) + " defines exactly one value");
        n = rhs.is_ident("placeholder") ? placeholder(results[0]) : constant(results[0]);
      } else if (rhs.kind == Token::Kind::OpName) {
        n = call(results);
      } else {
        fail(rhs, "expected placeholder(...), constant(...) or an operator such as aten::add.Tensor, got " + show(rhs));
      }
    } else {
      fail(peek(), "expected a statement (%name : type = ..., an operator call, or return (...)), got " + show(peek()));
    }
    if (peek().is('{')) node_meta(n);
    if (peek().kind != Token::Kind::Newline && peek().kind != Token::Kind::End)
      fail(peek(), "expected the end of the line, got " + show(peek()));
  }

  detail::ResultDecl result_decl() {
    const Token& name = expect(Token::Kind::Name, "a value name (%name)");
    detail::ResultDecl r{std::string(name.text), std::nullopt, {}, name.line, name.column};
    expect(':');
    const Token& type = expect(Token::Kind::Ident, "a type (f32[2, 3], Tensor, int, ...)");
    if (auto dtype = dtype_from_short_name(type.text)) {
      r.meta = tensor_type(*dtype);
      return r;
    }
    if (peek().is('[') && !peek(1).is(']'))
      fail(type, "unknown dtype '" + std::string(type.text) +
                     "'; dtypes are f32, f64, f16, bf16, i64, i32, i16, i8, u8, u16, u32, u64, b8, c64, c128, "
                     "f8e4m3fn, f8e5m2");
    r.type = type.text;
    while (true) {  // suffixes: int[], Tensor?
      if (peek().is('[') && peek(1).is(']')) {
        pos_ += 2;
        r.type += "[]";
      } else if (accept('?')) {
        r.type += '?';
      } else {
        return r;
      }
    }
  }

  std::vector<int64_t> int_list() {
    std::vector<int64_t> v;
    expect('[');
    if (accept(']')) return v;
    do v.push_back(integer(expect(Token::Kind::Int, "an integer")));
    while (accept(','));
    expect(']');
    return v;
  }

  // dtype[sizes] stride=[...] offset=N @device grad, the attributes in any order.
  TensorMeta tensor_type(c10::ScalarType dtype) {
    TensorMeta m;
    m.dtype = dtype;
    m.sizes = int_list();
    bool strides = false;
    while (true) {
      const Token& t = peek();
      if (t.is_ident("stride") && peek(1).is('=')) {
        pos_ += 2;
        m.strides = int_list();
        strides = true;
        if (m.strides.size() != m.sizes.size())
          fail(t,
               "stride has " + std::to_string(m.strides.size()) + " entries, sizes " + std::to_string(m.sizes.size()));
      } else if (t.is_ident("offset") && peek(1).is('=')) {
        pos_ += 2;
        m.storage_offset = integer(expect(Token::Kind::Int, "an integer offset"));
      } else if (accept('@')) {
        m.device = device(expect(Token::Kind::Ident, "a device (cpu, cuda:0, ...)"));
      } else if (t.is_ident("grad")) {
        ++pos_;
        m.requires_grad = true;
      } else {
        break;
      }
    }
    if (!strides) m.strides = contiguous_strides(m.sizes);
    return m;
  }

  // The device word `t`, with `:index` if it follows.
  std::string device_word(const Token& t) {
    std::string s(t.text);
    if (peek().is(':') && peek(1).kind == Token::Kind::Int) {
      s += ':';
      s += peek(1).text;
      pos_ += 2;
    }
    return s;
  }
  c10::Device device(const Token& t) {
    const std::string s = device_word(t);
    try {
      return c10::Device(s);
    } catch (const c10::Error&) {
      fail(t, "bad device '" + s + "' (cpu, cuda, cuda:0, meta, ...)");
    }
  }

  Node* placeholder(const detail::ResultDecl& r) {
    ++pos_;
    expect('(');
    InputSpec spec;
    std::optional<Literal> duplicate_of;
    if (!accept(')')) {
      do {
        if (!at_keyword()) fail(peek(), "expected kind=, target= or duplicate_of=, got " + show(peek()));
        const Token& key = next();
        ++pos_;
        if (key.text == "kind") {
          const Token& k = expect(Token::Kind::Ident, "an input kind");
          auto kind = input_kind_from_string(k.text);
          if (!kind)
            fail(k, "unknown input kind '" + std::string(k.text) +
                        "'; kinds are user_input, parameter, buffer, tangent, state");
          spec.kind = *kind;
        } else if (key.text == "target") {
          spec.target = detail::unescape(expect(Token::Kind::String, "a string"));
        } else if (key.text == "duplicate_of") {
          const Token& v = expect(Token::Kind::Name, "a placeholder (%name)");
          duplicate_of = at(Literal::of(Literal::Kind::Value, std::string(v.text)), v);
        } else {
          fail(key, "placeholder() takes kind=, target= and duplicate_of=, not " + std::string(key.text) + "=");
        }
      } while (accept(','));
      expect(')');
    }
    return b_.placeholder(r, std::move(spec), std::move(duplicate_of));
  }

  Node* constant(const detail::ResultDecl& r) {
    ++pos_;
    expect('(');
    Literal value = peek().is(')') ? at(Literal::none(), peek()) : literal();
    expect(')');
    return b_.constant(r, value);
  }

  Node* call(const std::vector<detail::ResultDecl>& results) {
    const Token& op_tok = next();
    const c10::OperatorHandle& op = b_.op(op_tok.text, op_tok.line, op_tok.column);
    const auto& schema = op.schema();
    const auto& formals = schema.arguments();
    std::vector<std::optional<Argument>> given(formals.size());
    auto convert = [&](size_t i) {
      const Literal l = literal();
      try {
        given[i] = detail::argument_of(l, formals[i], b_.graph());
      } catch (const BuildError& e) {
        throw BuildError(std::string(op_tok.text) + ": " + e.what(), e.line, e.column);
      }
    };
    expect('(');
    size_t positional = 0;
    bool keywords = false;
    if (!peek().is(')')) {
      do {
        const Token& t = peek();
        if (at_keyword()) {
          keywords = true;
          pos_ += 2;
          size_t i = 0;
          while (i < formals.size() && formals[i].name() != t.text) ++i;
          if (i == formals.size())
            fail(t, std::string(op_tok.text) + " has no argument '" + std::string(t.text) + "' (" + toString(schema) +
                        ")");
          if (given[i]) fail(t, "argument '" + std::string(t.text) + "' is given twice");
          convert(i);
        } else {
          if (keywords) fail(t, "a positional argument after a keyword argument");
          if (positional == formals.size() || formals[positional].kwarg_only())
            fail(t, "too many positional arguments: " + std::string(op_tok.text) + " takes " +
                        std::to_string(positional) + " (" + toString(schema) +
                        "); pass keyword-only ones as name=value");
          convert(positional++);
        }
      } while (accept(','));
    }
    const Token& close = expect(')');
    std::vector<Argument> args;
    args.reserve(formals.size());
    for (size_t i = 0; i < formals.size(); ++i) {
      if (given[i]) {
        args.push_back(std::move(*given[i]));
      } else if (formals[i].default_value()) {
        args.emplace_back(*formals[i].default_value());
      } else {
        fail(close,
             std::string(op_tok.text) + ": missing argument '" + formals[i].name() + "' (" + toString(schema) + ")");
      }
    }
    return b_.call(op, std::move(args), results, op_tok.line, op_tok.column);
  }

  Node* output() {
    const Token& ret = next();
    expect('(');
    std::vector<detail::OutputDecl> outs;
    if (!peek().is(')')) {
      do {
        const Token& v = expect(Token::Kind::Name, "an output value (%name)");
        detail::OutputDecl o{at(Literal::of(Literal::Kind::Value, std::string(v.text)), v), OutputKind::UserOutput, {}};
        if (accept(':')) {
          const Token& k = expect(Token::Kind::Ident, "an output kind");
          auto kind = output_kind_from_string(k.text);
          if (!kind)
            fail(k, "unknown output kind '" + std::string(k.text) +
                        "'; kinds are user_output, loss, gradient, mutated_input, mutated_input_metadata, saved_value");
          o.kind = *kind;
          if (accept('(')) {
            // %name, or an index (a backward graph's gradient names a primal of its forward graph).
            if (peek().kind == Token::Kind::Int) {
              const Token& in = next();
              o.input = at(Literal::of_int(std::stoll(std::string(in.text))), in);
            } else {
              const Token& in = expect(Token::Kind::Name, "the placeholder it refers to (%name, or an index)");
              o.input = at(Literal::of(Literal::Kind::Value, std::string(in.text)), in);
            }
            expect(')');
          }
        }
        outs.push_back(std::move(o));
      } while (accept(','));
    }
    expect(')');
    b_.output(outs, ret.line, ret.column);
    return b_.graph().output_node();
  }

  // {source="...", tags=[a, "b c"]}
  void node_meta(Node* n) {
    expect('{');
    std::string source;
    std::vector<std::string> tags;
    do {
      if (!at_keyword()) fail(peek(), "expected source= or tags=, got " + show(peek()));
      const Token& key = next();
      ++pos_;
      if (key.text == "source") {
        source = detail::unescape(expect(Token::Kind::String, "a string"));
      } else if (key.text == "tags") {
        expect('[');
        if (!peek().is(']')) {
          do {
            const Token& t = next();
            if (t.kind == Token::Kind::Ident)
              tags.emplace_back(t.text);
            else if (t.kind == Token::Kind::String)
              tags.push_back(detail::unescape(t));
            else
              fail(t, "expected a tag (a name or a string), got " + show(t));
          } while (accept(','));
        }
        expect(']');
      } else {
        fail(key, "expected source= or tags=, got " + std::string(key.text) + "=");
      }
    } while (accept(','));
    expect('}');
    b_.annotate(n, std::move(source), tags);
  }

  // --- literals -----------------------------------------------------------------------

  Literal literal() {
    const Token& t = next();
    switch (t.kind) {
      case Token::Kind::Name:
        return at(Literal::of(Literal::Kind::Value, std::string(t.text)), t);
      case Token::Kind::Int:
        return at(Literal::of_int(integer(t)), t);
      case Token::Kind::Float: {
        double v = 0;
        auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (r.ec != std::errc() || r.ptr != t.text.data() + t.text.size())
          fail(t, "float out of range: " + std::string(t.text));
        Literal l = at(Literal::of_float(v), t);
        l.s = t.text;
        return l;
      }
      case Token::Kind::String:
        return at(Literal::of(Literal::Kind::String, detail::unescape(t)), t);
      case Token::Kind::Ident:
        if (t.text == "None") return at(Literal::none(), t);
        if (t.text == "True" || t.text == "False") return at(Literal::of_bool(t.text == "True"), t);
        return at(Literal::of(Literal::Kind::Name, device_word(t)), t);
      case Token::Kind::Punct:
        if (t.punct == '[') {
          Literal l = at(Literal(), t);
          l.kind = Literal::Kind::List;
          if (!accept(']')) {
            do l.items.push_back(literal());
            while (accept(','));
            expect(']');
          }
          return l;
        }
        [[fallthrough]];
      default:
        fail(t, "expected an argument (%name, a number, True, False, None, a string, a name or [...]), got " + show(t));
    }
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  const Token* stmt_ = nullptr;
  detail::GraphBuilder b_;
};

}  // namespace

Graph parse(std::string_view text) { return Parser(text).run(); }

}  // namespace crucible::ir
