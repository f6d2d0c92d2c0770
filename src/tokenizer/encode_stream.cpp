#include "tokenizer/encode_stream.h"

#include <algorithm>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace ultra::tok {

using detail::is_space;

struct EncodeStream::State {
  std::shared_ptr<const Tokenizer::Impl> m;
  bool add_special = false, parse_special = false;
  size_t chunk = 0;
  bool started = false, finished = false;

  // Input not yet given to a raw fragment or taken as a special token; no occurrence of one starts in
  // in[0, searched).
  std::string in;
  size_t in_off = 0;  // offset of in[0] in the whole text
  size_t searched = 0;
  size_t lead_ws = 0;    // in[0, lead_ws) is whitespace (held back for a token that may strip it)
  bool skip_ws = false;  // after a token that strips the whitespace on its right

  // The raw fragment being encoded, normalised: norm[0, done) is encoded already (what is kept of it is the
  // context the pre-tokenizer's lookbehinds may see).
  bool in_frag = false;
  bool prefix_pending = false;  // the prefix rule waits for the fragment's first bytes
  std::string norm;
  size_t done = 0;
  size_t next_try = 0;  // look for a cut once norm.size() - done reaches this
  std::vector<std::string_view> words;
  detail::WordCache::Pin pin;

  void start(std::vector<int32_t>& out) {
    if (started) return;
    started = true;
    if (add_special && m->v.add_bos) out.push_back(m->v.bos);
  }

  void consume(size_t k) {
    in.erase(0, k);
    in_off += k;
    searched -= std::min(searched, k);
    lead_ws -= std::min(lead_ws, k);
  }

  // Splits the input into special tokens and raw fragments as far as it is decided (all of it when final).
  void process(bool final, std::vector<int32_t>& out) {
    const Tokenizer::Impl& t = *m;
    const size_t hold = t.special.max_len() > 0 ? t.special.max_len() - 1 : 0;
    const auto ok = [this](bool always, size_t, size_t) { return always || parse_special; };
    for (;;) {
      if (skip_ws) {
        size_t k = 0;
        while (k < in.size() && is_space(in[k])) ++k;
        consume(k);
        if (in.empty()) {
          if (final) frag_close(out);
          break;
        }
        skip_ws = false;
      }
      // An occurrence starting before limit is decided: the bytes after it cover the longest token.
      const size_t limit = final ? in.size() : in.size() - std::min(in.size(), hold);
      size_t b = 0, e = 0;
      int32_t id = -1;
      if (searched < limit && t.special.find_if(in, searched, ok, b, e, id, limit)) {
        size_t raw_end = b;
        if (t.v.attrs[id] & kAttrLstrip)
          while (raw_end > 0 && is_space(in[raw_end - 1])) --raw_end;
        if (raw_end > 0) frag_append(std::string_view(in).substr(0, raw_end), out);
        frag_close(out);
        out.push_back(id);
        consume(e);
        if (t.v.attrs[id] & kAttrRstrip) skip_ws = true;
        continue;
      }
      searched = std::max(searched, limit);
      size_t safe = limit;
      // Whitespace that a token starting after it would strip waits for that token to be decided (the
      // whitespace run already known at the front is not scanned again).
      if (!final && t.special.any_lstrip()) {
        while (safe > lead_ws && is_space(in[safe - 1])) --safe;
        if (safe == lead_ws) safe = 0;
      }
      if (safe > 0) {
        frag_append(std::string_view(in).substr(0, safe), out);
        consume(safe);
      }
      lead_ws = limit - safe;
      if (final) frag_close(out);
      break;
    }
  }

  std::string_view prefix() const {
    return m->v.escape_spaces ? std::string_view(utf8::kMetaSpace) : std::string_view(" ");
  }

  void frag_append(std::string_view raw, std::vector<int32_t>& out) {
    const Vocab& v = m->v;
    if (!in_frag) {
      in_frag = true;
      norm.clear();
      done = 0;
      next_try = chunk;
      prefix_pending =
          v.prepend == PrependScheme::Always || (v.prepend == PrependScheme::First && in_off == 0);
    }
    if (v.escape_spaces) {
      for (char c : raw) {
        if (c == ' ')
          norm += utf8::kMetaSpace;
        else
          norm += c;
      }
    } else {
      norm.append(raw);
    }
    encode_some(/*final=*/false, out);
  }

  void frag_close(std::vector<int32_t>& out) {
    if (!in_frag) return;
    encode_some(/*final=*/true, out);
    in_frag = false;
    norm.clear();
    if (norm.capacity() > 4 * chunk + 4096) norm.shrink_to_fit();  // after a fragment held whole
    done = 0;
  }

  // Encodes norm[done, ...) up to the last cut that is certain (final: all of it).
  void encode_some(bool final, std::vector<int32_t>& out) {
    const Tokenizer::Impl& t = *m;
    if (prefix_pending) {
      const std::string_view p = prefix();
      if (!final && norm.size() < p.size()) return;
      if (t.v.prepend_always || norm.compare(0, p.size(), p) != 0) norm.insert(0, p);
      prefix_pending = false;
    }
    if (!final && norm.size() - done < next_try) return;
    const std::string_view text = norm;
    size_t end = done;
    if (t.spm) {
      end = final ? text.size() : std::max(done, t.spm->cut(text, done, text.size()));
      if (end > done) t.spm->encode(text.substr(done, end - done), out);
    } else if (t.pre->empty()) {
      if (final) {
        t.encode_word(text.substr(done), pin, out);
        end = text.size();
      }
    } else {
      words.clear();
      end = t.pre->split_from(text, done, final, words);
      for (auto w : words) t.encode_word(w, pin, out);
    }
    if (final) return;
    const bool progress = end > done;
    done = end;
    next_try = std::max(chunk, 2 * (norm.size() - done));
    if (!progress) return;
    // Keep only the context the next split may look back at, from a character boundary.
    const size_t keep = t.pre->lookbehind_bytes();
    size_t from = done > keep ? done - keep : 0;
    while (from > 0 && (static_cast<unsigned char>(norm[from]) & 0xC0) == 0x80) --from;
    if (from > 0) {
      norm.erase(0, from);
      done -= from;
    }
  }
};

EncodeStream::EncodeStream(const Tokenizer& tok, bool add_special, bool parse_special, size_t chunk)
    : s_(std::make_unique<State>()) {
  s_->m = tok.impl_;
  s_->add_special = add_special;
  s_->parse_special = parse_special;
  s_->chunk = std::max<size_t>(chunk, 1);
}

EncodeStream::~EncodeStream() = default;
EncodeStream::EncodeStream(EncodeStream&&) noexcept = default;
EncodeStream& EncodeStream::operator=(EncodeStream&&) noexcept = default;

void EncodeStream::feed(std::string_view text, std::vector<int32_t>& out) {
  if (s_->finished) fail("EncodeStream::feed after finish");
  s_->start(out);
  s_->in.append(text);
  s_->process(/*final=*/false, out);
}

void EncodeStream::finish(std::vector<int32_t>& out) {
  if (s_->finished) fail("EncodeStream::finish called twice");
  s_->start(out);
  s_->process(/*final=*/true, out);
  s_->finished = true;
  if (s_->add_special && s_->m->v.add_eos) out.push_back(s_->m->v.eos);
}

size_t EncodeStream::held() const {
  return s_->in.size() + (s_->in_frag ? s_->norm.size() - s_->done : 0);
}

}  // namespace ultra::tok
