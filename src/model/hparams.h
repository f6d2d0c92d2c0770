// Hyper-parameters of a Llama-family model, read from a GGUF file or an HF config.json.
#pragma once

#include <cstdint>
#include <string>
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
  bool tie_embeddings = false;
  bool qkv_bias = false;  // Qwen2
  // true: Q/K rows are permuted for interleaved-pair RoPE (GGUF files of arch "llama" written by llama.cpp's
  // converter and ours); false: rotate-half RoPE (HF checkpoints, GGUF qwen2).
  bool rope_interleaved = false;
  int32_t bos_id = -1, eos_id = -1;

  // Checks the numbers are positive, consistent and of sane size; throws ultra::Error naming `source`.
  void validate(const std::string& source) const;
  // RoPE inverse frequencies [head_dim/2] with the scaling applied (HF's _compute_*_parameters).
  std::vector<float> rope_inv_freq() const;
};

// Parses an HF config.json (transformers 4 form with rope_theta/rope_scaling at the top level, and the
// transformers 5 form with rope_parameters). Throws ultra::Error naming the file.
HParams parse_hf_config(const std::string& path);

}  // namespace ultra
