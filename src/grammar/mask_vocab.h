// A vocabulary as a grammar mask sees it (token_mask.h): each token's real bytes, the tokens sorted by those
// bytes (a byte trie in depth-first order: a refused byte prunes every token sharing the prefix), and the
// end-of-generation tokens that are allowed exactly when the grammar's input is complete.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ultra::tok {
class Tokenizer;
}

namespace ultra::grammar {

struct MaskVocab {
  int32_t n_vocab = 0;
  std::vector<std::string> bytes;  // [n_vocab] the token's UTF-8 (or raw) bytes; "" for a token text never is
  std::vector<int32_t> eog;        // end-of-generation ids, ascending
  std::vector<int32_t> sorted;     // ids with non-empty bytes, sorted by bytes (memcmp order)
  std::vector<uint16_t> lcp;       // [sorted.size()] bytes in common with the previous sorted token ([0] = 0)
  size_t max_len = 0;              // longest token, in bytes (tokens longer than 65535 bytes are dropped)

  // bytes[t] == "" marks a token the grammar never allows as text (control tokens, padding).
  MaskVocab(std::vector<std::string> bytes, std::vector<int32_t> eog);

  // The tokenizer's tokens: byte-level BPE mapping undone, SentencePiece U+2581 as a space and <0xNN> as
  // that byte (Tokenizer::token_to_piece). Control, unknown and unused tokens, and the end-of-generation
  // tokens, are never text.
  static std::shared_ptr<const MaskVocab> from_tokenizer(const tok::Tokenizer& t);

  size_t n_words() const { return ((size_t)n_vocab + 31) / 32; }  // uint32 words of a mask
};

// Common prefix length of a and b, at most 65535.
uint16_t common_prefix(const std::string& a, const std::string& b);

}  // namespace ultra::grammar
