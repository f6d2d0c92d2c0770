// Grammars that constrain generated text (Context::set_grammar): llama.cpp's GBNF syntax.
#pragma once

#include <string_view>

namespace ultra {

// Parses a GBNF grammar (root rule "root") and checks it as set_grammar would; throws ultra::Error with the
// parser's message (line, column, what was expected) when it is not a usable grammar.
void check_grammar(std::string_view gbnf);

}  // namespace ultra
