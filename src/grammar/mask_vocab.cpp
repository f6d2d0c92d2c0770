#include "grammar/mask_vocab.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace ultra::grammar {

uint16_t common_prefix(const std::string& a, const std::string& b) {
  const size_t n = std::min({a.size(), b.size(), (size_t)UINT16_MAX});
  size_t k = 0;
  while (k < n && a[k] == b[k]) ++k;
  return (uint16_t)k;
}

MaskVocab::MaskVocab(std::vector<std::string> bytes_, std::vector<int32_t> eog_)
    : n_vocab((int32_t)bytes_.size()), bytes(std::move(bytes_)), eog(std::move(eog_)) {
  if (n_vocab <= 0) fail("grammar mask: empty vocabulary");
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  for (int32_t t : eog) {
    if (t < 0 || t >= n_vocab)
      fail("grammar mask: end-of-generation token {} out of range [0, {})", t, n_vocab);
    bytes[t].clear();
  }
  for (int32_t t = 0; t < n_vocab; ++t) {
    if (bytes[t].size() > UINT16_MAX) bytes[t].clear();
    if (!bytes[t].empty()) sorted.push_back(t);
  }
  std::sort(sorted.begin(), sorted.end(),
            [&](int32_t a, int32_t b) { return bytes[a] < bytes[b] || (bytes[a] == bytes[b] && a < b); });
  lcp.resize(sorted.size());
  for (size_t i = 0; i < sorted.size(); ++i) {
    lcp[i] = i ? common_prefix(bytes[sorted[i - 1]], bytes[sorted[i]]) : 0;
    max_len = std::max(max_len, bytes[sorted[i]].size());
  }
}

std::shared_ptr<const MaskVocab> MaskVocab::from_tokenizer(const tok::Tokenizer& t) {
  std::vector<std::string> bytes(t.n_vocab());
  for (int32_t id = 0; id < t.n_vocab(); ++id) {
    const tok::TokenType ty = t.token_type(id);
    if (t.is_special(id) || ty == tok::TokenType::Unused) continue;
    bytes[id] = std::string(t.token_to_piece(id));
  }
  std::vector<int32_t> eog(t.eog_ids().begin(), t.eog_ids().end());
  return std::make_shared<const MaskVocab>(std::move(bytes), std::move(eog));
}

}  // namespace ultra::grammar
