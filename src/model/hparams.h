// Hyper-parameters of a Llama-family model (Llama, Mistral, Qwen2/3, Gemma 2/3, Phi-3, and the mixtures of
// experts Mixtral, Qwen2-MoE, Qwen3-MoE, gpt-oss), read from a GGUF file or an HF config.json.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ultra {

enum class Arch { Llama, Mistral, Qwen2, Qwen3, Gemma2, Gemma3, Phi3, GptOss };
const char* arch_name(Arch a);

struct RopeScaling {
  std::string type = "default";  // "default", "llama3", "linear", "longrope" or "yarn"
  float factor = 1.0f;           // llama3, linear, yarn: inv_freq / factor
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
  // longrope (Phi-3): inv_freq[i] / short_factor[i] (or long_factor[i] when the context may exceed
  // original_max_position_embeddings), cos and sin times attention_factor. [head_dim/2] each.
  std::vector<float> short_factor, long_factor;
  float attention_factor = 1.0f;  // longrope and yarn: cos and sin times this
  // yarn (HF _compute_yarn_parameters; gpt-oss): pair i takes inv_freq / factor where i >= high, inv_freq
  // where i <= low, linearly mixed between, with [low, high] the pair indices that turn beta_fast and
  // beta_slow times over original_max_position_embeddings (rounded outwards to integers with truncate, as
  // llama.cpp always does; gpt-oss's config says truncate false).
  float beta_fast = 32.0f, beta_slow = 1.0f;
  bool truncate = true;
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
  // Sliding-window attention: a token at position i attends positions j with i - sliding_window < j <= i
  // (HF's sliding_window_overlay, llama.cpp's LLAMA_SWA_TYPE_STANDARD); 0: none. With swa_layers empty it
  // applies to every layer (Mistral, Phi-3), else to the layers swa_layers marks.
  int sliding_window = 0;
  bool tie_embeddings = false;
  bool qkv_bias = false;  // Qwen2
  bool qk_norm = false;   // Qwen3, Gemma 3: per-head RMSNorm of q and k (weights [head_dim]) before RoPE
  // Gemma 2/3. The loaders store Gemma's RMSNorm weights w as 1 + w (as llama.cpp's GGUF files do), so every
  // norm is the plain x / rms(x) * weight.
  float embed_scale = 0;    // x = embed(tokens) * embed_scale; 0: none (Gemma: sqrt(dim) in f32)
  bool post_norms = false;  // x += post_norm(attn(...)), x += post_ffw_norm(mlp(...)) (Gemma 2/3)
  bool gelu = false;        // GeGLU with tanh GELU instead of SwiGLU (Gemma)
  float attn_scale = 0;     // query scale; 0: 1/sqrt(head_dim) (Gemma: query_pre_attn_scalar^-0.5)
  float attn_softcap = 0;   // scores = tanh(scores / cap) * cap before softmax; 0: none (Gemma 2)
  float final_softcap = 0;  // logits = tanh(logits / cap) * cap; 0: none (Gemma 2)
  // Per-layer sliding-window attention (Gemma 2/3, Qwen2/3 layer_types): layer il attends positions
  // j > i - sliding_window when swa_layers[il] != 0. Empty: the whole-model Mistral form above.
  std::vector<uint8_t> swa_layers;
  float rope_theta_swa = 0;  // RoPE base of the sliding layers (default scaling); 0: as the full layers
  // true: Q/K rows are permuted for interleaved-pair RoPE (GGUF files of arch "llama" written by llama.cpp's
  // converter and ours); false: rotate-half RoPE (HF checkpoints, GGUF qwen2).
  bool rope_interleaved = false;
  // Mixture of experts (Mixtral: arch llama with experts; Qwen2-MoE, Qwen3-MoE): every layer's FFN is
  // n_expert SwiGLU experts of expert_ffn_dim, of which a router picks n_expert_used per token; 0: dense.
  // The router's softmax runs over all experts, the top n_expert_used are kept (ties: the lower index) and,
  // with expert_norm, their weights are divided by their sum (Mixtral, Qwen3-MoE; llama.cpp's norm_w).
  int n_expert = 0;
  int n_expert_used = 0;
  int expert_ffn_dim = 0;
  bool expert_norm = false;
  // Qwen2-MoE's shared expert: a SwiGLU FFN of shexp_ffn_dim every token runs, its output times
  // sigmoid(w_gate_inp_shexp . x) added to the experts'; 0: none.
  int shexp_ffn_dim = 0;
  // gpt-oss: the router has a bias and picks the top n_expert_used of its logits, whose softmax (over those
  // k only) weighs them (expert_topk_softmax); each expert's three matrices have biases (expert_bias); the
  // expert activation is (clamp(up, -limit, limit) + 1) * g * sigmoid(1.702 g), g = min(gate, limit), for
  // swiglu_limit > 0 (transformers' GptOssExperts, llama.cpp's swiglu_oai).
  bool expert_topk_softmax = false;
  bool expert_bias = false;
  float swiglu_limit = 0;
  // gpt-oss: o_proj has a bias too (o_bias), and each head has a learned logit (LayerWeights::attn_sinks)
  // that joins its softmax's denominator (attn_sinks).
  bool o_bias = false;
  bool attn_sinks = false;
  int32_t bos_id = -1, eos_id = -1;
  // Every token id that ends generation (eos_id first when set): config.json / generation_config.json
  // eos_token_id (an id or a list of ids), GGUF tokenizer.ggml.eos/eot/eom_token_id. All < n_vocab.
  std::vector<int32_t> eos_ids;

  // Checks the numbers are positive, consistent and of sane size; throws ultra::Error naming `source`.
  void validate(const std::string& source) const;
  void validate_experts(const std::string& source) const;  // the expert counts and sizes
  // RoPE inverse frequencies [head_dim/2] with the scaling applied (HF's _compute_*_parameters); swa: of the
  // sliding-window layers (rope_theta_swa). long_rope: longrope's long factors instead of the short ones.
  std::vector<float> rope_inv_freq(bool swa = false, bool long_rope = false) const;
  // Whether layer il attends through the sliding window (the whole-model window or its per-layer flag).
  bool layer_swa(int il) const { return sliding_window > 0 && (swa_layers.empty() || swa_layers[il]); }
  bool moe() const { return n_expert > 0; }
  // The widest FFN activation row: the dense FFN, an expert's or the shared expert's.
  int max_ffn_dim() const { return std::max({ffn_dim, expert_ffn_dim, shexp_ffn_dim}); }
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
