#include "tokenizer/vocab.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/file.h"
#include "core/json.h"
#include "io/gguf.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"

namespace ultra::tok {

using json = nlohmann::json;

std::string_view token_type_name(TokenType t) {
  switch (t) {
    case TokenType::Undefined:
      return "undefined";
    case TokenType::Normal:
      return "normal";
    case TokenType::Unknown:
      return "unknown";
    case TokenType::Control:
      return "control";
    case TokenType::UserDefined:
      return "user-defined";
    case TokenType::Unused:
      return "unused";
    case TokenType::Byte:
      return "byte";
  }
  return "?";
}

void TokenIndex::build(const std::vector<std::string>& tokens, const std::string& source) {
  map_.clear();
  map_.reserve(tokens.size() * 2);
  max_len_ = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& t = tokens[i];
    if (t.empty()) continue;
    auto [it, inserted] = map_.emplace(std::string_view(t), (int32_t)i);
    if (!inserted) fail("{}: duplicate token '{}' at ids {} and {}", source, t, it->second, i);
    max_len_ = std::max(max_len_, t.size());
  }
}

namespace {

// The token texts that llama.cpp recognises as end-of-turn when the vocabulary does not name one.
void find_eot(Vocab& v) {
  if (v.eot >= 0) return;
  static const char* const names[] = {"<|eot_id|>",    "<|im_end|>",      "<|end|>", "<end_of_turn>",
                                      "<|endoftext|>", "<|end_of_text|>", "<EOT>",   "<｜end▁of▁sentence｜>"};
  for (const char* n : names) {
    for (size_t i = 0; i < v.tokens.size(); ++i) {
      if (v.tokens[i] == n) {
        v.eot = (int32_t)i;
        return;
      }
    }
  }
}

// The end-of-generation set, as llama.cpp's vocabulary loader builds it (llama-vocab.cpp, special_eog_ids):
// eos, eot, eom and every token with one of these texts; when both "<|return|>" and "<|call|>" are there
// (the harmony format) "<|end|>" is not an end, and when "<|tool_response>" is there (Gemma 4), "</s>" is
// not.
void find_eog(Vocab& v) {
  static const char* const names[] = {"<|eot_id|>",
                                      "<|im_end|>",
                                      "<|end|>",
                                      "<|return|>",
                                      "<|call|>",
                                      "<|flush|>",
                                      "<|calls|>",
                                      "<end_of_turn>",
                                      "<|endoftext|>",
                                      "<|eom_id|>",
                                      "<EOT>",
                                      "_<EOT>",
                                      "[EOT]",
                                      "[EOS]",
                                      "<|end_of_text|>",
                                      "<end_of_utterance>",
                                      "<eos>",
                                      "<turn|>",
                                      "<|tool_response>",
                                      "<｜end▁of▁sentence｜>"};
  auto id_of = [&](std::string_view t) {
    for (size_t i = 0; i < v.tokens.size(); ++i)
      if (v.tokens[i] == t) return (int32_t)i;
    return (int32_t)-1;
  };
  v.eog.clear();
  for (const char* n : names)
    if (const int32_t id = id_of(n); id >= 0) v.eog.push_back(id);
  const int32_t end = id_of("<|end|>"), s = id_of("</s>");
  if (end >= 0 && ((id_of("<|return|>") >= 0 && id_of("<|call|>") >= 0) ||
                   (id_of("<|calls|>") >= 0 && id_of("<|flush|>") >= 0)))
    v.eog.erase(std::remove(v.eog.begin(), v.eog.end(), end), v.eog.end());
  for (int32_t id : {v.eos, v.eot, v.eom})
    if (id >= 0) v.eog.push_back(id);
  if (s >= 0 && id_of("<|tool_response>") >= 0)
    v.eog.erase(std::remove(v.eog.begin(), v.eog.end(), s), v.eog.end());
  std::sort(v.eog.begin(), v.eog.end());
  v.eog.erase(std::unique(v.eog.begin(), v.eog.end()), v.eog.end());
}

std::string lower(std::string s) {
  for (char& c : s) c = (char)std::tolower((unsigned char)c);
  return s;
}

int32_t gguf_id(const gguf::Reader& r, const char* key, int32_t fallback, size_t n) {
  const gguf::Value* x = r.find(key);
  if (!x) return fallback < (int64_t)n ? fallback : -1;
  if (x->type == gguf::ValueType::STRING || x->type == gguf::ValueType::ARRAY)
    fail("{}: {} has type {}, expected an integer", r.path(), key, gguf::value_type_name(x->type));
  const int64_t id = x->as_int();
  if (id == -1) return -1;
  if (id < 0 || (uint64_t)id >= n)
    fail("{}: {} = {} is out of range (the vocabulary has {} tokens)", r.path(), key, id, n);
  return (int32_t)id;
}

const gguf::Array& gguf_array(const gguf::Reader& r, const char* key, size_t n_expected) {
  const gguf::Value* x = r.find(key);
  if (x->type != gguf::ValueType::ARRAY)
    fail("{}: key '{}' has type {}, expected an array", r.path(), key, gguf::value_type_name(x->type));
  const gguf::Array& a = x->as_array();
  if (n_expected != (size_t)-1 && a.size() != n_expected)
    fail("{}: key '{}' has {} entries but the vocabulary has {} tokens", r.path(), key, a.size(), n_expected);
  return a;
}

}  // namespace

