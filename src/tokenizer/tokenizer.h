// Text <-> token ids, matching HF tokenizers (and llama.cpp) on byte-level BPE (gpt-2, llama-3, qwen2,
// qwen35, deepseek, falcon, starcoder, mpt, refact, ...), SentencePiece BPE (llama, phi-3) and llama.cpp's
// SentencePiece-style BPE by merge rank (gemma4) vocabularies.
//
// encode():
//   1. special / added tokens are cut out of the text whole (leftmost, then longest match): user-defined
//      (added, non-special) tokens always, control and unknown tokens only with parse_special;
//   2. each raw fragment between them is normalised (SPM: spaces -> U+2581 and a U+2581 prefix), split
//      by the pre-tokenizer regexes and encoded by BPE (merge ranks) or SPM (scores); repeated pre-tokens
//      hit a word -> ids cache;
//   3. with add_special, BOS / EOS are added as the vocabulary asks (add_bos / add_eos).
// Invalid UTF-8 never throws: byte-level BPE encodes the raw bytes, SPM byte-falls back to <0xNN>.
// Threads: every method is const and one Tokenizer may be used from many threads at once (the word cache is
// shared between them and synchronised inside).
//
// Decoding: token_to_piece() is the exact byte string of a token (byte-level mapping undone, U+2581 ->
// space, <0xNN> -> that byte; control tokens give their text), so decode(encode(x)) == x for lossless
// vocabularies. Detokenizer streams text, emitting only complete UTF-8 sequences; EncodeStream
// (encode_stream.h) encodes a text that arrives in pieces.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace ultra::tok {

class Tokenizer {
 public:
  // Validates the vocabulary and builds the encoder. Throws ultra::Error on: an empty vocabulary, arrays
  // whose lengths disagree, special ids out of range, add_bos/add_eos without the token, duplicate tokens,
  // merges naming unknown tokens, regexes that do not compile.
  explicit Tokenizer(Vocab vocab);
  // load_vocab(path): a .gguf (vocabulary-only is fine), a tokenizer.json, or a directory holding one.
  static Tokenizer from_file(const std::string& path);

  // Encodes text. add_special: add BOS/EOS as the vocabulary asks. parse_special: recognise control tokens
  // (e.g. "<|endoftext|>") written in the text; user-defined added tokens are always recognised.
  std::vector<int32_t> encode(std::string_view text, bool add_special = false,
                              bool parse_special = false) const;
  // Same, appending to out.
  void encode(std::string_view text, std::vector<int32_t>& out, bool add_special, bool parse_special) const;

  // A byte range [begin, end) of a text.
  struct Span {
    size_t begin = 0, end = 0;
  };
  // Like encode(text, out, add_special, /*parse_special=*/true), except that a control or unknown token whose
  // text overlaps one of `literal` is not recognised: there the text is ordinary text (user-defined tokens
  // are still recognised everywhere). For a prompt whose user-supplied parts (literal) must not become
  // control tokens while the template's own text around them does. The text is cut into raw fragments only
  // at recognised tokens, so when no control token's text overlaps `literal` the ids equal
  // encode(text, out, add_special, true). literal: ascending, disjoint, non-empty spans within text;
  // anything else throws ultra::Error.
  void encode_with_literal(std::string_view text, std::span<const Span> literal, std::vector<int32_t>& out,
                           bool add_special) const;
  // The first control or unknown token whose text occurs in text (leftmost, then longest): its id, or -1
  // when there is none; *at (when given): its byte offset.
  int32_t find_special(std::string_view text, size_t* at = nullptr) const;

  // The decoded bytes of all ids (raw: invalid UTF-8 is kept as is). skip_special drops control and unknown
  // tokens. SPM vocabularies drop the space that the encoder's prefix rule added in front of the text.
  // Throws ultra::Error for an id outside [0, n_vocab).
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // The decoded bytes of one token (control tokens: their text). Throws ultra::Error when out of range.
  std::string_view token_to_piece(int32_t id) const;
  // The token's text as stored in the vocabulary (byte-level: mapped characters; SPM: with U+2581).
  const std::string& token_text(int32_t id) const;
  TokenType token_type(int32_t id) const;
  // Control or unknown: what skip_special drops and parse_special recognises.
  bool is_special(int32_t id) const;
  // Id of a token by its vocabulary text, or -1.
  int32_t find_token(std::string_view text) const;

  int32_t n_vocab() const;
  int32_t bos() const;
  int32_t eos() const;
  int32_t eot() const;
  int32_t eom() const;
  int32_t pad() const;
  int32_t unk() const;
  bool add_bos() const;
  bool add_eos() const;
  // End of generation: eos, eot, eom and the tokens llama.cpp ends generation on by their text (Vocab::eog).
  bool is_eog(int32_t id) const;
  std::span<const int32_t> eog_ids() const;  // ascending
  ModelKind kind() const;
  const std::string& pre() const;
  const Vocab& vocab() const;
  // Longest token_to_piece() over the vocabulary.
  size_t max_piece_bytes() const;

  // Drops the word -> ids cache (it is bounded; this is for benchmarks). Like encode(), safe to call from
  // any thread while others encode.
  void clear_cache() const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
  friend class Detokenizer;
  friend class EncodeStream;
};

// Incremental detokenizer for streaming: push() one token at a time; only complete UTF-8 sequences are
// written to the caller's buffer, an incomplete tail waits for the next token. Ill-formed sequences are
// written as U+FFFD (one per maximal ill-formed subpart) unless replace_invalid is off, in which case the
// raw bytes pass through. Nothing is allocated after construction: give push() a buffer of at least
// max_bytes_per_push() bytes; with a smaller one the text that does not fit stays queued and comes out on
// the next push()/flush().
class Detokenizer {
 public:
  struct Options {
    bool skip_special = false;    // drop control and unknown tokens
    bool replace_invalid = true;  // U+FFFD for ill-formed bytes
  };
  explicit Detokenizer(const Tokenizer& tok);
  Detokenizer(const Tokenizer& tok, Options opt);

  // Appends token id; writes up to cap bytes of newly completed text to out and returns the count.
  // Throws ultra::Error for an id out of range.
  size_t push(int32_t id, char* out, size_t cap);
  // End of stream: an incomplete tail is written as U+FFFD (or raw); returns the count written.
  size_t flush(char* out, size_t cap);
  // Bytes held back: queued complete text plus an incomplete tail.
  size_t pending() const { return queue_.size() - queue_pos_ + tail_len_; }
  void reset();
  size_t max_bytes_per_push() const { return max_out_; }

 private:
  std::shared_ptr<const Tokenizer::Impl> impl_;
  Options opt_;
  std::string queue_;  // complete text not yet written (from queue_pos_)
  std::string lead_;   // scratch for the first piece
  size_t queue_pos_ = 0;
  unsigned char tail_[4] = {};
  size_t tail_len_ = 0;
  bool at_start_ = true;
  size_t max_out_ = 0;

  void feed(std::string_view bytes);
  size_t drain(char* out, size_t cap);
};

}  // namespace ultra::tok
