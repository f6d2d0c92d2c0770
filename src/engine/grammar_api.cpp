// The public grammar calls of include/ultra/grammar.h over src/grammar.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "grammar/gbnf_parser.h"
#include "grammar/json_schema.h"
#include "ultra/grammar.h"

namespace ultra {

void check_grammar(std::string_view gbnf) {
  grammar::parse_gbnf(gbnf);
}

std::string json_schema_to_gbnf(std::string_view schema_json, unsigned max_indent) {
  const nlohmann::ordered_json schema = parse_ordered_json_text(schema_json, /*allow_exceptions=*/false);
  if (schema.is_discarded()) fail("json schema: not valid JSON");
  grammar::JsonSchemaOptions o;
  o.max_indent = max_indent;
  return grammar::json_schema_to_gbnf(schema, o);
}

}  // namespace ultra