Vocab load_gguf(const gguf::Reader& r) {
  Vocab v;
  v.source = r.path();
  const std::string model = r.get_string("tokenizer.ggml.model");
  v.pre = r.get_string_opt("tokenizer.ggml.pre").value_or("default");
  if (model == "gpt2") {
    v.kind = ModelKind::Bpe;
  } else if (model == "gemma4") {
    v.kind = ModelKind::Bpe;
    v.pre = "gemma4";  // llama.cpp ignores tokenizer.ggml.pre for this model
  } else if (model == "llama") {
    v.kind = ModelKind::Spm;
  } else {
    fail(
        "{}: tokenizer.ggml.model '{}' is not supported (gpt2 = byte-level BPE, llama = SentencePiece, "
        "gemma4 = SentencePiece-style BPE)",
        v.source, model);
  }

  if (!r.find("tokenizer.ggml.tokens"))
    fail("{}: key 'tokenizer.ggml.tokens' missing (no vocabulary)", v.source);
  const gguf::Array& toks = gguf_array(r, "tokenizer.ggml.tokens", (size_t)-1);
  if (toks.elem_type != gguf::ValueType::STRING)
    fail("{}: tokenizer.ggml.tokens holds {}, expected strings", v.source,
         gguf::value_type_name(toks.elem_type));
  const size_t n = toks.size();
  if (n == 0) fail("{}: tokenizer.ggml.tokens is empty", v.source);
  // Each token costs ~32 bytes (+ its text beyond 15 bytes) here and a few times that in the Tokenizer,
  // for at least 8 bytes of file: the limit keeps a crafted file of empty strings from costing gigabytes.
  if (n > kMaxVocab) fail("{}: {} tokens, more than the limit of {}", v.source, n, kMaxVocab);
  v.tokens.reserve(n);
  for (size_t i = 0; i < n; ++i) v.tokens.emplace_back(toks.string_at(i));

  if (r.find("tokenizer.ggml.scores")) {
    const gguf::Array& a = gguf_array(r, "tokenizer.ggml.scores", n);
    if (a.elem_type == gguf::ValueType::STRING || a.elem_type == gguf::ValueType::ARRAY)
      fail("{}: tokenizer.ggml.scores holds {}, expected numbers", v.source,
           gguf::value_type_name(a.elem_type));
    v.scores.reserve(n);
    for (size_t i = 0; i < n; ++i) v.scores.push_back((float)a.float_at(i));
  }
  if (r.find("tokenizer.ggml.token_type")) {
    const gguf::Array& a = gguf_array(r, "tokenizer.ggml.token_type", n);
    if (a.elem_type == gguf::ValueType::STRING || a.elem_type == gguf::ValueType::ARRAY)
      fail("{}: tokenizer.ggml.token_type holds {}, expected integers", v.source,
           gguf::value_type_name(a.elem_type));
    v.types.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const int64_t t = a.int_at(i);
      if (t < 0 || t > 6) fail("{}: token {} '{}' has type {}, expected 0..6", v.source, i, v.tokens[i], t);
      v.types.push_back((TokenType)t);
    }
  }

  if (v.kind == ModelKind::Bpe) {
    if (!r.find("tokenizer.ggml.merges"))
      fail("{}: BPE vocabulary (tokenizer.ggml.model {}) without tokenizer.ggml.merges", v.source, model);
    const gguf::Array& a = gguf_array(r, "tokenizer.ggml.merges", (size_t)-1);
    if (a.elem_type != gguf::ValueType::STRING)
      fail("{}: tokenizer.ggml.merges holds {}, expected strings", v.source,
           gguf::value_type_name(a.elem_type));
    if (a.size() > kMaxVocab) fail("{}: {} merges, more than the limit of {}", v.source, a.size(), kMaxVocab);
    v.merges.reserve(a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      const std::string_view m = a.string_at(i);
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos)
        fail("{}: merge #{} '{}' is not two tokens separated by a space", v.source, i, m);
      v.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    }
    PreTokenizerInfo info = pre_tokenizer_for(v.pre);
    v.splits = std::move(info.splits);
    v.ignore_merges = info.ignore_merges;
    v.byte_level = !info.spm_style;
    if (info.spm_style) {
      // Spaces become U+2581 (no prefix), merges run over UTF-8 characters, characters without a token
      // fall back to <0xNN> tokens, decoding maps U+2581 back to spaces. (Where some <0xNN> token is
      // missing llama.cpp drops that byte and this gives the unknown token; Gemma 4 has all 256.)
      v.escape_spaces = true;
      v.prepend = PrependScheme::Never;
      v.byte_fallback = true;
      v.whole_newlines = true;
    }
    v.add_bos = r.get_bool_opt("tokenizer.ggml.add_bos_token").value_or(info.add_bos) || info.force_add_bos;
  } else {
    const bool prefix = r.get_bool_opt("tokenizer.ggml.add_space_prefix").value_or(true);
    v.escape_spaces = true;
    v.prepend = prefix ? PrependScheme::Always : PrependScheme::Never;
    v.prepend_always = true;
    v.leading_space = prefix ? LeadingSpace::StripOne : LeadingSpace::Keep;
    v.byte_level = false;
    v.add_bos = r.get_bool_opt("tokenizer.ggml.add_bos_token").value_or(true);
  }
  v.add_eos = r.get_bool_opt("tokenizer.ggml.add_eos_token").value_or(false);
  v.chat_template = r.get_string_opt("tokenizer.chat_template").value_or("");

  const bool spm = v.kind == ModelKind::Spm;  // llama.cpp's SPM defaults: unk 0, bos 1, eos 2
  v.bos = gguf_id(r, "tokenizer.ggml.bos_token_id", spm ? 1 : -1, n);
  v.eos = gguf_id(r, "tokenizer.ggml.eos_token_id", spm ? 2 : -1, n);
  v.unk = gguf_id(r, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, n);
  v.eot = gguf_id(r, "tokenizer.ggml.eot_token_id", -1, n);
  v.eom = gguf_id(r, "tokenizer.ggml.eom_token_id", -1, n);
  v.pad = gguf_id(r, "tokenizer.ggml.padding_token_id", -1, n);
  find_eot(v);
  find_eog(v);

  // Per-token attributes that GGUF does not store; llama.cpp sets them by model name.
  const std::string name = lower(r.get_string_opt("general.name").value_or(""));
  if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    v.attrs.assign(n, 0);
    for (size_t i = 0; i < n; ++i) {
      const TokenType t = v.types.empty() ? TokenType::Normal : v.types[i];
      const std::string& s = v.tokens[i];
      if ((t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown ||
           s == "</s>") &&
          s != "<unk>" && s != "<s>" && s != "<|endoftext|>")
        v.attrs[i] = kAttrRstrip;
    }
  }
  return v;
}

