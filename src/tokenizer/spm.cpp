#include "tokenizer/spm.h"

#include <algorithm>
#include <string>

#include "tokenizer/utf8.h"

namespace ultra::tok {

SpmModel::SpmModel(const Vocab& v, const TokenIndex& index) : index_(index), scores_(v.scores), unk_(v.unk) {
  static const char hex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const char buf[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
    byte_id_[b] = index.find(std::string_view(buf, 6));
  }
  for (const std::string& t : v.tokens) {
    max_len_ = std::max(max_len_, t.size());
    for (size_t k = 0; k + 1 < t.size(); ++k) inner_[(unsigned char)t[k]] = true;
  }
}

bool SpmModel::straddled(std::string_view text, size_t from, size_t p) const {
  for (size_t a = p - std::min(p - from, max_len_ - 1); a < p; ++a)
    for (size_t b = p + 1; b <= text.size() && b - a <= max_len_; ++b)
      if (index_.find(text.substr(a, b - a)) >= 0) return true;
  return false;
}

size_t SpmModel::cut(std::string_view text, size_t from, size_t to) const {
  if (text.size() < from + max_len_) return 0;
  to = std::min(to, text.size() - (max_len_ - 1));
  int full_checks = 64;
  for (size_t p = to; p > from && full_checks > 0; --p) {
    const auto c = (unsigned char)text[p - 1];
    if (c >= 0x80 || (index_.find(text.substr(p - 1, 1)) < 0 && byte_id_[c] < 0)) continue;
    if (!inner_[c]) return p;
    --full_checks;
    if (!straddled(text, from, p)) return p;
  }
  return 0;
}

namespace {

struct SpmSym {
  uint32_t off, len;  // len 0: merged away
  int32_t prev, next;
};

struct SpmBigram {
  float score;
  int32_t left, right;
  uint32_t size;
};

// Max-heap order: highest score, then leftmost.
struct SpmBigramBefore {
  bool operator()(const SpmBigram& a, const SpmBigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

struct SpmScratch {
  std::vector<SpmSym> syms;
  std::vector<SpmBigram> heap;
};

SpmScratch& spm_scratch() {
  thread_local SpmScratch s;
  return s;
}

}  // namespace

void SpmModel::encode(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  SpmScratch& s = spm_scratch();
  auto& syms = s.syms;
  syms.clear();
  for (size_t i = 0; i < text.size();) {
    const size_t len = utf8::unit_len(text.data() + i, text.size() - i);
    syms.push_back(SpmSym{(uint32_t)i, (uint32_t)len, (int32_t)syms.size() - 1, (int32_t)syms.size() + 1});
    i += len;
  }
  syms.back().next = -1;

  auto& heap = s.heap;
  heap.clear();
  auto try_pair = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const uint32_t size = syms[l].len + syms[r].len;
    const int32_t id = index_.find(text.substr(syms[l].off, size));
    if (id < 0) return;
    heap.push_back(SpmBigram{scores_.empty() ? 0.0f : scores_[id], l, r, size});
    std::push_heap(heap.begin(), heap.end(), SpmBigramBefore{});
  };
  for (int32_t i = 0; i + 1 < (int32_t)syms.size(); ++i) try_pair(i, i + 1);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), SpmBigramBefore{});
    const SpmBigram b = heap.back();
    heap.pop_back();
    SpmSym& L = syms[b.left];
    SpmSym& R = syms[b.right];
    if (L.len == 0 || R.len == 0 || L.len + R.len != b.size) continue;
    L.len += R.len;
    R.len = 0;
    L.next = R.next;
    if (R.next >= 0) syms[R.next].prev = b.left;
    try_pair(L.prev, b.left);
    try_pair(b.left, L.next);
  }

  bool prev_unk = false;
  for (int32_t i = 0; i >= 0; i = syms[i].next) {
    const SpmSym& sym = syms[i];
    const std::string_view piece = text.substr(sym.off, sym.len);
    const int32_t id = index_.find(piece);
    if (id >= 0) {
      out.push_back(id);
      prev_unk = false;
      continue;
    }
    bool all = true;
    for (unsigned char c : piece) all = all && byte_id_[c] >= 0;
    if (all) {
      for (unsigned char c : piece) out.push_back(byte_id_[c]);
      prev_unk = false;
    } else if (unk_ >= 0) {
      if (!prev_unk) out.push_back(unk_);
      prev_unk = true;
    }
  }
}

}  // namespace ultra::tok
