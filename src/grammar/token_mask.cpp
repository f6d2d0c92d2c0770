#include "grammar/token_mask.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace ultra::grammar {

namespace {

// Set bits of x without a popcount instruction (the library is built for any x86-64, where std::popcount
// is a call into libgcc); the loop below vectorises.
inline uint32_t bits32(uint32_t x) {
  x = x - ((x >> 1) & 0x55555555u);
  x = (x & 0x33333333u) + ((x >> 2) & 0x33333333u);
  x = (x + (x >> 4)) & 0x0F0F0F0Fu;
  return (x * 0x01010101u) >> 24;
}

}  // namespace

int count_allowed(const uint32_t* mask, size_t n_words) {
  uint32_t n = 0;
  for (size_t w = 0; w < n_words; ++w) n += bits32(mask[w]);
  return (int)n;
}

TokenMask::TokenMask(std::shared_ptr<const MaskVocab> vocab, Matcher& m, Options opt)
    : TokenMask(std::make_shared<MaskTables>(m.grammar_ptr(), std::move(vocab)), m, opt) {}

TokenMask::TokenMask(std::shared_ptr<MaskTables> tables, Matcher& m, Options opt)
    : tables_(std::move(tables)), vocab_(tables_->vocab()), m_(m), opt_(opt), walk_(*vocab_) {
  if (tables_->grammar() != m_.grammar_ptr()) fail("grammar mask: the tables are of another grammar");
  saved_.heads.reserve(256);
  key_.reserve((size_t)std::max(opt_.cache_max_heads, 0) + 3);
  cache_.resize((size_t)std::max(opt_.cache_entries, 0));
  for (CacheEntry& e : cache_) {
    e.key.reserve(key_.capacity());
    e.mask.assign(n_words(), 0);
  }
}

void TokenMask::clear_cache() {
  for (CacheEntry& e : cache_) e.used = false;
  next_victim_ = 0;
}

void TokenMask::build_key() {
  key_.clear();
  const auto& heads = m_.heads();
  key_.insert(key_.end(), heads.begin(), heads.end());
  std::sort(key_.begin(), key_.end());
  Matcher::Snapshot& s = saved_;  // filled by the caller
  key_.push_back(s.partial);
  key_.push_back(s.n_remain);
  key_.push_back(s.n_len);
}

TokenMask::CacheEntry* TokenMask::find_cached(uint64_t h) {
  for (CacheEntry& e : cache_) {
    if (e.used && e.hash == h && e.key == key_) return &e;
  }
  return nullptr;
}

int TokenMask::compute(uint32_t* out) {
  ++stats_.calls;
  const MaskVocab& v = *vocab_;
  const size_t nw = n_words();
  m_.save(saved_);
  const bool cacheable = !cache_.empty() && m_.heads().size() <= (size_t)opt_.cache_max_heads;
  uint64_t h = 0;
  if (cacheable) {
    build_key();
    h = 0xcbf29ce484222325ull;
    for (uint32_t k : key_) h = (h ^ k) * 0x100000001b3ull;
    if (const CacheEntry* e = find_cached(h)) {
      ++stats_.cache_hits;
      std::memcpy(out, e->mask.data(), nw * sizeof(uint32_t));
      return e->count;
    }
  }
  std::memset(out, 0, nw * sizeof(uint32_t));
  auto allow = [&](int32_t tok) { out[(uint32_t)tok >> 5] |= 1u << (tok & 31); };
  bool complete = m_.is_complete();
  if (m_.is_pending_utf8()) {
    walk_.run(
        m_, TrieWalk::All{}, v.lcp, v.sorted.size(), [&](size_t i) { allow(v.sorted[i]); },
        [](size_t, size_t, bool) {});
  } else {
    // saved_.heads is the state's heads (compute() restores it at the end).
    for (size_t k = 0; k < saved_.heads.size(); ++k) {
      const uint32_t head = saved_.heads[k];
      if (head == Matcher::kEmptyStack) continue;
      bool cut = false;
      MaskTables::Top top;
      top.n = m_.stack_top(head, tables_->depth(), top.elem, &cut);
      const MaskTables::Table& t = tables_->get(top);
      const uint32_t* a = t.accept.data();
      for (size_t w = 0; w < nw; ++w) out[w] |= a[w];
      if (!cut || t.dependent.empty()) continue;  // uncut: the dependent tokens are refused
      m_.set_single_head(head);
      stats_.dependent_walked += (int64_t)t.dependent.size();
      walk_.run(
          m_, t.dependent, t.dep_lcp, t.dependent.size(), [&](size_t i) { allow(v.sorted[t.dependent[i]]); },
          [](size_t, size_t, bool) {});
    }
    m_.restore_trusted(saved_);
  }
  if (complete) {
    for (int32_t e : v.eog) allow(e);
  }
  const int count = count_allowed(out, nw);
  if (cacheable) {
    CacheEntry& e = cache_[(size_t)next_victim_];
    next_victim_ = (next_victim_ + 1) % (int)cache_.size();
    e.used = true;
    e.hash = h;
    e.key.assign(key_.begin(), key_.end());
    std::memcpy(e.mask.data(), out, nw * sizeof(uint32_t));
    e.count = count;
  }
  return count;
}

}  // namespace ultra::grammar