Vocab load_gguf_file(const std::string& path) {
  return load_gguf(gguf::Reader::open(path));
}

// ---- Hugging Face tokenizer.json ----

namespace {

struct HfCtx {
  const std::string& source;
  Vocab& v;
  bool saw_byte_level = false;
};

std::string quote_regex(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (std::isalnum((unsigned char)c) || (unsigned char)c >= 0x80 || c == ' ') {
      out += c;
    } else {
      out += '\\';
      out += c;
    }
  }
  return out;
}

SplitBehavior parse_behavior(const HfCtx& c, const json& j) {
  const std::string b = j.is_string() ? j.get<std::string>() : "Isolated";
  if (b == "Isolated") return SplitBehavior::Isolated;
  if (b == "Removed") return SplitBehavior::Removed;
  if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (b == "Contiguous") return SplitBehavior::Contiguous;
  fail("{}: unknown split behavior '{}'", c.source, b);
}

// A token id in tokenizer JSON: an integer in [0, kMaxVocab). Anything else (a float, a string, a huge or
// negative number) is an error, never a conversion (nlohmann's get<int>() of 1e30 is undefined behaviour).
// `what` names the value in messages ("the id of token" + key when given).
int32_t json_token_id(const json& v, const std::string& source, std::string_view what,
                      std::string_view key = {}) {
  const bool in_range =
      v.is_number_integer() &&
      (v.is_number_unsigned() ? v.get<uint64_t>() < kMaxVocab
                              : v.get<int64_t>() >= 0 && v.get<int64_t>() < (int64_t)kMaxVocab);
  if (!in_range) {
    const std::string name = key.empty() ? std::string(what) : fmt::format("{} '{}'", what, key);
    if (!v.is_number_integer())
      fail("{}: {} is {}, expected an integer token id", source, name, dump_json(v));
    fail("{}: {} = {} is not a token id (0 to {})", source, name, dump_json(v), kMaxVocab - 1);
  }
  return (int32_t)v.get<int64_t>();
}

