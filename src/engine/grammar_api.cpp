// The public grammar calls of include/ultra/grammar.h over src/grammar.
#include "grammar/gbnf_parser.h"
#include "ultra/grammar.h"

namespace ultra {

void check_grammar(std::string_view gbnf) {
  grammar::parse_gbnf(gbnf);
}

}  // namespace ultra
