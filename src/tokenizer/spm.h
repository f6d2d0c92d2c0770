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

  // Where a normalised text that goes on past text.size() may be cut for streaming: the largest p in
  // (from, to], with text[from, ...) not straddled by a token, such that encode(text[from, p)) followed by
  // encode(of the rest, from p) equals encode(text[from, ...)) whatever comes after text: no token's text
  // straddles p, so no merge crosses it (the merges on each side then happen as they would together), and
  // the byte before p is an ASCII character that is a token or has a byte token, so p is a character
  // boundary and no run of unknown characters is fused across it. Only p whose straddling tokens would
  // end within text are considered. 0 when there is none among the last candidates looked at (a few dozen
  // full checks; a byte that ends every token it occurs in, such as a newline in most vocabularies, is a
  // cheap one).
  size_t cut(std::string_view text, size_t from, size_t to) const;

 private:
  const TokenIndex& index_;
  const std::vector<float>& scores_;
  int32_t unk_;
  std::array<int32_t, 256> byte_id_;  // <0xNN>, -1 where missing
  size_t max_len_ = 1;                // the longest token (bytes)
  std::array<bool, 256> inner_{};     // the byte occurs in a token other than as its last byte
  // Whether a token's text is text[a, b) for some a < p < b.
  bool straddled(std::string_view text, size_t from, size_t p) const;
};

}  // namespace ultra::tok
