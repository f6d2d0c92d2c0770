// The tokens a grammar allows next: a bitmask over the vocabulary for a Matcher's current state (bit t of
// word t / 32 set = token t allowed). A token is allowed when the matcher accepts all of its bytes; the
// end-of-generation tokens are allowed exactly when the input so far is a complete sentence; tokens that
// are never text (MaskVocab) never are.
//
// How it is fast (the ideas of xgrammar's "context-independent tokens"):
//  * A state is a set of stacks (heads); the tokens allowed from a set are the union of those allowed from
//    each stack, so masks are built per head.
//  * Per stack top (its top entries), once per grammar and vocabulary: the tokens allowed whatever lies
//    beneath, and the few that depend on it (mask_tables.h, shared by every matcher of the grammar). Only
//    the dependent ones are walked per state, from the real stack.
//  * Walks go through the tokens sorted by bytes (trie_walk.h): a refused byte prunes every token sharing
//    the prefix, and the matcher state of each prefix depth is kept for the next token.
//  * Whole masks are cached per state (sorted heads plus a pending UTF-8 sequence): a bounded number of
//    entries, replaced round robin.
// A state with a UTF-8 sequence pending walks the whole vocabulary (rare: a token split inside a
// character).
//
// Allocation: the tables and the matcher's new stacks are allocated the first time they are met; after
// that compute() allocates nothing (the cache's storage is reserved at construction).
// Not thread-safe: one TokenMask per matcher, used from one thread at a time (with its tables).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "grammar/grammar_matcher.h"
#include "grammar/mask_tables.h"
#include "grammar/mask_vocab.h"
#include "grammar/trie_walk.h"

namespace ultra::grammar {

struct TokenMaskStats {
  int64_t calls = 0, cache_hits = 0;
  int64_t dependent_walked = 0;  // tokens of dependent lists walked per state (cache misses)
};

struct TokenMaskOptions {
  int cache_entries = 64;    // masks kept (each n_words() * 4 bytes)
  int cache_max_heads = 64;  // states with more heads are not cached
};

class TokenMask {
 public:
  using Options = TokenMaskOptions;

  // m: the matcher whose states are masked, of tables' grammar; it must outlive this object and be the
  // only one whose states compute() sees (the cache holds its stack ids).
  TokenMask(std::shared_ptr<MaskTables> tables, Matcher& m, Options opt = {});
  // With tables of its own (context depth 3).
  TokenMask(std::shared_ptr<const MaskVocab> vocab, Matcher& m, Options opt = {});

  size_t n_words() const { return vocab_->n_words(); }
  const MaskVocab& vocab() const { return *vocab_; }
  MaskTables& tables() { return *tables_; }

  // out[n_words()]: the allowed tokens for the matcher's current state; returns how many (0: a dead end,
  // nothing can follow). The matcher's state is unchanged.
  int compute(uint32_t* out);
  // Forgets the cached masks (the tables stay).
  void clear_cache();

  const TokenMaskStats& stats() const { return stats_; }

 private:
  struct CacheEntry {
    uint64_t hash = 0;
    bool used = false;
    std::vector<uint32_t> key;   // sorted heads, then partial, n_remain, n_len
    std::vector<uint32_t> mask;  // [n_words]
    int count = 0;
  };

  std::shared_ptr<MaskTables> tables_;
  std::shared_ptr<const MaskVocab> vocab_;
  Matcher& m_;
  Options opt_;
  TrieWalk walk_;
  Matcher::Snapshot saved_;    // the state compute() was called in
  std::vector<uint32_t> key_;  // scratch key
  std::vector<CacheEntry> cache_;
  int next_victim_ = 0;
  TokenMaskStats stats_;

  void build_key();
  CacheEntry* find_cached(uint64_t h);
};

// Number of set bits of mask[0..n_words).
int count_allowed(const uint32_t* mask, size_t n_words);
inline bool mask_allows(const uint32_t* mask, int32_t t) {
  return (mask[(uint32_t)t >> 5] >> (t & 31)) & 1u;
}

}  // namespace ultra::grammar
