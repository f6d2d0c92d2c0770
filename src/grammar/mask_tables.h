// The part of a grammar's token masks that does not depend on the whole parser stack (xgrammar's
// context-independent tokens), for one grammar and one vocabulary, shared by every matcher of that grammar
// (the sequences and requests that use it).
//
// For a stack top (the top `depth` entries of a stack: grammar elements, the head's class first) the
// vocabulary is walked once from those entries with nothing beneath them. A token whose bytes all match
// without reaching that bottom is allowed from every stack with this top (accept); one refused before the
// bottom could have been reached is refused from every such stack; the others, refused after the bottom
// may have been reached, depend on what lies beneath (dependent: walked per state by token_mask.h, or
// refused when the stack is no deeper than the top).
//
// Tables are built on first use (a walk over the vocabulary: about 1-20 ms for 128k tokens) and kept.
// Not thread-safe: use from one thread at a time (a Context's steps).
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/grammar_matcher.h"
#include "grammar/mask_vocab.h"
#include "grammar/trie_walk.h"

namespace ultra::grammar {

class MaskTables {
 public:
  static constexpr int kMaxDepth = 8;

  struct Top {
    int n = 0;                   // entries
    uint32_t elem[kMaxDepth]{};  // grammar elements, top first
    bool operator==(const Top& o) const;
  };
  struct Table {
    std::vector<uint32_t> accept;    // [n_words] allowed from any stack with this top
    std::vector<int32_t> dependent;  // indices into vocab.sorted, ascending
    std::vector<uint16_t> dep_lcp;   // [dependent.size()] bytes in common with the previous dependent token
  };

  // depth: stack entries a table looks at, [1, kMaxDepth].
  MaskTables(std::shared_ptr<const Grammar> g, std::shared_ptr<const MaskVocab> v, int depth = 3);

  const Table& get(const Top& top);
  int depth() const { return depth_; }
  const std::shared_ptr<const Grammar>& grammar() const { return g_; }
  const std::shared_ptr<const MaskVocab>& vocab() const { return v_; }
  int64_t tables_built() const { return built_; }

 private:
  struct TopHash {
    size_t operator()(const Top& t) const;
  };
  std::shared_ptr<const Grammar> g_;
  std::shared_ptr<const MaskVocab> v_;
  int depth_;
  Matcher m_;  // builds the tables (its stacks are its own)
  TrieWalk walk_;
  std::unordered_map<Top, std::unique_ptr<Table>, TopHash> tables_;
  int64_t built_ = 0;
};

}  // namespace ultra::grammar
