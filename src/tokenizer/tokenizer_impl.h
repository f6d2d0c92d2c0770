// The state behind tok::Tokenizer (tokenizer.h), shared by its whole-text encoder (tokenizer.cpp) and its
// streaming one (encode_stream.cpp). Private to src/tokenizer.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/spm.h"
#include "tokenizer/tokenizer.h"

namespace ultra::tok {

namespace detail {

// Special / added tokens as a byte trie; find() gives the leftmost, then longest, eligible occurrence
// (HF's AddedVocabulary uses leftmost-longest Aho-Corasick).
class SpecialMatcher {
 public:
  void build(const Vocab& v) {
    nodes_.assign(1, Node{});
    first_.fill(false);
    for (size_t i = 0; i < v.tokens.size(); ++i) {
      const TokenType t = v.types[i];
      if (t != TokenType::Control && t != TokenType::UserDefined && t != TokenType::Unknown) continue;
      const std::string& s = v.tokens[i];
      if (s.empty()) continue;
      int32_t node = 0;
      for (unsigned char c : s) {
        const uint64_t key = (uint64_t)node << 8 | c;
        auto it = edges_.find(key);
        if (it == edges_.end()) {
          nodes_.push_back(Node{});
          it = edges_.emplace(key, (int32_t)nodes_.size() - 1).first;
        }
        node = it->second;
      }
      if (nodes_[node].token < 0) {
        nodes_[node].token = (int32_t)i;
        nodes_[node].always = t == TokenType::UserDefined;
      }
      first_[(unsigned char)s[0]] = true;
      any_ = true;
      max_len_ = std::max(max_len_, s.size());
      if (v.attrs[i] & kAttrLstrip) any_lstrip_ = true;
    }
  }

  // The longest token (bytes); whether any token strips the whitespace before it.
  size_t max_len() const { return max_len_; }
  bool any_lstrip() const { return any_lstrip_; }

  bool find(std::string_view text, size_t from, bool parse_special, size_t& begin, size_t& end,
            int32_t& id) const {
    return find_if(
        text, from, [&](bool always, size_t, size_t) { return always || parse_special; }, begin, end, id);
  }

  // find() with the eligibility of a token decided by ok(always, begin, end): always is true for a
  // user-defined token, [begin, end) is the occurrence's byte range. Occurrences are looked for at
  // [from, to) (to: text.size() unless given); they may extend to text.size().
  template <class Ok>
  bool find_if(std::string_view text, size_t from, const Ok& ok, size_t& begin, size_t& end, int32_t& id,
               size_t to = SIZE_MAX) const {
    if (!any_) return false;
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    to = std::min(to, n);
    for (size_t i = from; i < to; ++i) {
      if (!first_[p[i]]) continue;
      int32_t node = 0, best = -1;
      size_t best_end = 0;
      for (size_t k = i; k < n; ++k) {
        auto it = edges_.find((uint64_t)node << 8 | p[k]);
        if (it == edges_.end()) break;
        node = it->second;
        const Node& nd = nodes_[node];
        if (nd.token >= 0 && ok(nd.always, i, k + 1)) {
          best = nd.token;
          best_end = k + 1;
        }
      }
      if (best >= 0) {
        begin = i;
        end = best_end;
        id = best;
        return true;
      }
    }
    return false;
  }

 private:
  struct Node {
    int32_t token = -1;
    bool always = false;
  };
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> edges_;
  std::array<bool, 256> first_{};
  bool any_ = false;
  bool any_lstrip_ = false;
  size_t max_len_ = 0;
};

inline bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// Word -> ids cache for BPE pre-tokens, shared by all threads that encode with one Tokenizer. A hit costs
// one hash of the word, usually one probe and no lock: the cache is a series of tables (generations); a
// table's entries are written once, under the table's mutex, and published with a release store of the slot's
// hash, so readers only load. Each encode call pins the current table (a shared_ptr copy, once per call, not
// per word). Bounded: a table holds at most kMaxEntries words; when full, or on clear(), a new empty table
// replaces it and the old one is marked retired; an encode that holds a retired table moves to the current
// one at its next word, so a retired table lives until the encodes using it reach their next word.
class WordCache {
 public:
  static constexpr size_t kMaxWord = 64;
  static constexpr size_t kMaxEntries = 1 << 18;

