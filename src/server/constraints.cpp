#include "server/constraints.h"

#include <fmt/format.h>

#include "core/error.h"
#include "server/json_text.h"
#include "ultra/grammar.h"

namespace ultra::server {

using json = nlohmann::json;

const char* const kJsonObjectGrammar = R"(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws     ::= | " " | "\n" [ \t]{0,20}
)";

std::string json_schema_to_gbnf(const json& schema, const std::string& param) {
  // The request was parsed with sorted object keys: properties are generated in name order.
  try {
    return ultra::json_schema_to_gbnf(dump_json(schema));
  } catch (const Error& e) {
    throw FieldError(param, e.what());
  }
}

namespace {

bool has_field(const json& j, const char* k) {
  return j.contains(k) && !j[k].is_null();
}

// From response_format: "" for text.
std::string response_format_grammar(const json& rf) {
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    throw FieldError("response_format", "'response_format' must be an object with a string 'type'");
  const std::string type = rf["type"].get<std::string>();
  if (type == "text") return "";
  if (type == "json_object") {
    if (has_field(rf, "schema")) return json_schema_to_gbnf(rf["schema"], "response_format");  // llama.cpp's
    return kJsonObjectGrammar;
  }
  if (type == "json_schema") {
    if (!has_field(rf, "json_schema") || !rf["json_schema"].is_object())
      throw FieldError("response_format",
                       "'response_format' of type json_schema needs a 'json_schema' object");
    const json& js = rf["json_schema"];
    if (!has_field(js, "schema"))
      throw FieldError("response_format", "'response_format.json_schema' needs a 'schema'");
    return json_schema_to_gbnf(js["schema"], "response_format");
  }
  throw FieldError("response_format",
                   fmt::format("'response_format' type '{}' is unknown (text, json_object or json_schema)",
                               type.substr(0, 64)));
}

}  // namespace

std::string request_grammar(const json& body) {
  const char* given = nullptr;
  std::string text;
  const auto one = [&](const char* field) {
    if (given)
      throw FieldError(field, fmt::format("'{}' and '{}' both constrain the output: give one", given, field));
    given = field;
  };
  if (has_field(body, "grammar")) {
    one("grammar");
    if (!body["grammar"].is_string()) throw FieldError("grammar", "'grammar' must be a string (GBNF)");
    text = body["grammar"].get<std::string>();
    if (text.empty()) given = nullptr;  // llama.cpp: an empty grammar is none
  }
  if (has_field(body, "json_schema")) {
    one("json_schema");
    text = json_schema_to_gbnf(body["json_schema"], "json_schema");
  }
  if (has_field(body, "response_format")) {
    std::string g = response_format_grammar(body["response_format"]);
    if (!g.empty()) {
      one("response_format");
      text = std::move(g);
    }
  }
  if (!text.empty()) {
    try {
      check_grammar(text);
    } catch (const Error& e) {
      throw FieldError(given, fmt::format("'{}': {}", given, e.what()));
    }
  }
  return text;
}

void parse_logit_bias(const json& v, int n_vocab, SamplingParams& p) {
  const auto add = [&](int64_t id, const json& b) {
    if (id < 0 || id >= n_vocab)
      throw FieldError("logit_bias",
                       fmt::format("'logit_bias' token {} is out of the vocabulary [0, {})", id, n_vocab));
    float bias;
    if (b.is_boolean() && !b.get<bool>()) {
      bias = -100.0f;  // llama.cpp: false bans
    } else if (b.is_number()) {
      const double d = b.get<double>();
      if (!(d >= -100 && d <= 100))
        throw FieldError("logit_bias",
                         fmt::format("'logit_bias' of token {} must be in [-100, 100], got {}", id, d));
      bias = (float)d;
    } else {
      throw FieldError("logit_bias", fmt::format("'logit_bias' of token {} must be a number", id));
    }
    if (p.n_logit_bias >= SamplingParams::kMaxLogitBias)
      throw FieldError("logit_bias",
                       fmt::format("'logit_bias' has more than {} entries", SamplingParams::kMaxLogitBias));
    p.add_logit_bias((int32_t)id, bias);
  };
  if (v.is_object()) {
    for (const auto& [k, b] : v.items()) {
      size_t used = 0;
      int64_t id = -1;
      try {
        id = std::stoll(k, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != k.size())
        throw FieldError("logit_bias",
                         fmt::format("'logit_bias' keys must be token ids, got '{}'", k.substr(0, 64)));
      add(id, b);
    }
  } else if (v.is_array()) {
    for (const json& e : v) {
      if (!e.is_array() || e.size() != 2 || !e[0].is_number_integer())
        throw FieldError("logit_bias", "'logit_bias' as a list holds [token id, bias] pairs");
      add(e[0].is_number_unsigned() ? (int64_t)std::min<uint64_t>(e[0].get<uint64_t>(), INT64_MAX)
                                    : e[0].get<int64_t>(),
          e[1]);
    }
  } else {
    throw FieldError("logit_bias", "'logit_bias' must be an object of token id -> bias");
  }
}

}  // namespace ultra::server
