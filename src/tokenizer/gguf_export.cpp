#include "tokenizer/gguf_export.h"

#include <fmt/format.h>

#include <string_view>
#include <unordered_set>

#include "core/error.h"
#include "io/gguf.h"
#include "tokenizer/pretokenizer.h"

namespace ultra::tok {

namespace {

// An id that tokenizer.json leaves undefined (load_hf_json fills it with an empty unused token).
bool is_hole(const Vocab& v, size_t i) {
  return v.tokens[i].empty() && i < v.types.size() && v.types[i] == TokenType::Unused;
}

}  // namespace

std::string find_pre_name(const Vocab& v) {
  // The names whose regexes llama.cpp and this tokenizer know; the first whose rules match wins.
  static const char* const kNames[] = {"gpt-2",        "llama-bpe",      "qwen2",  "qwen35",
                                       "deepseek-llm", "deepseek-coder", "falcon", "starcoder",
                                       "mpt",          "refact",         "gpt-4o", "default"};
  for (const char* name : kNames) {
    PreTokenizerInfo info;
    try {
      info = pre_tokenizer_for(name);
    } catch (const Error&) {
      continue;
    }
    if (info.splits.size() != v.splits.size() || info.ignore_merges != v.ignore_merges) continue;
    bool same = true;
    for (size_t i = 0; i < info.splits.size() && same; ++i)
      same = info.splits[i].pattern == v.splits[i].pattern &&
             info.splits[i].behavior == v.splits[i].behavior && info.splits[i].invert == v.splits[i].invert;
    if (same) return name;
  }
  return "";
}

void write_gguf_vocab(const Vocab& v, gguf::Writer& w, size_t n_vocab) {
  if (v.kind != ModelKind::Bpe || !v.byte_level)
    fail("{}: only byte-level BPE tokenizers can be written to GGUF by this converter", v.source);
  const std::string pre = find_pre_name(v);
  if (pre.empty())
    fail("{}: the pre-tokenizer matches none of the GGUF pre-tokenizer names known here", v.source);
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", pre);
  // One token per embedding row, as llama.cpp's convert_hf_to_gguf.py writes them (get_vocab_base): ids
  // the tokenizer does not define (holes, and the rows past its last token when the embedding table is
  // padded, e.g. Qwen2's 151936 rows for ~151665 tokens) become "[PAD{id}]" of type UNUSED. llama.cpp
  // requires as many tokens as token_embd rows.
  if (n_vocab < v.tokens.size())
    fail("{}: the tokenizer has {} tokens but the model's vocabulary is {}", v.source, v.tokens.size(),
         n_vocab);
  std::vector<std::string> tokens(v.tokens);
  std::vector<int32_t> types(n_vocab, (int32_t)TokenType::Normal);
  for (size_t i = 0; i < v.types.size() && i < v.tokens.size(); ++i) types[i] = (int32_t)v.types[i];
  std::unordered_set<std::string_view> taken;  // texts of defined tokens, which a [PAD] name must not repeat
  for (size_t i = 0; i < v.tokens.size(); ++i)
    if (!is_hole(v, i)) taken.insert(v.tokens[i]);
  tokens.resize(n_vocab);
  for (size_t i = 0; i < n_vocab; ++i) {
    if (i < v.tokens.size() && !is_hole(v, i)) continue;
    tokens[i] = fmt::format("[PAD{}]", i);
    types[i] = (int32_t)TokenType::Unused;
    if (taken.count(tokens[i]))
      fail("{}: token {} is '{}', the name the padding token for id {} would get", v.source, tokens[i],
           tokens[i], i);
  }
  w.set_array_string("tokenizer.ggml.tokens", tokens);
  w.set_array_i32("tokenizer.ggml.token_type", types);
  std::vector<std::string> merges;
  merges.reserve(v.merges.size());
  for (const auto& [a, b] : v.merges) merges.push_back(a + " " + b);
  w.set_array_string("tokenizer.ggml.merges", merges);
  auto id = [&](const char* key, int32_t x) {
    if (x >= 0) w.set_u32(key, (uint32_t)x);
  };
  id("tokenizer.ggml.bos_token_id", v.bos);
  id("tokenizer.ggml.eos_token_id", v.eos);
  id("tokenizer.ggml.eot_token_id", v.eot);
  id("tokenizer.ggml.unknown_token_id", v.unk);
  id("tokenizer.ggml.padding_token_id", v.pad);
  w.set_bool("tokenizer.ggml.add_bos_token", v.add_bos);
  w.set_bool("tokenizer.ggml.add_eos_token", v.add_eos);
  // tokenizer_config.json's chat template travels with the vocabulary, as llama.cpp's converter writes it.
  if (!v.chat_template.empty()) w.set_string("tokenizer.chat_template", v.chat_template);
}

}  // namespace ultra::tok
