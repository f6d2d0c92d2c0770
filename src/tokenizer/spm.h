// SentencePiece-style BPE (llama, phi-3 GGUF vocabularies): the normalised text (spaces already U+2581,
// prefix added) is split into UTF-8 characters; the adjacent pair whose concatenation is a token with the
// highest score is merged (leftmost on ties) until no concatenation is a token. Symbols that are not tokens
// fall back to their bytes as <0xNN> tokens, or to the unknown token (consecutive ones fused) when the
// vocabulary has no byte tokens. Linked list + heap: O(n log n).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace ultra::tok {

class SpmModel {
 public:
  SpmModel(const Vocab& vocab, const TokenIndex& index);

  // Appends the ids of normalised text. Thread-safe.
  void encode(std::string_view text, std::vector<int32_t>& out) const;

 private:
  const TokenIndex& index_;
  const std::vector<float>& scores_;
  int32_t unk_;
  std::array<int32_t, 256> byte_id_;  // <0xNN>, -1 where missing
};

}  // namespace ultra::tok
