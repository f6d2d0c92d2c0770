// ultra::Batch: the rows of one step (include/ultra/context.h).
#include "core/error.h"
#include "ultra/context.h"

namespace ultra {

Batch::Batch(int capacity) {
  if (capacity <= 0) fail("batch: capacity must be >= 1 (got {})", capacity);
  token_.resize(capacity);
  pos_.resize(capacity);
  seq_.resize(capacity);
  out_.resize(capacity);
  from_.resize(capacity);
}

int Batch::add(RowToken token, int32_t pos, int32_t seq, Output out) {
  if (n_ >= capacity()) fail("batch: full ({} rows)", capacity());
  token_[n_] = token.value;
  from_[n_] = token.from;
  pos_[n_] = pos;
  seq_[n_] = seq;
  out_[n_] = out;
  return n_++;
}

void Batch::add_sequence(std::span<const int32_t> tokens, int32_t pos0, int32_t seq, Output last) {
  if ((int64_t)n_ + (int64_t)tokens.size() > capacity())
    fail("batch: {} more rows do not fit ({} of {} used)", tokens.size(), n_, capacity());
  for (size_t i = 0; i < tokens.size(); ++i)
    add(tokens[i], pos0 + (int32_t)i, seq, i + 1 == tokens.size() ? last : Output::none);
}

}  // namespace ultra
