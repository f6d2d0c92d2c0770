#include "engine/seq_constraint.h"

#include <cstring>

#include "core/error.h"
#include "grammar/gbnf_parser.h"

namespace ultra {

namespace {

std::shared_ptr<const grammar::Grammar> parse(std::string_view gbnf) {
  return std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(gbnf));
}

}  // namespace

SeqConstraint::SeqConstraint(std::string_view gbnf, std::shared_ptr<const grammar::MaskVocab> vocab)
    : vocab_(std::move(vocab)), m_(parse(gbnf)), tm_(vocab_, m_) {}

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
  m_.reset();
  consumed_ = start_;
  if (broken_at_ >= n) broken_at_ = -1;
}

void SeqConstraint::mask(const int32_t* tokens, int pos, uint32_t* out) {
  if (start_ < 0) start_ = consumed_ = pos + 1;
  for (; consumed_ <= pos && broken_at_ < 0; ++consumed_) {
    const int32_t t = tokens[consumed_];
    const bool text = t >= 0 && t < vocab_->n_vocab && !vocab_->bytes[t].empty();
    if (!text || m_.accept_bytes(vocab_->bytes[t]) != vocab_->bytes[t].size()) broken_at_ = consumed_;
  }
  if (broken_at_ >= 0 || tm_.compute(out) == 0) end_only(out);
}

}  // namespace ultra
