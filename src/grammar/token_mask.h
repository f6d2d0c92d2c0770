// The tokens a grammar allows next: a bitmask over the vocabulary for a Matcher's current state (bit t of
// word t / 32 set = token t allowed). A token is allowed when the matcher accepts all of its bytes; the
// end-of-generation tokens are allowed exactly when the input so far is a complete sentence; tokens that
// are never text (MaskVocab) never are.
//
// How it is fast (the ideas of xgrammar's "context-independent tokens"):
//  * A state is a set of stacks (heads); the tokens allowed from a set are the union of those allowed from
//    each stack, so masks are built per head.
//  * Per stack top, once, lazily: the vocabulary is walked from the stack's top `context_depth` entries
//    with nothing beneath them (Matcher::cut_stack). A token whose bytes all match without reaching that
//    cut bottom is allowed from every stack with the same top (accept, a bitmask); one refused before the
//    bottom could have been reached is refused from every such stack; only the others, refused after the
//    bottom may have been reached, depend on what lies beneath (dependent, a sorted token list), and only
//    they are walked per state. The cut stacks are interned nodes, so equal tops share one table.
//  * Walks go through the tokens sorted by bytes (MaskVocab): a refused byte prunes every token sharing
//    the prefix, and the matcher state of each prefix depth is kept for the next token (save / restore).
//  * Whole masks are cached per state (sorted heads plus a pending UTF-8 sequence): a bounded number of
//    entries, replaced round robin.
// A state with a UTF-8 sequence pending walks the whole vocabulary (rare: a token split inside a
// character).
//
// Allocation: the per-element tables and the matcher's new stacks are allocated the first time they are
// met; after that compute() allocates nothing (the cache's storage is reserved at construction).
// Not thread-safe: one TokenMask per matcher, used from one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "grammar/grammar_matcher.h"
#include "grammar/mask_vocab.h"

namespace ultra::grammar {

struct TokenMaskStats {
  int64_t calls = 0, cache_hits = 0;
  int64_t tables_built = 0;      // per-stack-top tables computed
  int64_t dependent_walked = 0;  // tokens of dependent lists walked per state (cache misses)
};

class TokenMask {
 public:
  struct Options {
    int cache_entries = 64;    // masks kept (each n_words() * 4 bytes)
    int cache_max_heads = 64;  // states with more heads are not cached
    int context_depth = 3;     // stack entries a per-top table looks at, [1, 32]
  };

  // m: the matcher whose states are masked; it must outlive this object and be the one passed to
  // compute() (the per-element tables and the cache hold its stack ids).
  TokenMask(std::shared_ptr<const MaskVocab> vocab, Matcher& m);
  TokenMask(std::shared_ptr<const MaskVocab> vocab, Matcher& m, Options opt);

  size_t n_words() const { return vocab_->n_words(); }
  const MaskVocab& vocab() const { return *vocab_; }

  // out[n_words()]: the allowed tokens for the matcher's current state; returns how many (0: a dead end,
  // nothing can follow). The matcher's state is unchanged.
  int compute(uint32_t* out);

  // Forgets the cached masks (the per-top tables stay).
  void clear_cache();

  const TokenMaskStats& stats() const { return stats_; }

 private:
  struct TopTable {
    std::vector<uint32_t> accept;    // [n_words] allowed from any stack with this top
    std::vector<int32_t> dependent;  // indices into vocab.sorted, ascending: walked per stack
    std::vector<uint16_t> dep_lcp;   // [dependent.size()] common prefix with the previous dependent token
  };
  struct CacheEntry {
    uint64_t hash = 0;
    bool used = false;
    std::vector<uint32_t> key;   // sorted heads, then partial, n_remain, n_len
    std::vector<uint32_t> mask;  // [n_words]
    int count = 0;
  };

  std::shared_ptr<const MaskVocab> vocab_;
  Matcher& m_;
  Options opt_;
  std::unordered_map<uint32_t, std::unique_ptr<TopTable>> tables_;  // by cut stack node
  std::vector<Matcher::Snapshot> st_;  // [max_len + 1] walk: the state after each prefix depth
  std::vector<uint8_t> dep_;           // [max_len + 1] walk: the rule's end was reachable within the prefix
  Matcher::Snapshot saved_;            // the state compute() was called in
  Matcher::Snapshot saved_table_;      // the state table() was called in
  std::vector<uint32_t> key_;          // scratch key
  std::vector<CacheEntry> cache_;
  int next_victim_ = 0;
  TokenMaskStats stats_;

  // The table of the stack `top` (built on first use). For a stack that was not cut (its real bottom is
  // the empty stack) the dependent tokens are refused.
  const TopTable& table(uint32_t top);
  // Walks the sorted tokens list[0..n) (indices into vocab.sorted; lcp[i] with list[i - 1]) from the
  // matcher's state; on_accept(index into list) for each token whose bytes all match, on_refuse(first, end,
  // dep) for each run of tokens refused together, dep: the matcher was complete at a byte boundary on the
  // way.
  template <class List, class Lcp, class Accept, class Refuse>
  void walk(const List& list, const Lcp& lcp, size_t n, Accept&& on_accept, Refuse&& on_refuse);
  void build_key();
  CacheEntry* find_cached(uint64_t h);
};

// Number of set bits of mask[0..n_words).
int count_allowed(const uint32_t* mask, size_t n_words);
inline bool mask_allows(const uint32_t* mask, int32_t t) {
  return (mask[(uint32_t)t >> 5] >> (t & 31)) & 1u;
}

}  // namespace ultra::grammar
