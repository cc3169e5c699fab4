// The tokens of the text form (grammar in crucible/ir/parser.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace crucible::ir::detail {

struct Token {
  enum class Kind : uint8_t {
    End,
    Newline,
    Name,    ///< %x: text is "x"
    Ident,   ///< placeholder, f32, None, True, kind, ...
    OpName,  ///< aten::add.Tensor
    Int,     ///< -12
    Float,   ///< 1.5, 1e-05, nan, inf, -inf
    String,  ///< "a\"b": text is the raw inside of the quotes (escapes kept)
    Punct,   ///< one of ( ) [ ] { } , : = @ ?
  };
  Kind kind = Kind::End;
  char punct = 0;
  std::string_view text;
  int line = 0, column = 0;

  bool is(char p) const { return kind == Kind::Punct && punct == p; }
  bool is_ident(std::string_view s) const { return kind == Kind::Ident && text == s; }
};

/// Splits `text` into tokens, skipping blanks and '#' comments (which run to
/// the end of the line), ending with one End token. Throws ParseError on an
/// unexpected character or an unterminated string.
std::vector<Token> tokenize(std::string_view text);

/// The value of a String token: \" \\ \n \t \r and \xHH decoded. Throws
/// ParseError on an unknown escape.
std::string unescape(const Token& t);

/// Appends `s` as a double-quoted string literal that unescape reads back.
void append_quoted(std::string& out, std::string_view s);

}  // namespace crucible::ir::detail