std::string str_or(const json& j, const char* key, const std::string& dflt) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : dflt;
}

bool bool_or(const json& j, const char* key, bool dflt) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : dflt;
}

void parse_normalizer(HfCtx& c, const json& j) {
  if (j.is_null()) return;
  const std::string type = str_or(j, "type", "");
  if (type == "Sequence") {
    for (const auto& n : j.at("normalizers")) parse_normalizer(c, n);
  } else if (type == "Prepend") {
    if (str_or(j, "prepend", "") != utf8::kMetaSpace)
      fail("{}: Prepend normalizer with '{}' is not supported (only U+2581)", c.source,
           str_or(j, "prepend", ""));
    c.v.prepend = PrependScheme::Always;
    c.v.prepend_always = true;
  } else if (type == "Replace") {
    const json& p = j.at("pattern");
    if (!(p.contains("String") && p["String"] == " " && str_or(j, "content", "") == utf8::kMetaSpace))
      fail("{}: Replace normalizer {} is not supported (only ' ' -> U+2581)", c.source, dump_json(j));
    c.v.escape_spaces = true;
  } else if (type == "NFC") {
    // Accepted as the identity: text is taken to be NFC already (true of nearly all text). Decomposed
    // input would tokenize differently from HF.
  } else {
    fail("{}: normalizer '{}' is not supported", c.source, type);
  }
}

