// Incremental matcher of a grammar (grammar.h) over UTF-8 text: feed bytes or code points one at a time,
// ask whether the input so far is a complete sentence, save and restore the state (speculative rollback).
//
// Design: a pushdown matcher like llama.cpp's (a set of stacks, each a path through the rules whose top is
// the character class to match next), with the stacks stored as a graph-structured stack: every stack is
// a node (element to match, parent node) interned in a hash table, so stacks that share a bottom share
// nodes, equal stacks are one node id, and a state is just the small set of top nodes ("heads"). Nodes are
// never freed or changed, so:
//   - a snapshot is a copy of the heads (plus a pending partial UTF-8 sequence) and restore is O(heads);
//   - a state has a stable identity (its sorted heads), so a per-token mask can later be computed by
//     walking the vocabulary's byte trie from each head and cached per head set, and masks for heads whose
//     class does not depend on what is below them (xgrammar's context-independent tokens) precomputed;
//   - the closure after each code point visits each node at most once (an epoch mark per node), so
//     ambiguous grammars (x? x? x? ...) do not blow up the way llama.cpp's list of stack copies can.
// The parser refuses left recursion, so the closure always terminates.
//
// Allocation: the node pool, its hash table, the per-node marks and the head / work lists are reserved at
// construction (Limits). Accepting input allocates only when it meets more distinct stacks than reserved
// (deeply nested input; the vectors grow geometrically, at most up to Limits::max_nodes, past which accept
// throws ultra::Error). Repeating or rolling back over input already seen allocates nothing. save() into
// a Snapshot that has held as many heads before allocates nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace ultra::grammar {

struct MatcherLimits {
  size_t reserve_nodes = 4096;         // stack nodes allocated up front
  size_t max_nodes = size_t{1} << 22;  // distinct stacks; beyond, accepting throws ultra::Error
  size_t reserve_heads = 256;          // heads / work list entries allocated up front
};

class Matcher {
 public:
  using Limits = MatcherLimits;

  // The matcher's state: which stacks are live and the UTF-8 sequence begun but not finished.
  struct Snapshot {
    std::vector<uint32_t> heads;
    uint32_t partial = 0;  // code point bits of the pending UTF-8 sequence
    uint8_t n_remain = 0;  // continuation bytes still expected (0: none pending)
    uint8_t n_len = 0;     // length of the pending sequence
  };

  explicit Matcher(std::shared_ptr<const Grammar> grammar, Limits limits = {});

  // Each accept returns false and leaves the state unchanged when the input cannot continue a sentence of
  // the grammar; so after any series of calls the input accepted so far is a valid prefix.
  bool accept_code_point(uint32_t c);  // false too while a UTF-8 sequence is pending
  // Takes a byte of UTF-8; a byte that starts or continues a sequence is accepted when some completion of
  // the sequence is a well-formed code point the grammar allows here.
  bool accept_byte(uint8_t b);
  // Accepts bytes up to the first that is refused; returns how many were accepted.
  size_t accept_bytes(std::string_view bytes);

  bool is_complete() const { return n_remain_ == 0 && complete_; }  // the input is a whole sentence
  bool can_continue() const;                                        // some non-empty continuation exists
  bool is_pending_utf8() const { return n_remain_ != 0; }

  void reset();  // back to the empty input
  void save(Snapshot& out) const;
  Snapshot snapshot() const {
    Snapshot s;
    save(s);
    return s;
  }
  // Throws ultra::Error when s holds nodes this matcher never made (a snapshot of another grammar).
  void restore(const Snapshot& s);
  // restore() without the checks, for a snapshot this matcher saved (token_mask.h's trie walks).
  void restore_trusted(const Snapshot& s);
  // The state whose only stack is `node` (a head this matcher made, or kEmptyStack), nothing pending.
  void set_single_head(uint32_t node);
  // The grammar elements of the top `depth` entries of stack `node` (a head), top first, into elems;
  // returns how many; *cut: the stack is deeper than that. Input that matches from those entries alone
  // without reaching their bottom matches the same way from `node`, whatever lies beneath (mask_tables.h).
  int stack_top(uint32_t node, int depth, uint32_t* elems, bool* cut) const;
  // The stack of elems[0..n) (top first) with nothing beneath, as made by stack_top() of some matcher of
  // the same grammar. Throws ultra::Error unless elems[0] is a character class and the others classes or
  // rule references.
  uint32_t push_stack(const uint32_t* elems, int n);

  const Grammar& grammar() const { return *g_; }
  const std::shared_ptr<const Grammar>& grammar_ptr() const { return g_; }
  const std::vector<uint32_t>& heads() const { return heads_; }  // node ids; kEmptyStack = complete
  size_t n_nodes() const { return nodes_.size(); }
  static constexpr uint32_t kEmptyStack = 0;

 private:
  struct Node {
    uint32_t elem;    // index into Grammar::elements: a Chars to match or a Rule to expand
    uint32_t parent;  // the rest of the stack (kEmptyStack at the bottom)
  };

  std::shared_ptr<const Grammar> g_;
  Limits limits_;
  std::vector<Node> nodes_;      // [n_nodes] interned stacks; [0] = the empty stack
  std::vector<uint32_t> slots_;  // [power of 2] open-addressing table of node ids, kFree if empty
  std::vector<uint32_t> mark_;   // [n_nodes] epoch at which the node was last expanded
  uint32_t epoch_ = 0;
  std::vector<uint32_t> heads_;    // current state: nodes whose element is Chars, or kEmptyStack
  std::vector<uint32_t> next_;     // heads being built by the current step
  std::vector<uint32_t> todo_;     // closure work list
  std::vector<uint32_t> initial_;  // heads of the empty input
  bool complete_ = false;          // heads_ holds kEmptyStack
  uint32_t partial_ = 0;
  uint8_t n_remain_ = 0, n_len_ = 0;

  static constexpr uint32_t kFree = UINT32_MAX;

  uint32_t intern(uint32_t elem, uint32_t parent);
  void rehash(size_t n_slots);
  void begin_step();
  void closure(uint32_t node);  // adds to next_ the heads reachable from node without consuming input
  void set_heads(const std::vector<uint32_t>& heads);
  bool allows_any_in(uint32_t lo, uint32_t hi) const;  // some head matches a code point in [lo, hi]
};

// The whole text is a sentence of the grammar.
bool grammar_accepts(const std::shared_ptr<const Grammar>& g, std::string_view text);
// The text can be continued into a sentence of the grammar (or is one).
bool grammar_accepts_prefix(const std::shared_ptr<const Grammar>& g, std::string_view text);

}  // namespace ultra::grammar
