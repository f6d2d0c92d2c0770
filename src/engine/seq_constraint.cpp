#include "engine/seq_constraint.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "grammar/gbnf_parser.h"

namespace ultra {

std::shared_ptr<grammar::MaskTables> grammar_tables(GrammarTablesCache& cache, std::string_view gbnf,
                                                    const std::shared_ptr<const grammar::MaskVocab>& vocab) {
  auto& e = cache.entries;
  for (size_t i = 0; i < e.size(); ++i) {
    if (e[i].first != gbnf) continue;
    std::rotate(e.begin() + (std::ptrdiff_t)i, e.begin() + (std::ptrdiff_t)i + 1,
                e.end());  // most recent last
    return e.back().second;
  }
  auto g = std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(gbnf));
  if (e.size() >= GrammarTablesCache::kMaxGrammars) e.erase(e.begin());
  e.emplace_back(std::string(gbnf), std::make_shared<grammar::MaskTables>(std::move(g), vocab));
  return e.back().second;
}

SeqConstraint::SeqConstraint(std::shared_ptr<grammar::MaskTables> tables)
    : vocab_(tables->vocab()), m_(tables->grammar()), tm_(std::move(tables), m_) {
  ring_.resize(kRing);
  for (grammar::Matcher::Snapshot& s : ring_) s.heads.reserve(64);
  ring_pos_.assign(kRing, -1);
}

void SeqConstraint::keep_state(int pos) {
  m_.save(ring_[(size_t)pos % kRing]);
  ring_pos_[(size_t)pos % kRing] = pos;
}

void SeqConstraint::end_only(uint32_t* out) const {
  std::memset(out, 0, vocab_->n_words() * sizeof(uint32_t));
  for (int32_t e : vocab_->eog) out[(uint32_t)e >> 5] |= 1u << (e & 31);
}

void SeqConstraint::crop(int n) {
  if (start_ < 0) return;
  if (n < start_) {
    start_ = -1;
  } else if (n >= consumed_) {
    return;
  }
  if (broken_at_ >= n) broken_at_ = -1;
  if (start_ >= 0 && ring_pos_[(size_t)n % kRing] == n) {  // the state after the tokens [start, n) was kept
    m_.restore_trusted(ring_[(size_t)n % kRing]);
    consumed_ = n;
    return;
  }
  m_.reset();
  consumed_ = start_;
}

void SeqConstraint::mask(const int32_t* tokens, int pos, uint32_t* out) {
  if (start_ < 0) {
    start_ = consumed_ = pos + 1;
    std::fill(ring_pos_.begin(), ring_pos_.end(), -1);
    keep_state(start_);
  }
  for (; consumed_ <= pos && broken_at_ < 0; ++consumed_) {
    const int32_t t = tokens[consumed_];
    const bool text = t >= 0 && t < vocab_->n_vocab && !vocab_->bytes[t].empty();
    if (!text || m_.accept_bytes(vocab_->bytes[t]) != vocab_->bytes[t].size()) {
      broken_at_ = consumed_;
    } else {
      keep_state(consumed_ + 1);
    }
  }
  if (broken_at_ >= 0 || tm_.compute(out) == 0) end_only(out);
}

}  // namespace ultra