  static uint64_t hash(std::string_view w) {
    const char* p = w.data();
    size_t n = w.size();
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    for (; n >= 8; p += 8, n -= 8) {
      uint64_t x;
      std::memcpy(&x, p, 8);
      h = (h ^ x) * 0xBF58476D1CE4E5B9ull;
      h ^= h >> 31;
    }
    if (n) {
      uint64_t x = 0;
      std::memcpy(&x, p, n);
      h = (h ^ x) * 0x94D049BB133111EBull;
      h ^= h >> 29;
    }
    h = (h ^ (h >> 32)) * 0xD6E8FEB86659FD93ull;
    return (h ^ (h >> 32)) | 1;  // 0 marks an empty slot
  }

  class Table;
  using Pin = std::shared_ptr<Table>;

  class Table {
   public:
    bool retired() const { return retired_.load(std::memory_order_relaxed); }

    bool find(std::string_view w, uint64_t h, std::vector<int32_t>& out) const {
      const Slots* a = slots_.load(std::memory_order_acquire);
      if (!a) return false;
      for (size_t i = h & a->mask;; i = (i + 1) & a->mask) {
        const uint64_t sh = a->slot[i].hash.load(std::memory_order_acquire);
        if (sh == 0) return false;
        if (sh != h) continue;
        const Entry* e = a->slot[i].entry.load(std::memory_order_relaxed);  // stored before the hash
        if (e->key_len == w.size() && std::memcmp(e->key(), w.data(), w.size()) == 0) {
          out.insert(out.end(), e->ids(), e->ids() + e->n_ids);
          return true;
        }
      }
    }

    // False when the table is full (nothing inserted).
    bool insert(std::string_view w, uint64_t h, const int32_t* ids, size_t n) {
      const size_t units = 1 + n + (w.size() + 3) / 4;  // int32 units: Entry header, ids, key
      if (w.size() > kMaxWord || n > 0xFFFF || units > kChunkUnits) return true;
      std::lock_guard<std::mutex> lock(mu_);
      if (count_ >= kMaxEntries) return false;
      Slots* a = slots_.load(std::memory_order_relaxed);  // only written under mu_
      if (!a || (count_ + 1) * 2 > a->mask + 1) a = grow(a);
      size_t i = h & a->mask;
      for (uint64_t sh; (sh = a->slot[i].hash.load(std::memory_order_relaxed)) != 0; i = (i + 1) & a->mask) {
        const Entry* e = a->slot[i].entry.load(std::memory_order_relaxed);
        if (sh == h && e->key_len == w.size() && std::memcmp(e->key(), w.data(), w.size()) == 0)
          return true;  // another thread got there first
      }
      if (chunk_used_ + units > kChunkUnits) {
        chunks_.push_back(std::make_unique<int32_t[]>(kChunkUnits));
        chunk_used_ = 0;
      }
      auto* e = new (chunks_.back().get() + chunk_used_) Entry{(uint16_t)w.size(), (uint16_t)n};
      chunk_used_ += units;
      if (n) std::memcpy(e->ids(), ids, n * sizeof(int32_t));  // ids may be null when n == 0
      std::memcpy(e->key(), w.data(), w.size());
      a->slot[i].entry.store(e, std::memory_order_relaxed);
      a->slot[i].hash.store(h, std::memory_order_release);  // publishes the entry
      ++count_;
      return true;
    }

   private:
    friend class WordCache;
    static constexpr size_t kChunkUnits = 1 << 14;  // 64 KiB arena chunks

    struct Entry {
      uint16_t key_len, n_ids;
      int32_t* ids() { return reinterpret_cast<int32_t*>(this + 1); }
      const int32_t* ids() const { return reinterpret_cast<const int32_t*>(this + 1); }
      char* key() { return reinterpret_cast<char*>(ids() + n_ids); }
      const char* key() const { return reinterpret_cast<const char*>(ids() + n_ids); }
    };
    static_assert(sizeof(Entry) == sizeof(int32_t));
    struct Slot {
      std::atomic<uint64_t> hash{0};
      std::atomic<const Entry*> entry{nullptr};
    };
    struct Slots {
      size_t mask;
      std::unique_ptr<Slot[]> slot;
    };

