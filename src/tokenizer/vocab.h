// A tokenizer vocabulary and its options, loaded from GGUF metadata (tokenizer.ggml.*) or from a Hugging
// Face tokenizer.json (+ tokenizer_config.json). The Tokenizer (tokenizer.h) validates it and builds the
// encoder from it; the loaders only translate formats, so an in-memory Vocab works the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ultra::gguf {
class Reader;
}

namespace ultra::tok {

// Most tokens (and merges) a vocabulary may have: far above real ones (~260k), and the model loaders' limit
// on n_vocab; it bounds what a crafted file can make the loaders allocate.
constexpr size_t kMaxVocab = (size_t)1 << 22;

// GGUF tokenizer.ggml.token_type values (llama.cpp numbering).
enum class TokenType : uint8_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,      // special token: matched in text only with parse_special, skipped by skip_special
  UserDefined = 4,  // added token: always matched whole in text, never split by the model
  Unused = 5,
  Byte = 6,  // SentencePiece byte-fallback token <0xNN>
};
std::string_view token_type_name(TokenType t);

enum class ModelKind : uint8_t {
  Bpe,  // merges by rank (byte-level GPT-2 style, or over characters with byte fallback)
  Spm,  // SentencePiece BPE: merges by token score
};

// How a pre-tokenizer regex splits a piece (the behaviours of HF tokenizers' Split).
enum class SplitBehavior : uint8_t { Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous };

struct SplitRule {
  std::string pattern;  // PCRE2 syntax, compiled with UTF + UCP
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
};

// When the prefix (a space, or U+2581 when spaces are escaped) is put in front of a raw text fragment
// (a run of text between special tokens).
enum class PrependScheme : uint8_t {
  Never,
  First,   // only for the fragment that starts the text
  Always,  // every fragment
};

// What decoding does with the space that the encoder's prefix rule put in front of the text.
enum class LeadingSpace : uint8_t {
  Keep,
  StripOne,         // drop one leading space of the decoded text (llama.cpp; HF's Strip decoder)
  StripFirstToken,  // drop every space of the first token unless it is a byte token (HF's Metaspace decoder)
};

// Per-token attributes.
enum TokenAttr : uint8_t {
  kAttrLstrip = 1,  // when matched in text, swallows the whitespace on its left
  kAttrRstrip = 2,  // ... and on its right
};

struct Vocab {
  std::string source;  // file name, used in messages
  ModelKind kind = ModelKind::Bpe;
  std::string pre = "default";  // pre-tokenizer name (GGUF tokenizer.ggml.pre), informational for HF

  std::vector<std::string> tokens;
  std::vector<TokenType> types;  // empty: all Normal
  std::vector<float> scores;     // SPM merge priorities (higher first); empty: all 0
  std::vector<uint8_t> attrs;    // TokenAttr bits; empty: none
  std::vector<std::pair<std::string, std::string>> merges;  // BPE: rank = index

  int32_t bos = -1, eos = -1, eot = -1, eom = -1, pad = -1, unk = -1;
  // End of generation: eos, eot, eom and every token whose text llama.cpp ends generation on ("<|im_end|>",
  // "<end_of_turn>", Gemma 4's "<turn|>" and "<|tool_response>", ...), ascending.
  std::vector<int32_t> eog;
  bool add_bos = false, add_eos = false;

  // Normalisation of each raw fragment: spaces to U+2581, then the prefix.
  bool escape_spaces = false;
  PrependScheme prepend = PrependScheme::Never;
  bool prepend_always = true;  // false: only when the fragment does not already start with the prefix

  // BPE options.
  bool byte_level = true;         // GPT-2 byte-to-unicode mapping before the merges
  bool ignore_merges = false;     // a pre-token that is itself a token is emitted whole (llama-3)
  bool whole_newlines = false;    // ... only for pre-tokens made of '\n' alone (llama.cpp's gemma4 rule)
  bool byte_fallback = false;     // unknown characters become <0xNN> tokens
  bool fuse_unk = false;          // consecutive unknown characters become one unknown token
  std::vector<SplitRule> splits;  // pre-tokenizer regexes, applied in order, each within the previous pieces

  // Decoding: undo the prefix the encoder added (SentencePiece's leading-space rule).
  LeadingSpace leading_space = LeadingSpace::Keep;

  // The chat template the model ships (GGUF tokenizer.chat_template, tokenizer_config.json chat_template:
  // a string, or the "default" entry of a list of {name, template}); "" when none.
  std::string chat_template;
};

// Token text -> id. Views point into the Vocab's token strings, which must outlive the index.
class TokenIndex {
 public:
  // Throws ultra::Error naming both ids when a (non-empty) token text occurs twice. Empty tokens are not
  // indexed (they can never be matched).
  void build(const std::vector<std::string>& tokens, const std::string& source);
  int32_t find(std::string_view text) const {
    auto it = map_.find(text);
    return it == map_.end() ? -1 : it->second;
  }
  size_t max_len() const { return max_len_; }

 private:
  std::unordered_map<std::string_view, int32_t> map_;
  size_t max_len_ = 0;
};

// tokenizer.ggml.model "gpt2" (byte-level BPE), "llama" (SentencePiece) or "gemma4" (BPE over U+2581-escaped
// UTF-8 with <0xNN> byte fallback); the pre-tokenizer from tokenizer.ggml.pre (gemma4: its own). Throws
// ultra::Error naming the file and the problem (missing or mistyped keys, lengths that disagree, unknown
// model or pre-tokenizer).
Vocab load_gguf(const gguf::Reader& reader);
Vocab load_gguf_file(const std::string& path);

// A tokenizer.json with a BPE model; `config_path` (may be empty) is a tokenizer_config.json giving
// bos/eos/pad/unk tokens and add_bos_token/add_eos_token. Unsupported normalizers, pre-tokenizers or models
// throw ultra::Error.
Vocab load_hf(const std::string& tokenizer_json_path, const std::string& config_path = "");
// Same from JSON text (source and config_source name them in messages; config_source defaults to source).
// Both texts are parsed with core/json.h's parse_json: bounded nesting depth, no repeated keys.
Vocab load_hf_json(std::string_view tokenizer_json, std::string_view config_json, const std::string& source,
                   const std::string& config_source = "");

// Loads by path: a .gguf file, a tokenizer.json (its sibling tokenizer_config.json is used when present), or
// a directory holding tokenizer.json.
Vocab load_vocab(const std::string& path);

}  // namespace ultra::tok