void parse_pre_tokenizer(HfCtx& c, const json& j, bool first) {
  if (j.is_null()) return;
  const std::string type = str_or(j, "type", "");
  Vocab& v = c.v;
  if (type == "Sequence") {
    bool f = first;
    for (const auto& p : j.at("pretokenizers")) {
      parse_pre_tokenizer(c, p, f);
      f = false;
    }
  } else if (type == "ByteLevel") {
    c.saw_byte_level = true;
    v.byte_level = true;
    if (bool_or(j, "add_prefix_space", false)) {
      if (!first)
        fail("{}: ByteLevel with add_prefix_space after another pre-tokenizer is not supported", c.source);
      v.prepend = PrependScheme::Always;
      v.prepend_always = false;
    }
    if (bool_or(j, "use_regex", true))
      v.splits.push_back(SplitRule{kGpt2Pattern, SplitBehavior::Isolated, false});
  } else if (type == "Split") {
    const json& p = j.at("pattern");
    SplitRule r;
    if (p.contains("Regex")) {
      r.pattern = p["Regex"].get<std::string>();
    } else if (p.contains("String")) {
      r.pattern = quote_regex(p["String"].get<std::string>());
    } else {
      fail("{}: Split pattern {} is not supported", c.source, dump_json(p));
    }
    r.behavior = parse_behavior(c, j.value("behavior", json("Isolated")));
    r.invert = bool_or(j, "invert", false);
    v.splits.push_back(std::move(r));
  } else if (type == "Digits") {
    v.splits.push_back(SplitRule{
        R"(\p{N})",
        bool_or(j, "individual_digits", false) ? SplitBehavior::Isolated : SplitBehavior::Contiguous, false});
  } else if (type == "Punctuation") {
    v.splits.push_back(SplitRule{R"([\p{P}!-/:-@\[-`{-~])",
                                 parse_behavior(c, j.value("behavior", json("Isolated"))), false});
  } else if (type == "Metaspace") {
    if (str_or(j, "replacement", utf8::kMetaSpace.data()) != utf8::kMetaSpace)
      fail("{}: Metaspace replacement other than U+2581 is not supported", c.source);
    v.escape_spaces = true;
    std::string scheme = str_or(j, "prepend_scheme", "");
    if (scheme.empty()) scheme = bool_or(j, "add_prefix_space", true) ? "always" : "never";
    v.prepend = scheme == "always"  ? PrependScheme::Always
                : scheme == "first" ? PrependScheme::First
                                    : PrependScheme::Never;
    v.prepend_always = false;
    if (bool_or(j, "split", true))
      v.splits.push_back(SplitRule{std::string(utf8::kMetaSpace), SplitBehavior::MergedWithNext, false});
  } else if (type == "WhitespaceSplit") {
    v.splits.push_back(SplitRule{R"(\s+)", SplitBehavior::Removed, false});
  } else if (type == "Whitespace") {
    v.splits.push_back(SplitRule{R"(\w+|[^\w\s]+)", SplitBehavior::Removed, true});
  } else if (type == "CharDelimiterSplit") {
    v.splits.push_back(SplitRule{quote_regex(str_or(j, "delimiter", " ")), SplitBehavior::Removed, false});
  } else {
    fail("{}: pre-tokenizer '{}' is not supported", c.source, type);
  }
}

void parse_decoder(HfCtx& c, const json& j) {
  if (j.is_null()) return;
  const std::string type = str_or(j, "type", "");
  if (type == "Sequence") {
    for (const auto& d : j.at("decoders")) parse_decoder(c, d);
  } else if (type == "ByteLevel") {
    c.saw_byte_level = true;
  } else if (type == "Strip") {
    auto start = j.find("start");
    const bool from_start = start != j.end() && start->is_number_integer() &&
                            (start->is_number_unsigned() || start->get<int64_t>() >= 1);
    if (str_or(j, "content", " ") == " " && from_start) c.v.leading_space = LeadingSpace::StripOne;
  } else if (type == "Metaspace") {
    std::string scheme = str_or(j, "prepend_scheme", "");
    if (scheme.empty()) scheme = bool_or(j, "add_prefix_space", true) ? "always" : "never";
    if (scheme != "never") c.v.leading_space = LeadingSpace::StripFirstToken;
  }
  // Replace(U+2581 -> ' '), ByteFallback, Fuse: what the non-byte-level decoding does anyway.
}

int32_t find_token(const Vocab& v, const std::string& text) {
  for (size_t i = 0; i < v.tokens.size(); ++i)
    if (v.tokens[i] == text) return (int32_t)i;
  return -1;
}

