// JSON Schema -> GBNF (gbnf_parser.h's syntax): the grammar whose sentences are JSON texts that validate
// against the schema, for constrained generation (response_format json_schema, tool call arguments).
//
// Supported: `type` (one or a list; null, boolean, object, array, string, number, integer), `enum`, `const`,
// `properties` / `required` / `additionalProperties` (false, true, a schema), `anyOf` and `oneOf` (as
// alternation; an alternative that cannot be compiled is left out; for oneOf, alternatives told apart by
// `required` or by a property with disjoint const / enum values are made exclusive, other overlaps are not),
// `allOf` (merged into one schema where the keywords can be combined; refused otherwise), `$ref` to local
// JSON pointers ("#", "#/$defs/x", "#/definitions/x", "#/properties/a/items", ...; recursive references
// become recursive rules), `patternProperties` (merged into the listed properties whose names match; no other
// property is generated), `dependencies` / `dependentRequired` (a required property's dependencies become
// required; an optional property with unmet dependencies is not generated), `items` / `prefixItems` /
// `additionalItems` / `minItems` / `maxItems`, string `minLength` / `maxLength` / `pattern`
// (regex_to_gbnf.h's subset; a maxLength beside it lowers its repetition counts, a minLength beside it must
// be implied by it) / `format` (date, time, date-time, uuid, email, uri, ipv4, ipv6, hostname, regex,
// json-pointer, relative-json-pointer; other formats are annotations, as JSON Schema defines them by default,
// and are ignored), `minimum` / `maximum` / `exclusiveMinimum` / `exclusiveMaximum` (exact for integers,
// numeric_range_gbnf.h; for numbers a fractional bound is rounded inwards), and `{}` / `true` / `{"type":
// "object"}` for any JSON value / object.
//
// Refused with ultra::Error naming the keyword and its JSON pointer, e.g.
//   json schema: unsupported keyword 'multipleOf' at /properties/price/multipleOf
// are the keywords that constrain in ways a grammar cannot express or we do not implement: multipleOf,
// uniqueItems (true with minItems above 1), propertyNames, not, if / then / else, contains / minContains /
// maxContains, dependencies / dependentSchemas whose schema a required property brings in, unevaluatedItems
// (not true), unevaluatedProperties (a schema), minProperties / maxProperties unless the listed properties
// satisfy them (or minProperties is 1: the list is then non-empty), $dynamicRef / $recursiveRef, remote
// $refs; also `false` schemas where a value is required and malformed schemas. Annotations (title,
// description, examples, default, $schema, $id, $comment, readOnly, writeOnly, deprecated, ...) and unknown
// keywords are ignored.
//
// The grammar may be narrower than the schema (every sentence validates; not every valid document is a
// sentence), as llama.cpp's json-schema-to-grammar is:
//   - Property order: the required properties first, in the order of `properties` (then required names
//     that `properties` does not list), then the optional ones in that order, each optional one present or
//     not; additional properties (when `additionalProperties` is true or a schema) come last, with plain
//     keys (no escapes) different from the listed names. The order of `properties` is the json's iteration
//     order: document order for nlohmann::ordered_json, sorted keys for nlohmann::json (whose objects are
//     std::maps), so callers that care parse the schema as ordered_json.
//   - An object schema with `properties` but no `additionalProperties` admits only the listed properties
//     (JSON Schema's default would admit any other).
//   - Whitespace: between tokens, nothing, one space, or a newline and up to `max_indent` spaces / tabs
//     (bounded, like llama.cpp's SPACE_RULE, so a sampler cannot loop on whitespace); none with
//     `whitespace = false`.
//   - Numbers: integer parts up to 16 digits, fractions up to 16 (6 in bounded ranges), exponents of up
//     to 2 digits and only without bounds; strings: \u escapes only outside the surrogates (each escape is
//     one code point, so minLength / maxLength count exactly); lengths, counts and repetitions above 2000
//     (the GBNF parser's limit) are lowered to 2000, a minimum above it is refused.
//   - patternProperties, dependencies and oneOf as described above.
//   - `uniqueItems: true` arrays have at most one item (more would need comparing items).
//   - `tuple` arrays (prefixItems / items as a list) without a schema for the rest have no further items.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "grammar/grammar.h"

namespace ultra::grammar {

struct JsonSchemaOptions {
  bool whitespace = true;    // allow the bounded whitespace between tokens (false: compact JSON only)
  uint32_t max_indent = 20;  // spaces / tabs after a newline
  int max_depth = 64;        // nested schemas (and $ref / allOf expansions) visited at once
};

// GBNF text with start rule `root`. Throws ultra::Error (see above).
std::string json_schema_to_gbnf(const nlohmann::json& schema, const JsonSchemaOptions& options = {});
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options = {});

// The same, parsed (parse_gbnf). Throws ultra::Error, e.g. for a schema whose $refs make a rule refer to
// itself before consuming input (left recursion), or one that no finite value matches (a rule that only
// recurses: a sampler could follow it forever).
Grammar json_schema_to_grammar(const nlohmann::json& schema, const JsonSchemaOptions& options = {});
Grammar json_schema_to_grammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options = {});

}  // namespace ultra::grammar
