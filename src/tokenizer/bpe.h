// BPE by merge rank, as HF tokenizers' BPE model: a word is split into units (bytes mapped through the GPT-2
// byte-to-unicode table for byte-level BPE, else UTF-8 characters), then the pair of adjacent symbols with
// the lowest merge rank is merged, leftmost first, until no pair has a merge. Symbols sit in a linked list
// and candidate pairs in a binary heap whose stale entries are skipped when popped: O(n log n) per word.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace ultra::tok {

class BpeModel {
 public:
  // Resolves every merge to (left id, right id) -> (rank, merged id). Throws ultra::Error when a merge is
  // malformed or names a token (left, right or their concatenation) missing from the vocabulary.
  BpeModel(const Vocab& vocab, const TokenIndex& index);

  // Appends the ids of one pre-tokenized word: raw bytes for byte-level BPE, normalised text otherwise.
  // Thread-safe; allocation-free once the per-thread scratch has grown to the word size.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  size_t n_merges() const { return n_merges_; }

 private:
  struct Slot {
    uint64_t key;
    int32_t rank;
    int32_t id;
  };
  static constexpr uint64_t kEmpty = ~0ull;

  const TokenIndex& index_;
  bool byte_level_, ignore_merges_, whole_newlines_, byte_fallback_, fuse_unk_;
  int32_t unk_;
  std::array<int32_t, 256> unit_id_;      // byte-level: id of the mapped character of each byte
  std::array<int32_t, 256> fallback_id_;  // <0xNN> ids, -1 where missing
  std::vector<Slot> table_;               // open addressing, power-of-two size
  uint64_t mask_ = 0;
  size_t n_merges_ = 0;

  const Slot* find_merge(int32_t a, int32_t b) const {
    const uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    for (uint64_t i = (h ^ (h >> 29)) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = table_[i];
      if (s.key == key) return &s;
      if (s.key == kEmpty) return nullptr;
    }
  }
  void insert_merge(int32_t a, int32_t b, int32_t rank, int32_t id);
};

}  // namespace ultra::tok
