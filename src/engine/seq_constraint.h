// A sequence's grammar constraint (Context::set_grammar): the grammar's matcher and token mask, kept in
// step with the sequence's tokens.
//
// The constraint covers the tokens from `start` on: the position after the first row with an output (sample
// or logits) after the constraint was set (or after a crop below it). Its state is derived from the sequence,
// like the rest of the sampling state: before a sample row at position p (which draws the token of p + 1) the
// matcher is fed the sequence's tokens [consumed, p + 1), so tokens given as input (a forced prefix, a
// speculative draft) count like drawn ones. The matcher's states after the last kRing positions are kept,
// so a crop back among them (a speculative rollback) restores one; a crop further back resets the matcher
// and the tokens are fed again at the next sample row (seen input: no allocation). A token the grammar
// refuses (given as input, or a control token) breaks the constraint: until a crop before it, only
// end-of-generation tokens are allowed, and so are they at a dead end (no token can continue the input), so a
// sequence always ends cleanly.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "grammar/grammar_matcher.h"
#include "grammar/mask_tables.h"
#include "grammar/mask_vocab.h"
#include "grammar/token_mask.h"

namespace ultra {

// The tables of a grammar text for a vocabulary: one per text, kept in `cache` (the most recent kMaxGrammars
// texts; tables in use by a sequence stay alive with it). Throws ultra::Error with the parser's message for
// a bad grammar.
struct GrammarTablesCache {
  static constexpr size_t kMaxGrammars = 16;
  std::vector<std::pair<std::string, std::shared_ptr<grammar::MaskTables>>> entries;  // most recent last
};
std::shared_ptr<grammar::MaskTables> grammar_tables(GrammarTablesCache& cache, std::string_view gbnf,
                                                    const std::shared_ptr<const grammar::MaskVocab>& vocab);

class SeqConstraint {
 public:
  // tables: of the grammar and the vocabulary (grammar_tables()), shared with the other sequences that use
  // the same grammar.
  explicit SeqConstraint(std::shared_ptr<grammar::MaskTables> tables);

  // The allowed tokens for the token after row position pos (a sample or logits row; tokens: the
  // sequence's, by position, [0, pos] known): out[vocab.n_words()]. Allocates nothing once the states met
  // were seen before.
  void mask(const int32_t* tokens, int pos, uint32_t* out);
  // The sequence was cropped to n tokens.
  void crop(int n);

  const grammar::Matcher& matcher() const { return m_; }
  bool broken() const { return broken_at_ >= 0; }

 private:
  std::shared_ptr<const grammar::MaskVocab> vocab_;
  grammar::Matcher m_;
  grammar::TokenMask tm_;
  int start_ = -1;      // position of the first constrained token (-1: set at the next sample row)
  int consumed_ = 0;    // tokens [start_, consumed_) are fed to the matcher
  int broken_at_ = -1;  // position of a refused token (-1: none)
  static constexpr int kRing = 64;
  std::vector<grammar::Matcher::Snapshot>
      ring_;                   // [kRing] the state after the tokens [start_, p), at p % kRing
  std::vector<int> ring_pos_;  // [kRing] the p of each entry (-1: none)

  void keep_state(int pos);

  void end_only(uint32_t* out) const;  // only the end-of-generation tokens
};

}  // namespace ultra
