// Grammars that constrain generated text (Context::set_grammar): llama.cpp's GBNF syntax.
#pragma once

#include <string>
#include <string_view>

namespace ultra {

// Parses a GBNF grammar (root rule "root") and checks it as set_grammar would; throws ultra::Error with the
// parser's message (line, column, what was expected) when it is not a usable grammar.
void check_grammar(std::string_view gbnf);

// The GBNF grammar whose sentences are the JSON texts that validate against a JSON Schema, given as JSON
// text (object properties in the order the text lists them). Throws ultra::Error naming the keyword and its
// JSON pointer for what a grammar cannot express (e.g. "unsupported keyword 'multipleOf' at
// /properties/price/multipleOf"), or when the text is not JSON. The keywords taken, and where the grammar is
// narrower than the schema: src/grammar/json_schema.h.
// max_indent: the spaces / tabs allowed after a newline between two JSON tokens (there may be nothing, one
// space, or a newline and that many); 0 leaves at most one space or one newline, so that a sampler spends
// at most one token on whitespace between tokens.
std::string json_schema_to_gbnf(std::string_view schema_json, unsigned max_indent = 20);

}  // namespace ultra
