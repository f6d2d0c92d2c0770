// Pre-tokenization: splitting text into words before BPE, by a sequence of regexes (PCRE2, UTF + UCP, with
// invalid UTF-8 tolerated: ill-formed bytes never match a pattern and so end up in gap pieces).
// Each rule is applied to each piece produced by the previous rules, as HF tokenizers' Sequence of Split
// pre-tokenizers (and llama.cpp's unicode_regex_split) do; matches and the gaps between them both become
// pieces under the default Isolated behaviour.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace ultra::tok {

// The regexes for the GPT-2 family pre-tokenizer (HF ByteLevel with use_regex).
extern const char* const kGpt2Pattern;

struct PreTokenizerInfo {
  std::vector<SplitRule> splits;
  bool ignore_merges = false;
  bool add_bos = false;        // default for add_bos when the GGUF does not say
  bool force_add_bos = false;  // add_bos even when the GGUF says false (llama.cpp's gemma4 override)
  // SentencePiece-style BPE (gemma4): no byte-level mapping, spaces escaped to U+2581, <0xNN> byte fallback,
  // and a pre-token of newlines only that is itself a token is emitted whole.
  bool spm_style = false;
};

// The pre-tokenizer for a GGUF tokenizer.ggml.pre value, following llama.cpp's mapping (PCRE2 patterns are
// the originals from the models' tokenizer.json where llama.cpp had to rewrite them for std::regex).
// Throws ultra::Error for an unknown name.
PreTokenizerInfo pre_tokenizer_for(std::string_view pre);

class PreTokenizer {
 public:
  // Compiles the rules; throws ultra::Error naming a pattern that does not compile.
  explicit PreTokenizer(const std::vector<SplitRule>& rules);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  bool empty() const { return rules_.empty(); }

  // Appends the non-empty pieces of text, in order, as views into text. Thread-safe.
  void split(std::string_view text, std::vector<std::string_view>& out) const {
    split_from(text, 0, /*final=*/true, out);
  }

  // Streaming: text is a prefix of a longer text T (known only up to text.size() unless final), of which
  // [0, start) has been split already, ending at a piece boundary; text[0, start) is kept only as the
  // context that lookbehinds (and \b, ^) may see, so keep at least lookbehind_bytes() of it (or all of it
  // from T's start). Appends the pieces of split(T) that begin at or after start and are certain from the
  // bytes seen, and returns where they end (a piece boundary of split(T), from which the next call starts).
  // final: text is the whole of T; all its pieces are appended and text.size() is returned. Not final: the
  // first rule matches with PCRE2's hard partial matching, so a match or gap that could change with more
  // text (a match that reached the end, an incomplete UTF-8 character at the end) is left for later.
  size_t split_from(std::string_view text, size_t start, bool final,
                    std::vector<std::string_view>& out) const;
  // Bytes of context before `start` that split_from needs (a bound on the first rule's lookbehind, at least
  // one character so that ^ and \A cannot match at start).
  size_t lookbehind_bytes() const { return lookbehind_bytes_; }

 private:
  struct Rule;
  std::vector<std::unique_ptr<Rule>> rules_;
  size_t lookbehind_bytes_ = 4;
  // Applies one rule to subject[start, end) (subject[0, start): context); final: as split_from. Returns
  // where the appended pieces end.
  size_t apply(const Rule& r, std::string_view subject, size_t start, bool final,
               std::vector<std::string_view>& out) const;
};

}  // namespace ultra::tok
