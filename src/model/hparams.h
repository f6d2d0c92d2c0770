// Hyper-parameters of a Llama-family model, read from a GGUF file or an HF config.json.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ultra {

enum class Arch { Llama, Mistral, Qwen2 };
const char* arch_name(Arch a);

struct RopeScaling {
  std::string type = "default";  // "default" or "llama3"
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
};

struct HParams {
  Arch arch = Arch::Llama;
  int n_vocab = 0;
  int dim = 0;  // hidden size
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;  // GQA: n_heads % n_kv_heads == 0
  int head_dim = 0;    // usually dim / n_heads
  int ffn_dim = 0;     // intermediate size of the SwiGLU MLP
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  int train_ctx = 2048;  // max_position_embeddings / context_length
  // Sliding-window attention (Mistral v0.1): each token attends the last sliding_window positions; 0: none.
  // Not implemented: a context holds at most this many tokens, which keeps the output exact.
  int sliding_window = 0;
  bool tie_embeddings = false;
  bool qkv_bias = false;  // Qwen2
  // true: Q/K rows are permuted for interleaved-pair RoPE (GGUF files of arch "llama" written by llama.cpp's
  // converter and ours); false: rotate-half RoPE (HF checkpoints, GGUF qwen2).
  bool rope_interleaved = false;
  int32_t bos_id = -1, eos_id = -1;
  // Every token id that ends generation (eos_id first when set): config.json / generation_config.json
  // eos_token_id (an id or a list of ids), GGUF tokenizer.ggml.eos/eot/eom_token_id. All < n_vocab.
  std::vector<int32_t> eos_ids;

  // Checks the numbers are positive, consistent and of sane size; throws ultra::Error naming `source`.
  void validate(const std::string& source) const;
  // RoPE inverse frequencies [head_dim/2] with the scaling applied (HF's _compute_*_parameters).
  std::vector<float> rope_inv_freq() const;
};

// Parses an HF config.json (transformers 4 form with rope_theta/rope_scaling at the top level, and the
// transformers 5 form with rope_parameters), and the generation_config.json beside it when present (its
// bos/eos token ids). Throws ultra::Error naming the file: invalid or deeply nested JSON, a repeated key,
// a value of the wrong type (a non-boolean tie_word_embeddings), a float that is not finite, a token id
// outside the vocabulary, hyper-parameters that fail validate().
HParams parse_hf_config(const std::string& path);
// The same from JSON text; path and generation_path name the texts in messages.
HParams parse_hf_config_json(std::string_view config_json, const std::string& path,
                             std::string_view generation_config_json = {},
                             const std::string& generation_path = "generation_config.json");

}  // namespace ultra
