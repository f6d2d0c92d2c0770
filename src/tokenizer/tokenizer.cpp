#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace ultra::tok {

namespace {

using detail::is_space;
using detail::WordCache;

struct EncodeScratch {
  std::string norm;
  std::vector<std::string_view> words;
};

EncodeScratch& encode_scratch() {
  thread_local EncodeScratch s;
  return s;
}

}  // namespace

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
