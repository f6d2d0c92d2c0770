// Walks tokens sorted by their bytes (MaskVocab::sorted) through a matcher as a byte trie: the state after
// each prefix depth is kept, so a token costs only the bytes it does not share with the one before, and a
// refused byte skips every following token that shares the refused prefix. Used by mask_tables.h (whole
// vocabulary, once per stack top) and token_mask.h (the dependent tokens, per state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "grammar/grammar_matcher.h"
#include "grammar/mask_vocab.h"

namespace ultra::grammar {

class TrieWalk {
 public:
  explicit TrieWalk(const MaskVocab& v) : v_(v), st_(v.max_len + 1), dep_(v.max_len + 1, 0) {
    for (auto& s : st_) s.heads.reserve(64);
  }

  // Walks list[0..n) (indices into v.sorted, ascending; lcp[i]: bytes in common with list[i - 1], lcp[0] =
  // 0) from m's state, which it leaves unchanged. on_accept(i) for each token whose bytes all match;
  // on_refuse(first, end, dep) for each run list[first..end) refused together, dep: the matcher was
  // complete at a byte boundary on the way (so a stack beneath the walked one could have taken over).
  template <class List, class Lcp, class Accept, class Refuse>
  void run(Matcher& m, const List& list, const Lcp& lcp, size_t n, Accept&& on_accept, Refuse&& on_refuse) {
    m.save(st_[0]);
    dep_[0] = 0;
    size_t i = 0;
    while (i < n) {
      const std::string& b = v_.bytes[v_.sorted[list[i]]];
      size_t d = lcp[i];  // the state after these bytes is st_[d] (the previous token's path shares them)
      m.restore_trusted(st_[d]);
      bool ok = true;
      for (; d < b.size(); ++d) {
        if (!m.accept_byte((uint8_t)b[d])) {
          ok = false;
          break;
        }
        m.save(st_[d + 1]);
        dep_[d + 1] = dep_[d] | (uint8_t)m.is_complete();
      }
      if (ok) {
        on_accept(i);
        ++i;
        continue;
      }
      // Byte d refused after the prefix [0, d): so is every following token that shares [0, d].
      size_t j = i + 1;
      while (j < n && lcp[j] > d) ++j;
      on_refuse(i, j, dep_[d] != 0);
      i = j;
    }
    m.restore_trusted(st_[0]);
  }

  // The whole vocabulary as a list (v.sorted's own indices).
  struct All {
    int32_t operator[](size_t i) const { return (int32_t)i; }
  };

 private:
  const MaskVocab& v_;
  std::vector<Matcher::Snapshot> st_;  // [max_len + 1] the state after each prefix depth
  std::vector<uint8_t> dep_;           // [max_len + 1] the walked stack's bottom was reachable within it
};

}  // namespace ultra::grammar
