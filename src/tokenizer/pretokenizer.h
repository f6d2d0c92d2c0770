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
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  struct Rule;
  std::vector<std::unique_ptr<Rule>> rules_;
  void apply(const Rule& r, std::string_view piece, std::vector<std::string_view>& out) const;
};

}  // namespace ultra::tok
