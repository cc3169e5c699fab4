#include "text_lexer.h"

#include <crucible/ir/error.h>

#include <cstring>

namespace crucible::ir::detail {

namespace {

bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alnum(char c) { return is_alpha(c) || is_digit(c); }
int hex_digit(char c) {
  if (is_digit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  explicit Lexer(std::string_view s) : s_(s) {}

  std::vector<Token> run() {
    std::vector<Token> out;
    out.reserve(s_.size() / 3);
    while (true) {
      skip_blanks();
      Token t;
      t.line = line_;
      t.column = static_cast<int>(i_ - line_start_) + 1;
      if (i_ == s_.size()) {
        out.push_back(t);
        return out;
      }
      const size_t start = i_;
      const char c = s_[i_];
      if (c == '\n') {
        t.kind = Token::Kind::Newline;
        ++i_;
        ++line_;
        line_start_ = i_;
      } else if (c == '%') {
        ++i_;
        while (i_ < s_.size() && (is_alnum(s_[i_]) || s_[i_] == '.')) ++i_;
        if (i_ == start + 1) fail(t, "expected a value name after '%'");
        t.kind = Token::Kind::Name;
        t.text = s_.substr(start + 1, i_ - start - 1);
        out.push_back(t);
        continue;
      } else if (is_alpha(c)) {
        while (i_ < s_.size() && is_alnum(s_[i_])) ++i_;
        t.kind = Token::Kind::Ident;
        if (s_.compare(i_, 2, "::") == 0) {  // ns::name.overload
          i_ += 2;
          const size_t name = i_;
          while (i_ < s_.size() && (is_alnum(s_[i_]) || s_[i_] == '.')) ++i_;
          if (i_ == name) fail(t, "expected an operator name after '::'");
          t.kind = Token::Kind::OpName;
        }
        t.text = s_.substr(start, i_ - start);
        if (t.text == "inf" || t.text == "nan") t.kind = Token::Kind::Float;
      } else if (is_digit(c) || ((c == '-' || c == '.') && i_ + 1 < s_.size() &&
                                 (is_digit(s_[i_ + 1]) || s_[i_ + 1] == '.' || s_.compare(i_ + 1, 3, "inf") == 0))) {
        number(t);
      } else if (c == '"') {
        string(t);
      } else if (std::strchr("()[]{},:=@?", c) && c != '\0') {
        t.kind = Token::Kind::Punct;
        t.punct = c;
        ++i_;
        t.text = s_.substr(start, 1);
      } else {
        std::string msg = "unexpected character '";  // built stepwise: GCC 12 misreads operator+ here
        msg += c;
        msg += '\'';
        fail(t, msg);
      }
      out.push_back(t);
    }
  }

 private:
  [[noreturn]] void fail(const Token& at, const std::string& msg) { throw ParseError(at.line, at.column, msg); }

  void skip_blanks() {
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == ' ' || c == '\t' || c == '\r') {
        ++i_;
      } else if (c == '#') {
        while (i_ < s_.size() && s_[i_] != '\n') ++i_;
      } else {
        return;
      }
    }
  }

  // -?digits[.digits][e[+-]digits], or -inf. The parser converts (and
  // range-checks) the text.
  void number(Token& t) {
    const size_t start = i_;
    bool is_float = false;
    if (s_[i_] == '-') ++i_;
    if (s_.compare(i_, 3, "inf") == 0) {
      i_ += 3;
      is_float = true;
    } else {
      while (i_ < s_.size() && is_digit(s_[i_])) ++i_;
      if (i_ < s_.size() && s_[i_] == '.') {
        is_float = true;
        ++i_;
        while (i_ < s_.size() && is_digit(s_[i_])) ++i_;
      }
      if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
        is_float = true;
        ++i_;
        if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
        const size_t digits = i_;
        while (i_ < s_.size() && is_digit(s_[i_])) ++i_;
        if (i_ == digits) fail(t, "malformed number: expected digits after the exponent");
      }
    }
    if (i_ < s_.size() && is_alpha(s_[i_]))
      fail(t, "malformed number '" + std::string(s_.substr(start, i_ + 1 - start)) + "'");
    t.kind = is_float ? Token::Kind::Float : Token::Kind::Int;
    t.text = s_.substr(start, i_ - start);
  }

  void string(Token& t) {
    const size_t start = ++i_;
    while (i_ < s_.size() && s_[i_] != '"' && s_[i_] != '\n') i_ += s_[i_] == '\\' && i_ + 1 < s_.size() ? 2 : 1;
    if (i_ >= s_.size() || s_[i_] != '"') fail(t, "unterminated string: expected a closing '\"' on the same line");
    t.kind = Token::Kind::String;
    t.text = s_.substr(start, i_ - start);
    ++i_;
  }

  std::string_view s_;
  size_t i_ = 0;
  size_t line_start_ = 0;
  int line_ = 1;
};

}  // namespace

std::vector<Token> tokenize(std::string_view text) { return Lexer(text).run(); }

std::string unescape(const Token& t) {
  std::string out;
  out.reserve(t.text.size());
  const auto& s = t.text;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      out += s[i];
      continue;
    }
    const char e = s[++i];  // the lexer never ends a string on a lone backslash
    switch (e) {
      case '"':
        out += '"';
        break;
      case '\\':
        out += '\\';
        break;
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case 'x': {
        const int hi = i + 1 < s.size() ? hex_digit(s[i + 1]) : -1;
        const int lo = i + 2 < s.size() ? hex_digit(s[i + 2]) : -1;
        if (hi < 0 || lo < 0)
          throw ParseError(t.line, t.column + static_cast<int>(i), "expected two hex digits after \\x");
        out += static_cast<char>(hi * 16 + lo);
        i += 2;
        break;
      }
      default:
        throw ParseError(t.line, t.column + static_cast<int>(i),
                         std::string("unknown escape '\\") + e + "' (use \\\" \\\\ \\n \\t \\r or \\xHH)");
    }
  }
  return out;
}

void append_quoted(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          out += "\\x";
          out += kHex[(c >> 4) & 0xf];
          out += kHex[c & 0xf];
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

}  // namespace crucible::ir::detail