void parse_post_processor(HfCtx& c, const json& j) {
  if (j.is_null()) return;
  const std::string type = str_or(j, "type", "");
  Vocab& v = c.v;
  if (type == "Sequence") {
    for (const auto& p : j.at("processors")) parse_post_processor(c, p);
  } else if (type == "TemplateProcessing") {
    const json& single = j.at("single");
    auto special_id = [&](const json& item) -> int32_t {
      const std::string name = item.at("SpecialToken").at("id").get<std::string>();
      const json& st = j.value("special_tokens", json::object());
      if (st.contains(name) && !st[name].value("ids", json::array()).empty())
        return json_token_id(st[name]["ids"][0], c.source, "post_processor special token id");
      return find_token(v, name);
    };
    if (!single.empty() && single.front().contains("SpecialToken")) {
      v.add_bos = true;
      if (v.bos < 0) v.bos = special_id(single.front());
    }
    if (single.size() > 1 && single.back().contains("SpecialToken")) {
      v.add_eos = true;
      if (v.eos < 0) v.eos = special_id(single.back());
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    v.add_bos = v.add_eos = true;
    if (v.bos < 0) v.bos = json_token_id(j.at("cls").at(1), c.source, "post_processor cls id");
    if (v.eos < 0) v.eos = json_token_id(j.at("sep").at(1), c.source, "post_processor sep id");
  }
}

std::string token_content(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content")) return j["content"].get<std::string>();
  return {};
}

}  // namespace

