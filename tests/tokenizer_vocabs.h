// Small vocabularies built in code for the tokenizer tests (test_tokenizer, test_tokenizer_stream).
#pragma once

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"

namespace ultra::test {

// A byte-level BPE vocabulary: the 256 byte characters, then the merged tokens of `merges` (raw bytes).
inline tok::Vocab byte_level_vocab(const std::vector<std::pair<std::string, std::string>>& raw_merges) {
  tok::Vocab v;
  v.source = "test";
  v.kind = tok::ModelKind::Bpe;
  v.byte_level = true;
  auto map = [](const std::string& raw) {
    std::string s;
    for (unsigned char c : raw) s += tok::utf8::byte_to_unicode(c);
    return s;
  };
  for (int b = 0; b < 256; ++b) v.tokens.emplace_back(tok::utf8::byte_to_unicode((uint8_t)b));
  std::set<std::string> have(v.tokens.begin(), v.tokens.end());
  for (const auto& [l, r] : raw_merges) {
    v.merges.emplace_back(map(l), map(r));
    const std::string m = map(l + r);
    if (have.insert(m).second) v.tokens.push_back(m);
  }
  return v;
}

// Appends an added token (types and attrs must cover the tokens before it); returns its id.
inline int32_t add_token(tok::Vocab& v, const std::string& text, tok::TokenType type, uint8_t attr) {
  v.tokens.push_back(text);
  v.types.push_back(type);
  v.attrs.push_back(attr);
  return (int32_t)v.tokens.size() - 1;
}

}  // namespace ultra::test
