#include "grammar/token_mask.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "core/error.h"

namespace ultra::grammar {

int count_allowed(const uint32_t* mask, size_t n_words) {
  int n = 0;
  for (size_t w = 0; w < n_words; ++w) n += std::popcount(mask[w]);
  return n;
}

TokenMask::TokenMask(std::shared_ptr<const MaskVocab> vocab, Matcher& m)
    : TokenMask(std::move(vocab), m, Options{}) {}

TokenMask::TokenMask(std::shared_ptr<const MaskVocab> vocab, Matcher& m, Options opt)
    : vocab_(std::move(vocab)), m_(m), opt_(opt) {
  if (!vocab_) fail("grammar mask: no vocabulary");
  opt_.context_depth = std::clamp(opt_.context_depth, 1, 32);
  st_.resize(vocab_->max_len + 1);
  for (auto& s : st_) s.heads.reserve(64);
  dep_.assign(vocab_->max_len + 1, 0);
  saved_.heads.reserve(256);
  key_.reserve((size_t)std::max(opt_.cache_max_heads, 0) + 3);
  cache_.resize((size_t)std::max(opt_.cache_entries, 0));
  for (CacheEntry& e : cache_) {
    e.key.reserve(key_.capacity());
    e.mask.assign(n_words(), 0);
  }
}

template <class List, class Lcp, class Accept, class Refuse>
void TokenMask::walk(const List& list, const Lcp& lcp, size_t n, Accept&& on_accept, Refuse&& on_refuse) {
  const MaskVocab& v = *vocab_;
  m_.save(st_[0]);
  dep_[0] = 0;
  size_t i = 0;
  while (i < n) {
    const std::string& b = v.bytes[v.sorted[list[i]]];
    size_t d = lcp[i];  // the state after these bytes is st_[d] (the previous token's path shares them)
    m_.restore_trusted(st_[d]);
    bool ok = true;
    for (; d < b.size(); ++d) {
      if (!m_.accept_byte((uint8_t)b[d])) {
        ok = false;
        break;
      }
      m_.save(st_[d + 1]);
      dep_[d + 1] = dep_[d] | (uint8_t)m_.is_complete();
    }
    if (ok) {
      on_accept(i);
      ++i;
      continue;
    }
    // Byte d refused after the prefix [0, d): so is every following token that shares [0, d].
    size_t j = i + 1;
    while (j < n && lcp[j] > d) ++j;
    on_refuse(i, j, dep_[d] != 0);
    i = j;
  }
  m_.restore_trusted(st_[0]);
}

const TokenMask::TopTable& TokenMask::table(uint32_t top) {
  auto it = tables_.find(top);
  if (it != tables_.end()) return *it->second;
  const MaskVocab& v = *vocab_;
  auto t = std::make_unique<TopTable>();
  t->accept.assign(n_words(), 0);
  m_.save(saved_table_);
  m_.set_single_head(top);
  struct Iota {
    int32_t operator[](size_t i) const { return (int32_t)i; }
  };
  walk(
      Iota{}, v.lcp, v.sorted.size(),
      [&](size_t i) {
        const int32_t tok = v.sorted[i];
        t->accept[(uint32_t)tok >> 5] |= 1u << (tok & 31);
      },
      [&](size_t first, size_t end, bool dep) {
        if (!dep) return;
        for (size_t k = first; k < end; ++k) t->dependent.push_back((int32_t)k);
      });
  m_.restore_trusted(saved_table_);
  t->dep_lcp.resize(t->dependent.size());
  for (size_t k = 0; k < t->dependent.size(); ++k) {
    t->dep_lcp[k] =
        k ? common_prefix(v.bytes[v.sorted[t->dependent[k - 1]]], v.bytes[v.sorted[t->dependent[k]]]) : 0;
  }
  ++stats_.tables_built;
  return *tables_.emplace(top, std::move(t)).first->second;
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
    struct Iota {
      int32_t operator[](size_t i) const { return (int32_t)i; }
    };
    walk(
        Iota{}, v.lcp, v.sorted.size(), [&](size_t i) { allow(v.sorted[i]); }, [](size_t, size_t, bool) {});
  } else {
    // saved_.heads is the state's heads (compute() restores it at the end).
    for (size_t k = 0; k < saved_.heads.size(); ++k) {
      const uint32_t head = saved_.heads[k];
      if (head == Matcher::kEmptyStack) continue;
      bool cut = false;
      const uint32_t top = m_.cut_stack(head, opt_.context_depth, &cut);
      const TopTable& t = table(top);
      const uint32_t* a = t.accept.data();
      for (size_t w = 0; w < nw; ++w) out[w] |= a[w];
      if (!cut || t.dependent.empty()) continue;  // uncut: the dependent tokens are refused
      m_.set_single_head(head);
      stats_.dependent_walked += (int64_t)t.dependent.size();
      walk(
          t.dependent, t.dep_lcp, t.dependent.size(), [&](size_t i) { allow(v.sorted[t.dependent[i]]); },
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
