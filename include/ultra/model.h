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

namespace detail {
struct Access;  // the library's own code reaches the state behind the handles through it (src/engine)
}  // namespace detail

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

  // A byte range [begin, end) of a text.
  struct Span {
    size_t begin = 0, end = 0;
  };
  // Like encode(text, add_special, /*parse_special=*/true), except that a control or unknown token whose
  // text overlaps one of `literal` is not recognised: there the text is ordinary text (user-defined added
  // tokens are still recognised everywhere). For a prompt whose user-supplied parts must not become control
  // tokens while the template's own text around them does (a rendered chat). When no control token's text
  // overlaps `literal` the ids equal encode(text, add_special, true). literal: ascending, disjoint, non-empty
  // spans within text; anything else throws ultra::Error.
  std::vector<int32_t> encode_with_literal(std::string_view text, std::span<const Span> literal,
                                           bool add_special) const;
  // The first control or unknown token whose text occurs in text (leftmost, then longest): its id, or -1
  // when there is none; *at (when given): its byte offset.
  int32_t find_special(std::string_view text, size_t* at = nullptr) const;

  int32_t n_vocab() const;
  int32_t bos() const;  // -1 if none
  int32_t eos() const;  // -1 if none
  bool add_bos() const;
  bool is_special(int32_t id) const;  // control or unknown
  bool is_eog(int32_t id) const;      // end of generation: eos, eot, eom, and end-of-turn tokens by text

  struct Impl;  // opaque: defined in src/engine

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
  friend class Model;
  friend class TextStream;
  friend struct detail::Access;
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
  std::string format;  // "gguf" or "safetensors"
  // "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", and with experts "mixtral",
  // "qwen2moe", "qwen3moe"
  std::string arch;
  std::string weight_type;  // type of the layer matrices: "f32", "f16", "bf16", "q8_0"
  int n_vocab = 0;          // rows of the embedding table
  int dim = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int ffn_dim = 0;
  int n_expert = 0;       // experts per layer (0: dense)
  int n_expert_used = 0;  // experts each token runs
  int train_ctx = 0;
  size_t weight_bytes = 0;  // bytes of all the weights (of the whole model, not of this rank's shard)
  // Bytes of weights one decode token reads: weight_bytes less the experts it does not select (mixtures of
  // experts: n_expert_used of n_expert per layer); weight_bytes for a dense model.
  size_t active_weight_bytes = 0;
  double n_params = 0;
  // Tensor parallelism (LoadParams::tp): this process holds shard tp_rank of tp_size; the numbers above are
  // the whole model's.
  int tp_rank = 0;
  int tp_size = 1;
  size_t shard_weight_bytes = 0;  // bytes of this rank's shard of the weights (weight_bytes when not split)
};

struct LoadParams {
  // true: the weights are used in place from a read-only memory map of the file(s) (zero copy, shared with
  // the page cache). false (`--no-mmap`): the files are read into anonymous memory aligned to 2 MiB and
  // advised for transparent huge pages: a slower load and memory the page cache cannot share, but fewer TLB
  // misses when the weights are streamed (faster CPU decode, docs/BENCHMARKS.md). ULTRA_NO_MMAP=1 in the
  // environment makes every load read into memory.
  bool mmap = true;
  // Tensor parallelism over MPI (Megatron-style: heads and FFN columns split, vocabulary split): > 1 makes
  // the model this process's shard of tp ranks, which must be the ranks of MPI_COMM_WORLD (the program
  // started as `mpirun -np <tp> ...`, each rank loading the same file; only its slices of the mapped file are
  // read). Rank 0 creates the Context and runs everything on it; every other rank calls run_tp_follower()
  // (ultra/context.h). Dense models and mixtures of experts (every expert split by columns) with
  // F32/F16/BF16 weights and block types whose blocks the split keeps whole; needs mmap. Throws ultra::Error
  // for a build without MPI, a rank count other than tp, a model that does not split (heads, KV heads, FFN
  // or expert width, quantization blocks).
  int tp = 1;
  double tp_timeout_s = 60;  // longest wait of one collective before the job ends with an error
};

class Model {
 public:
  // A GGUF file or an HF model directory (config.json + model.safetensors or a sharded index).
  // Throws ultra::Error naming the file and the problem.
  static Model load(const std::string& path, const LoadParams& params = {});

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
  // tokenizer_config.json's chat_template; "" when it has none. `ultra chat` and `ultra serve` run it with
  // their own Jinja interpreter (src/chat, not part of this API).
  const std::string& chat_template() const;

  struct Impl;  // opaque: defined in src/engine

 private:
  explicit Model(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
  friend struct detail::Access;
};

}  // namespace ultra
