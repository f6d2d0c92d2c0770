// The request fields that constrain what a completion may say, read into the engine's terms: llama.cpp's
// `grammar` (GBNF text) and `json_schema`, OpenAI's `response_format` ({"type": "text"}, {"type":
// "json_object"}: any JSON object, {"type": "json_schema", "json_schema": {"schema": ...}}), and
// `logit_bias` (OpenAI's {"token id": bias} map, or llama.cpp's [[id, bias], ...] with false as a ban).
// Errors throw FieldError naming the field; the server answers 400 with it.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "ultra/sampling.h"

namespace ultra::server {

struct FieldError : std::runtime_error {
  FieldError(std::string param_, const std::string& message)
      : std::runtime_error(message), param(std::move(param_)) {}
  std::string param;
};

// Any JSON object (llama.cpp's grammars/json.gbnf with its root an object), for response_format json_object.
extern const char* const kJsonObjectGrammar;

// The GBNF text the body's grammar / json_schema / response_format ask for, "" for none; checked by
// parsing it (a bad grammar: FieldError with the parser's line, column and message). At most one of them.
std::string request_grammar(const nlohmann::json& body);

// The one place a request's JSON schema becomes GBNF (param: the field it came from, for messages).
// The schema compiled to GBNF (include/ultra/grammar.h); what it cannot express: FieldError naming the
// keyword and its JSON pointer (a 400).
std::string json_schema_to_gbnf(const nlohmann::json& schema, const std::string& param);

// Reads logit_bias into p (appended); token ids must be in [0, n_vocab), biases in [-100, 100].
void parse_logit_bias(const nlohmann::json& v, int n_vocab, SamplingParams& p);

}  // namespace ultra::server
