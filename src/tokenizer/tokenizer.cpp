#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/spm.h"
#include "tokenizer/utf8.h"

namespace ultra::tok {

namespace {

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
    }
  }

  bool find(std::string_view text, size_t from, bool parse_special, size_t& begin, size_t& end,
            int32_t& id) const {
    return find_if(
        text, from, [&](bool always, size_t, size_t) { return always || parse_special; }, begin, end, id);
  }

  // find() with the eligibility of a token decided by ok(always, begin, end): always is true for a
  // user-defined token, [begin, end) is the occurrence's byte range.
  template <class Ok>
  bool find_if(std::string_view text, size_t from, const Ok& ok, size_t& begin, size_t& end,
               int32_t& id) const {
    if (!any_) return false;
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    for (size_t i = from; i < n; ++i) {
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
};

bool is_space(char c) {
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

struct EncodeScratch {
  std::string norm;
  std::vector<std::string_view> words;
};

EncodeScratch& encode_scratch() {
  thread_local EncodeScratch s;
  return s;
}

}  // namespace

struct Tokenizer::Impl {
  Vocab v;
  TokenIndex index;
  std::unique_ptr<PreTokenizer> pre;
  std::unique_ptr<BpeModel> bpe;
  std::unique_ptr<SpmModel> spm;
  SpecialMatcher special;
  std::vector<std::string> pieces;
  std::vector<uint8_t> special_flag;
  size_t max_piece = 0;

  mutable WordCache cache;

  explicit Impl(Vocab vocab);
  // pin: the word cache table this encode call uses (see WordCache).
  void encode_raw(std::string_view frag, bool at_text_start, WordCache::Pin& pin,
                  std::vector<int32_t>& out) const;
  void encode_word(std::string_view w, WordCache::Pin& pin, std::vector<int32_t>& out) const;
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

Tokenizer::Impl::Impl(Vocab vocab) : v(std::move(vocab)) {
  const size_t n = v.tokens.size();
  const std::string& src = v.source;
  if (n == 0) fail("{}: empty vocabulary", src);
  if (n > (size_t)INT32_MAX) fail("{}: {} tokens is too many", src, n);
  if (v.types.empty()) v.types.assign(n, TokenType::Normal);
  if (v.types.size() != n) fail("{}: {} token types for {} tokens", src, v.types.size(), n);
  if (v.attrs.empty()) v.attrs.assign(n, 0);
  if (v.attrs.size() != n) fail("{}: {} token attributes for {} tokens", src, v.attrs.size(), n);
  if (!v.scores.empty() && v.scores.size() != n) fail("{}: {} scores for {} tokens", src, v.scores.size(), n);
  if (v.kind == ModelKind::Spm && v.scores.empty()) v.scores.assign(n, 0.0f);
  const std::pair<const char*, int32_t> ids[] = {{"bos", v.bos}, {"eos", v.eos}, {"eot", v.eot},
                                                 {"eom", v.eom}, {"pad", v.pad}, {"unk", v.unk}};
  for (const auto& [name, id] : ids)
    if (id < -1 || id >= (int64_t)n)
      fail("{}: {} token id {} is out of range (the vocabulary has {} tokens)", src, name, id, n);
  if (v.add_bos && v.bos < 0) fail("{}: add_bos is set but there is no BOS token", src);
  if (v.add_eos && v.eos < 0) fail("{}: add_eos is set but there is no EOS token", src);

  index.build(v.tokens, src);
  special.build(v);
  pre = std::make_unique<PreTokenizer>(v.kind == ModelKind::Bpe ? v.splits : std::vector<SplitRule>{});
  if (v.kind == ModelKind::Bpe) {
    bpe = std::make_unique<BpeModel>(v, index);
  } else {
    spm = std::make_unique<SpmModel>(v, index);
  }

  // Decoded pieces.
  pieces.resize(n);
  special_flag.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& t = v.tokens[i];
    const TokenType type = v.types[i];
    std::string& p = pieces[i];
    special_flag[i] = type == TokenType::Control || type == TokenType::Unknown;
    if (type == TokenType::Control || type == TokenType::Unknown || type == TokenType::UserDefined) {
      p = t;
    } else if (type == TokenType::Byte) {
      // A byte-fallback token must be <0xHH>: its piece is that byte.
      auto hex = [](char ch) { return std::isxdigit((unsigned char)ch) != 0; };
      if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>' || !hex(t[3]) || !hex(t[4]))
        fail("{}: token {} '{}' has type byte but is not of the form <0xHH>", src, i, t);
      p.assign(1, (char)std::stoi(t.substr(3, 2), nullptr, 16));
    } else if (v.kind == ModelKind::Bpe && v.byte_level) {
      // Undo the byte mapping; a token with a character outside the map is kept as is (HF's ByteLevel
      // decoder).
      bool ok = true;
      for (size_t k = 0; k < t.size();) {
        const size_t len = utf8::unit_len(t.data() + k, t.size() - k);
        const int b = utf8::classify((const unsigned char*)t.data() + k, t.size() - k) > 0
                          ? utf8::cp_to_byte(utf8::decode(t.data() + k, len))
                          : -1;
        if (b < 0) {
          ok = false;
          break;
        }
        p += (char)b;
        k += len;
      }
      if (!ok) p = t;
    } else {
      // SentencePiece: U+2581 -> space.
      for (size_t k = 0; k < t.size();) {
        if (t.compare(k, 3, utf8::kMetaSpace) == 0) {
          p += ' ';
          k += 3;
        } else {
          p += t[k++];
        }
      }
    }
    max_piece = std::max(max_piece, p.size());
  }
}

void Tokenizer::Impl::encode_word(std::string_view w, WordCache::Pin& pin, std::vector<int32_t>& out) const {
  if (w.size() > WordCache::kMaxWord) {
    bpe->encode_word(w, out);
    return;
  }
  const uint64_t h = WordCache::hash(w);
  cache.refresh(pin);
  if (pin->find(w, h, out)) return;
  const size_t before = out.size();
  bpe->encode_word(w, out);
  cache.insert(pin, w, h, out.data() + before, out.size() - before);
}

void Tokenizer::Impl::encode_raw(std::string_view frag, bool at_text_start, WordCache::Pin& pin,
                                 std::vector<int32_t>& out) const {
  EncodeScratch& s = encode_scratch();
  std::string_view text = frag;
  const bool prepend =
      v.prepend == PrependScheme::Always || (v.prepend == PrependScheme::First && at_text_start);
  if (v.escape_spaces || prepend) {
    const std::string_view prefix = v.escape_spaces ? utf8::kMetaSpace : std::string_view(" ");
    s.norm.clear();
    if (v.escape_spaces) {
      for (char c : frag) {
        if (c == ' ')
          s.norm += utf8::kMetaSpace;
        else
          s.norm += c;
      }
    } else {
      s.norm.assign(frag);
    }
    if (prepend && (v.prepend_always || s.norm.compare(0, prefix.size(), prefix) != 0))
      s.norm.insert(0, prefix);
    text = s.norm;
  }
  if (spm) {
    spm->encode(text, out);
    return;
  }
  if (pre->empty()) {
    encode_word(text, pin, out);
    return;
  }
  auto& words = s.words;
  words.clear();
  pre->split(text, words);
  for (auto w : words) encode_word(w, pin, out);
}

Tokenizer::Tokenizer(Vocab vocab) : impl_(std::make_shared<Impl>(std::move(vocab))) {}

Tokenizer Tokenizer::from_file(const std::string& path) {
  return Tokenizer(load_vocab(path));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  std::vector<int32_t> out;
  encode(text, out, add_special, parse_special);
  return out;
}

namespace {

// Tokenizer::encode with the special-token matches that ok(always, begin, end) accepts (see
// SpecialMatcher::find_if).
template <class Ok>
void encode_text(const Tokenizer::Impl& m, std::string_view text, std::vector<int32_t>& out, bool add_special,
                 const Ok& ok) {
  if (add_special && m.v.add_bos) out.push_back(m.v.bos);
  WordCache::Pin pin;  // taken at the first cached word
  size_t pos = 0;
  while (pos < text.size()) {
    size_t b = 0, e = 0;
    int32_t id = -1;
    const bool found = m.special.find_if(text, pos, ok, b, e, id);
    size_t raw_end = found ? b : text.size();
    if (found && (m.v.attrs[id] & kAttrLstrip))
      while (raw_end > pos && is_space(text[raw_end - 1])) --raw_end;
    if (raw_end > pos) m.encode_raw(text.substr(pos, raw_end - pos), pos == 0, pin, out);
    if (!found) break;
    out.push_back(id);
    pos = e;
    if (m.v.attrs[id] & kAttrRstrip)
      while (pos < text.size() && is_space(text[pos])) ++pos;
  }
  if (add_special && m.v.add_eos) out.push_back(m.v.eos);
}

}  // namespace

void Tokenizer::encode(std::string_view text, std::vector<int32_t>& out, bool add_special,
                       bool parse_special) const {
  encode_text(*impl_, text, out, add_special,
              [parse_special](bool always, size_t, size_t) { return always || parse_special; });
}

void Tokenizer::encode_with_literal(std::string_view text, std::span<const Span> literal,
                                    std::vector<int32_t>& out, bool add_special) const {
  for (size_t i = 0; i < literal.size(); ++i) {
    const Span& s = literal[i];
    if (s.begin >= s.end || s.end > text.size() || (i > 0 && s.begin < literal[i - 1].end))
      fail("encode_with_literal: span {} [{}, {}) is empty, out of the text ({} bytes) or out of order", i,
           s.begin, s.end, text.size());
  }
  // An occurrence [b, e) is eligible unless it overlaps a span: the first span ending after b must begin at
  // or after e.
  const auto ok = [literal](bool always, size_t b, size_t e) {
    if (always) return true;
    const auto it = std::upper_bound(literal.begin(), literal.end(), b,
                                     [](size_t x, const Span& s) { return x < s.end; });
    return it == literal.end() || it->begin >= e;
  };
  encode_text(*impl_, text, out, add_special, ok);
}

int32_t Tokenizer::find_special(std::string_view text, size_t* at) const {
  size_t b = 0, e = 0;
  int32_t id = -1;
  if (!impl_->special.find_if(
          text, 0, [](bool always, size_t, size_t) { return !always; }, b, e, id))
    return -1;
  if (at) *at = b;
  return id;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const Impl& m = *impl_;
  std::string out, tmp;
  bool at_start = true;
  for (int32_t id : ids) {
    m.check_id(id);
    if (skip_special && m.special_flag[id]) continue;
    std::string_view p = m.pieces[id];
    if (at_start && !p.empty()) {
      p = m.lead(id, p, tmp);
      at_start = false;
    }
    out += p;
  }
  return out;
}

std::string_view Tokenizer::token_to_piece(int32_t id) const {
  impl_->check_id(id);
  return impl_->pieces[id];
}

const std::string& Tokenizer::token_text(int32_t id) const {
  impl_->check_id(id);
  return impl_->v.tokens[id];
}

TokenType Tokenizer::token_type(int32_t id) const {
  impl_->check_id(id);
  return impl_->v.types[id];
}

bool Tokenizer::is_special(int32_t id) const {
  impl_->check_id(id);
  return impl_->special_flag[id];
}

int32_t Tokenizer::find_token(std::string_view text) const {
  return impl_->index.find(text);
}
int32_t Tokenizer::n_vocab() const {
  return (int32_t)impl_->v.tokens.size();
}
int32_t Tokenizer::bos() const {
  return impl_->v.bos;
}
int32_t Tokenizer::eos() const {
  return impl_->v.eos;
}
int32_t Tokenizer::eot() const {
  return impl_->v.eot;
}
int32_t Tokenizer::eom() const {
  return impl_->v.eom;
}
int32_t Tokenizer::pad() const {
  return impl_->v.pad;
}
int32_t Tokenizer::unk() const {
  return impl_->v.unk;
}
bool Tokenizer::add_bos() const {
  return impl_->v.add_bos;
}
bool Tokenizer::add_eos() const {
  return impl_->v.add_eos;
}
bool Tokenizer::is_eog(int32_t id) const {
  const Vocab& v = impl_->v;
  return std::binary_search(v.eog.begin(), v.eog.end(), id);
}
std::span<const int32_t> Tokenizer::eog_ids() const {
  return impl_->v.eog;
}
ModelKind Tokenizer::kind() const {
  return impl_->v.kind;
}
const std::string& Tokenizer::pre() const {
  return impl_->v.pre;
}
const Vocab& Tokenizer::vocab() const {
  return impl_->v;
}
size_t Tokenizer::max_piece_bytes() const {
  return impl_->max_piece;
}

void Tokenizer::clear_cache() const {
  impl_->cache.clear();
}

// ---- Detokenizer ----

Detokenizer::Detokenizer(const Tokenizer& tok) : Detokenizer(tok, Options{}) {}

Detokenizer::Detokenizer(const Tokenizer& tok, Options opt) : impl_(tok.impl_), opt_(opt) {
  // Worst case per push: a tail of 3 bytes plus the piece, each byte becoming a 3-byte U+FFFD.
  max_out_ = 3 * (impl_->max_piece + 4);
  queue_.reserve(2 * max_out_ + 16);
  lead_.reserve(impl_->max_piece);
}

void Detokenizer::reset() {
  queue_.clear();
  queue_pos_ = 0;
  tail_len_ = 0;
  at_start_ = true;
}

void Detokenizer::feed(std::string_view bytes) {
  // Compact the queue first so that appending stays within the reserved capacity when the caller keeps up.
  if (queue_pos_ > 0) {
    queue_.erase(0, queue_pos_);
    queue_pos_ = 0;
  }
  auto emit_invalid = [&](const unsigned char* p, size_t k) {
    if (opt_.replace_invalid)
      queue_ += utf8::kReplacement;
    else
      queue_.append(reinterpret_cast<const char*>(p), k);
  };
  size_t i = 0;
  // Complete the pending tail with bytes from the front of `bytes`.
  while (tail_len_ > 0 && i < bytes.size()) {
    tail_[tail_len_++] = (unsigned char)bytes[i++];
    const int k = utf8::classify(tail_, tail_len_);
    if (k == 0) continue;  // still a valid prefix (tail_len_ <= 3 here)
    if (k > 0) {
      queue_.append(reinterpret_cast<const char*>(tail_), (size_t)k);
      tail_len_ = 0;
    } else {
      // Ill-formed: the first -k bytes are one maximal subpart; the rest is re-examined.
      const size_t bad = (size_t)-k;
      emit_invalid(tail_, bad);
      const size_t rest = tail_len_ - bad;
      tail_len_ = 0;
      i -= rest;  // those bytes came from `bytes` (the tail before was a valid prefix)
    }
  }
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  while (i < n) {
    if (p[i] < 0x80) {
      size_t j = i;
      while (j < n && p[j] < 0x80) ++j;
      queue_.append(bytes.data() + i, j - i);
      i = j;
      continue;
    }
    const int k = utf8::classify(p + i, n - i);
    if (k > 0) {
      queue_.append(bytes.data() + i, (size_t)k);
      i += (size_t)k;
    } else if (k == 0) {
      tail_len_ = n - i;
      std::memcpy(tail_, p + i, tail_len_);
      i = n;
    } else {
      emit_invalid(p + i, (size_t)-k);
      i += (size_t)-k;
    }
  }
}

size_t Detokenizer::drain(char* out, size_t cap) {
  const size_t k = std::min(cap, queue_.size() - queue_pos_);
  if (k) std::memcpy(out, queue_.data() + queue_pos_, k);
  queue_pos_ += k;
  if (queue_pos_ == queue_.size()) {
    queue_.clear();
    queue_pos_ = 0;
  }
  return k;
}

size_t Detokenizer::push(int32_t id, char* out, size_t cap) {
  const Tokenizer::Impl& m = *impl_;
  m.check_id(id);
  if (!(opt_.skip_special && m.special_flag[id])) {
    std::string_view p = m.pieces[id];
    if (at_start_ && !p.empty()) {
      p = m.lead(id, p, lead_);
      at_start_ = false;
    }
    feed(p);
  }
  return drain(out, cap);
}

size_t Detokenizer::flush(char* out, size_t cap) {
  if (tail_len_ > 0) {
    if (queue_pos_ > 0) {
      queue_.erase(0, queue_pos_);
      queue_pos_ = 0;
    }
    if (opt_.replace_invalid)
      queue_ += utf8::kReplacement;
    else
      queue_.append(reinterpret_cast<const char*>(tail_), tail_len_);
    tail_len_ = 0;
  }
  return drain(out, cap);
}

}  // namespace ultra::tok