Vocab load_hf_json(std::string_view tokenizer_json, std::string_view config_json, const std::string& source,
                   const std::string& config_source) {
  Vocab v;
  v.source = source;
  v.pre = "hf";
  v.byte_level = false;
  HfCtx c{source, v};
  try {
    const json j = parse_json(tokenizer_json, source);
    const json& model = j.at("model");
    const std::string type = str_or(model, "type", model.contains("merges") ? "BPE" : "");
    if (type != "BPE") fail("{}: model type '{}' is not supported (only BPE)", source, type);
    if (!str_or(model, "continuing_subword_prefix", "").empty() ||
        !str_or(model, "end_of_word_suffix", "").empty())
      fail("{}: BPE continuing_subword_prefix / end_of_word_suffix are not supported", source);
    // dropout is a training-time regulariser; encoding is deterministic here (as with dropout = null).

    // Vocabulary: model.vocab plus added_tokens; ids must be unique and dense holes become unused tokens.
    const json& vocab = model.at("vocab");
    if (!vocab.is_object()) fail("{}: model.vocab is not an object", source);
    int64_t max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it)
      max_id = std::max<int64_t>(max_id, json_token_id(it.value(), source, "the id of token", it.key()));
    const json added = j.value("added_tokens", json::array());
    if (!added.is_array()) fail("{}: added_tokens is not an array", source);
    for (const auto& a : added)
      max_id = std::max<int64_t>(max_id, json_token_id(a.at("id"), source, "an added token's id"));
    if (max_id < 0) fail("{}: empty vocabulary", source);
    const size_t n = (size_t)max_id + 1;
    v.tokens.assign(n, std::string());
    v.types.assign(n, TokenType::Unused);
    v.attrs.assign(n, 0);
    std::vector<uint8_t> seen(n, 0);
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const size_t id = (size_t)it.value().get<int64_t>();  // checked above
      if (seen[id]) fail("{}: id {} is used by both '{}' and '{}'", source, id, v.tokens[id], it.key());
      seen[id] = 1;
      v.tokens[id] = it.key();
      v.types[id] = TokenType::Normal;
    }
    for (const auto& a : added) {
      const int64_t id = a.at("id").get<int64_t>();  // checked above
      const std::string content = a.at("content").get<std::string>();
      if (seen[id] && v.tokens[id] != content)
        fail("{}: added token '{}' has id {}, which the vocabulary gives to '{}'", source, content, id,
             v.tokens[id]);
      seen[id] = 1;
      v.tokens[id] = content;
      v.types[id] = bool_or(a, "special", false) ? TokenType::Control : TokenType::UserDefined;
      v.attrs[id] =
          (bool_or(a, "lstrip", false) ? kAttrLstrip : 0) | (bool_or(a, "rstrip", false) ? kAttrRstrip : 0);
    }

    if (!model.contains("merges")) fail("{}: BPE model without merges", source);
    for (const auto& m : model.at("merges")) {
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          fail("{}: merge #{} '{}' is not two tokens separated by one space", source, v.merges.size(), s);
        v.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else if (m.is_array() && m.size() == 2) {
        v.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        fail("{}: merge #{} {} is malformed", source, v.merges.size(), dump_json(m));
      }
    }
    v.byte_fallback = bool_or(model, "byte_fallback", false);
    v.fuse_unk = bool_or(model, "fuse_unk", false);
    v.ignore_merges = bool_or(model, "ignore_merges", false);
    const std::string unk = str_or(model, "unk_token", "");
    if (!unk.empty()) {
      v.unk = find_token(v, unk);
      if (v.unk < 0) fail("{}: unk_token '{}' is not in the vocabulary", source, unk);
      v.types[v.unk] = TokenType::Unknown;
    }
    if (v.byte_fallback) {
      for (size_t i = 0; i < n; ++i) {
        const std::string& t = v.tokens[i];
        if (v.types[i] != TokenType::Unused && t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
            std::isxdigit((unsigned char)t[3]) && std::isxdigit((unsigned char)t[4]))
          v.types[i] = TokenType::Byte;
      }
    }

    parse_normalizer(c, j.value("normalizer", json()));
    parse_pre_tokenizer(c, j.value("pre_tokenizer", json()), true);
    parse_decoder(c, j.value("decoder", json()));
    v.byte_level = c.saw_byte_level;
    parse_post_processor(c, j.value("post_processor", json()));

    if (!config_json.empty()) {
      const json cfg = parse_json(config_json, config_source.empty() ? source : config_source);
      auto set_id = [&](const char* key, int32_t& id) {
        if (!cfg.contains(key)) return;
        const std::string t = token_content(cfg[key]);
        if (t.empty()) return;
        const int32_t found = find_token(v, t);
        if (found < 0) fail("{}: {} '{}' is not in the vocabulary", source, key, t);
        id = found;
      };
      set_id("bos_token", v.bos);
      set_id("eos_token", v.eos);
      set_id("pad_token", v.pad);
      set_id("unk_token", v.unk);
      if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean())
        v.add_bos = cfg["add_bos_token"];
      if (cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean())
        v.add_eos = cfg["add_eos_token"];
      if (cfg.contains("chat_template")) {
        const json& ct = cfg["chat_template"];
        if (ct.is_string()) {
          v.chat_template = ct.get<std::string>();
        } else if (ct.is_array()) {  // [{"name": ..., "template": ...}]: the default one, else the first
          for (const json& e : ct)
            if (e.is_object() && e.contains("template") && e["template"].is_string() &&
                (v.chat_template.empty() || e.value("name", "") == "default"))
              v.chat_template = e["template"].get<std::string>();
        }
      }
    }
  } catch (const json::exception& e) {
    fail("{}: invalid tokenizer JSON: {}", source, e.what());
  }
  if (v.add_bos && v.bos < 0) v.add_bos = false;
  if (v.add_eos && v.eos < 0) v.add_eos = false;
  find_eot(v);
  find_eog(v);
  return v;
}

Vocab load_hf(const std::string& tokenizer_json_path, const std::string& config_path) {
  const std::string tj = read_file(tokenizer_json_path, "tokenizer file");
  const std::string cj = config_path.empty() ? std::string() : read_file(config_path, "tokenizer config");
  return load_hf_json(tj, cj, tokenizer_json_path, config_path);
}

Vocab load_vocab(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path tj = fs::path(path) / "tokenizer.json";
    if (!fs::exists(tj, ec)) fail("{}: directory has no tokenizer.json", path);
    const fs::path cfg = fs::path(path) / "tokenizer_config.json";
    return load_hf(tj.string(), fs::exists(cfg, ec) ? cfg.string() : "");
  }
  char magic[4] = {};
  const int fd = open_regular_file(path, "tokenizer file", nullptr);
  const ssize_t got = ::read(fd, magic, 4);
  ::close(fd);
  if (got == 4 && std::string_view(magic, 4) == "GGUF") return load_gguf_file(path);
  const fs::path cfg = fs::path(path).parent_path() / "tokenizer_config.json";
  return load_hf(path, fs::exists(cfg, ec) ? cfg.string() : "");
}

}  // namespace ultra::tok
