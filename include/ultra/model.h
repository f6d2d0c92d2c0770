// A loaded model and its tokenizer.
//
//   ultra::Model model = ultra::Model::load("model.gguf");           // or an HF directory
//   const ultra::Tokenizer* tok = model.tokenizer();                 // null if the file has none
//   std::vector<int32_t> ids = tok->encode("Hello", true, true);
//
// Model and Tokenizer are cheap-to-copy handles to immutable shared state; a Context keeps its model alive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ultra/error.h"

namespace ultra {

// Text <-> token ids, exactly as HF tokenizers and llama.cpp (byte-level BPE and SentencePiece).
class Tokenizer {
 public:
  // A .gguf file (vocabulary-only is fine), a tokenizer.json, or an HF directory holding one.
  static Tokenizer load(const std::string& path);

  // add_special: add BOS/EOS as the vocabulary asks. parse_special: recognise control tokens written in
  // the text (e.g. "<|eot_id|>"); user-defined added tokens are always recognised.
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;
  // The bytes of the ids (invalid UTF-8 kept as is). Throws ultra::Error for an id out of range.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // The bytes of one token (control tokens: their text).
  std::string_view token_to_piece(int32_t id) const;

  int32_t n_vocab() const;
  int32_t bos() const;  // -1 if none
  int32_t eos() const;  // -1 if none
  bool add_bos() const;
  bool is_special(int32_t id) const;  // control or unknown
  bool is_eog(int32_t id) const;      // end of generation: eos, eot, eom, and end-of-turn tokens by text

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
  friend class Model;
  friend class TextStream;
};

// Encodes a text that arrives in pieces (a file read in chunks) to exactly the ids of Tokenizer::encode of
// the whole text, holding back only the input that what follows could still change: about 64 KiB, more only
// while one pre-token (or, for SentencePiece, a run with no place to cut) is longer.
class EncodeStream {
 public:
  EncodeStream(const Tokenizer& tok, bool add_special, bool parse_special);
  ~EncodeStream();
  EncodeStream(EncodeStream&&) noexcept;
  EncodeStream& operator=(EncodeStream&&) noexcept;

  // Appends to out the ids that the text so far determines.
  void feed(std::string_view text, std::vector<int32_t>& out);
  // End of the text: appends the remaining ids (and EOS when asked). Call once, last.
  void finish(std::vector<int32_t>& out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Streams generated text token by token, emitting only complete UTF-8 sequences (an incomplete tail waits
// for the next token; ill-formed bytes become U+FFFD). Allocates nothing after construction.
class TextStream {
 public:
  explicit TextStream(const Tokenizer& tok, bool skip_special = true);
  ~TextStream();
  TextStream(TextStream&&) noexcept;
  TextStream& operator=(TextStream&&) noexcept;

  // The text newly completed by this token; valid until the next call.
  std::string_view push(int32_t id);
  // End of stream: what is still held back (an incomplete tail as U+FFFD).
  std::string_view flush();
  void reset();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct ModelInfo {
  std::string path;
  std::string format;       // "gguf" or "safetensors"
  std::string arch;         // "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"
  std::string weight_type;  // type of the layer matrices: "f32", "f16", "bf16", "q8_0"
  int n_vocab = 0;          // rows of the embedding table
  int dim = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int ffn_dim = 0;
  int train_ctx = 0;
  size_t weight_bytes = 0;  // bytes of weights one forward step reads
  double n_params = 0;
};

class Model {
 public:
  // A GGUF file or an HF model directory (config.json + model.safetensors or a sharded index).
  // Throws ultra::Error naming the file and the problem.
  static Model load(const std::string& path);

  const ModelInfo& info() const;
  // The model's own tokenizer (GGUF tokenizer.ggml.* keys, or tokenizer.json beside an HF checkpoint), or
  // null. Its n_vocab() may be smaller than info().n_vocab (padded embedding tables): ids at or above it
  // are never sampled.
  const Tokenizer* tokenizer() const;
  // Every end-of-generation id the model declares (eos, eot, eom of the vocabulary; HF eos_token_id and
  // its lists), ascending.
  std::span<const int32_t> eog_ids() const;
  bool is_eog(int32_t id) const;
  // The chat template (Jinja source) the model ships: GGUF tokenizer.chat_template, or
  // tokenizer_config.json's chat_template; "" when it has none. src/chat/chat_template.h runs it.
  const std::string& chat_template() const;

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  explicit Model(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace ultra
