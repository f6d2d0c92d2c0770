#include "tokenizer/gguf_export.h"

#include "core/error.h"
#include "io/gguf.h"
#include "tokenizer/pretokenizer.h"

namespace ultra::tok {

std::string find_pre_name(const Vocab& v) {
  // The names whose regexes llama.cpp and this tokenizer know; the first whose rules match wins.
  static const char* const kNames[] = {"gpt-2",  "llama-bpe", "qwen2", "deepseek-llm", "deepseek-coder",
                                       "falcon", "starcoder", "mpt",   "refact",       "default"};
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

void write_gguf_vocab(const Vocab& v, gguf::Writer& w) {
  if (v.kind != ModelKind::Bpe || !v.byte_level)
    fail("{}: only byte-level BPE tokenizers can be written to GGUF by this converter", v.source);
  const std::string pre = find_pre_name(v);
  if (pre.empty())
    fail("{}: the pre-tokenizer matches none of the GGUF pre-tokenizer names known here", v.source);
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", pre);
  w.set_array_string("tokenizer.ggml.tokens", v.tokens);
  std::vector<int32_t> types(v.tokens.size(), (int32_t)TokenType::Normal);
  for (size_t i = 0; i < v.types.size() && i < types.size(); ++i) types[i] = (int32_t)v.types[i];
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
}

}  // namespace ultra::tok