    // Read by every lookup, written rarely: a cache line of its own, away from the writers' state.
    alignas(64) std::atomic<Slots*> slots_{nullptr};
    std::atomic<bool> retired_{false};

    alignas(64) std::mutex mu_;
    size_t count_ = 0;
    // Every slot array stays until the table goes (a reader may still probe an outgrown one): at most twice
    // the last one's size.
    std::vector<std::unique_ptr<Slots>> all_slots_;
    std::vector<std::unique_ptr<int32_t[]>> chunks_;
    size_t chunk_used_ = kChunkUnits;

    Slots* grow(const Slots* old) {
      const size_t size = old ? (old->mask + 1) * 2 : 4096;
      auto a = std::make_unique<Slots>(Slots{size - 1, std::make_unique<Slot[]>(size)});
      if (old) {
        for (size_t k = 0; k <= old->mask; ++k) {
          const uint64_t h = old->slot[k].hash.load(std::memory_order_relaxed);
          if (h == 0) continue;
          size_t i = h & a->mask;
          while (a->slot[i].hash.load(std::memory_order_relaxed) != 0) i = (i + 1) & a->mask;
          a->slot[i].entry.store(old->slot[k].entry.load(std::memory_order_relaxed),
                                 std::memory_order_relaxed);
          a->slot[i].hash.store(h, std::memory_order_relaxed);
        }
      }
      Slots* p = a.get();
      all_slots_.push_back(std::move(a));
      slots_.store(p, std::memory_order_release);  // publishes the copied slots
      return p;
    }
  };

  // Makes `pin` hold the current table, unless it already holds one that is not retired.
  void refresh(Pin& pin) const {
    if (pin && !pin->retired()) return;
    std::lock_guard<std::mutex> lock(mu_);
    pin = cur_;
  }

  // Inserts into the pinned table; when that is full, starts a new one (unless another thread already did)
  // and moves `pin` to it.
  void insert(Pin& pin, std::string_view w, uint64_t h, const int32_t* ids, size_t n) {
    if (pin->insert(w, h, ids, n)) return;
    const Pin full = std::move(pin);  // released after the lock
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cur_ == full) replace_locked();
      pin = cur_;
    }
    pin->insert(w, h, ids, n);
  }

  void clear() {
    Pin old;
    std::lock_guard<std::mutex> lock(mu_);
    old = replace_locked();
  }

 private:
  mutable std::mutex mu_;
  Pin cur_ = std::make_shared<Table>();

  // Puts an empty table in place of the current one and retires that; returns it.
  Pin replace_locked() {
    Pin old = std::exchange(cur_, std::make_shared<Table>());
    old->retired_.store(true, std::memory_order_relaxed);
    return old;
  }
};

}  // namespace detail

struct Tokenizer::Impl {
  Vocab v;
  TokenIndex index;
  std::unique_ptr<PreTokenizer> pre;
  std::unique_ptr<BpeModel> bpe;
  std::unique_ptr<SpmModel> spm;
  detail::SpecialMatcher special;
  std::vector<std::string> pieces;
  std::vector<uint8_t> special_flag;
  size_t max_piece = 0;

  mutable detail::WordCache cache;

  explicit Impl(Vocab vocab);
  // pin: the word cache table this encode call uses (see WordCache).
  void encode_raw(std::string_view frag, bool at_text_start, detail::WordCache::Pin& pin,
                  std::vector<int32_t>& out) const;
  void encode_word(std::string_view w, detail::WordCache::Pin& pin, std::vector<int32_t>& out) const;
  // The first piece of a decoded text, after the leading-space rule (tmp: scratch for the result).
  std::string_view lead(int32_t id, std::string_view p, std::string& tmp) const {
    switch (v.leading_space) {
      case LeadingSpace::Keep:
        break;
      case LeadingSpace::StripOne:
        if (!p.empty() && p[0] == ' ') p.remove_prefix(1);
        break;
      case LeadingSpace::StripFirstToken:
        if (v.types[id] == TokenType::Byte) break;
        tmp.clear();
        for (char c : p)
          if (c != ' ') tmp += c;
        return tmp;
    }
    return p;
  }
  void check_id(int32_t id) const {
    if (id < 0 || (size_t)id >= v.tokens.size())
      fail("token id {} is out of range (the vocabulary has {} tokens)", id, v.tokens.size());
  }
};

}  // namespace ultra::tok
