// Model weights as loaded: hyper-parameters plus views of the weights. Matrix weights point into the mapped
// model file (zero copy); small vectors (norms, biases) are converted to f32 copies owned here.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/views.h"
#include "model/hparams.h"

namespace ultra {

namespace gguf {
class Reader;
}
namespace safetensors {
class Checkpoint;
}

struct LayerWeights {
  const float* attn_norm = nullptr;       // [dim]
  WeightView wq;                          // [n_heads*head_dim, dim]
  WeightView wk;                          // [n_kv_heads*head_dim, dim]
  WeightView wv;                          // [n_kv_heads*head_dim, dim]
  WeightView wo;                          // [dim, n_heads*head_dim]
  const float* bq = nullptr;              // [n_heads*head_dim] or null
  const float* bk = nullptr;              // [n_kv_heads*head_dim] or null
  const float* bv = nullptr;              // [n_kv_heads*head_dim] or null
  const float* bo = nullptr;              // [dim] or null (gpt-oss)
  const float* attn_sinks = nullptr;      // [n_heads] per-head sink logits (gpt-oss) or null
  const float* q_norm = nullptr;          // [head_dim] per-head RMSNorm of q (Qwen3, Gemma 3) or null
  const float* k_norm = nullptr;          // [head_dim] per-head RMSNorm of k or null
  const float* attn_post_norm = nullptr;  // [dim] norm of the attention output (Gemma 2/3) or null
  const float* ffn_norm = nullptr;        // [dim]
  WeightView w_gate;                      // [ffn_dim, dim]
  WeightView w_up;                        // [ffn_dim, dim]
  WeightView w_down;                      // [dim, ffn_dim]
  const float* ffn_post_norm = nullptr;   // [dim] norm of the MLP output (Gemma 2/3) or null
  // Phi-3's fused matrices as stored ([Wq; Wk; Wv] and [W_gate; W_up]); wq.. and w_gate/w_up are row views
  // into them. Empty for separately stored projections.
  WeightView wqkv;       // [q_dim + 2 * kv_dim, dim]
  WeightView w_gate_up;  // [2 * ffn_dim, dim]
  // Mixture of experts (hp.n_expert > 0; w_gate, w_up, w_down are then empty). The experts are views of
  // their own: row slices of llama.cpp's stacked [n_expert, rows, cols] tensors (GGUF), or an HF
  // checkpoint's per-expert tensors in place; arrays owned by the ModelData.
  WeightView ffn_gate_inp;                // [n_expert, dim] router
  const WeightView* gate_exps = nullptr;  // [n_expert] of [expert_ffn, dim]
  const WeightView* up_exps = nullptr;    // [n_expert] of [expert_ffn, dim]
  const WeightView* down_exps = nullptr;  // [n_expert] of [dim, expert_ffn]
  // gpt-oss's biases of the router and of each expert's matrices, or null.
  const float* ffn_gate_inp_b = nullptr;  // [n_expert]
  const float* gate_exps_b = nullptr;     // [n_expert, expert_ffn]
  const float* up_exps_b = nullptr;       // [n_expert, expert_ffn]
  const float* down_exps_b = nullptr;     // [n_expert, dim]
  // Qwen2-MoE's shared expert and its sigmoid gate, or empty / null.
  WeightView w_gate_shexp;                    // [shexp_ffn, dim]
  WeightView w_up_shexp;                      // [shexp_ffn, dim]
  WeightView w_down_shexp;                    // [dim, shexp_ffn]
  const float* ffn_gate_inp_shexp = nullptr;  // [dim]
};

// Rows [r0, r0 + n) of w as a view of their own.
inline WeightView row_slice(const WeightView& w, int64_t r0, int64_t n) {
  WeightView s = w;
  s.data = static_cast<const uint8_t*>(w.data) + (size_t)r0 * w.row_bytes;
  s.rows = n;
  if (w.scale) s.scale = w.scale + r0 * w.scale_row_stride;
  return s;
}

// The weights one forward step reads, as views. The loaders fill the model's own table (views of the
// mapped file); a GPU backend builds a copy whose views and vectors point into device memory.
struct WeightTable {
  WeightView tok_embd;                 // [n_vocab, dim]
  const float* output_norm = nullptr;  // [dim]
  WeightView output;                   // [n_vocab, dim] (== tok_embd when tied)
  std::vector<LayerWeights> layers;    // [n_layers]
};

// A loaded model: hyper-parameters, the weight table, and what keeps the memory behind it alive.
struct ModelData : WeightTable {
  std::string path;
  std::string format;  // "gguf" or "safetensors"
  HParams hp;
  std::vector<float> rope_inv_freq;       // [head_dim/2], scaling applied
  std::vector<float> rope_inv_freq_swa;   // [head_dim/2] of the sliding-window layers (Gemma 3), or empty
  std::vector<float> rope_inv_freq_long;  // [head_dim/2] longrope's long factors (Phi-3), or empty
  // The frequencies a context of n_ctx tokens uses on layer il (longrope: the long factors when n_ctx exceeds
  // original_max_position_embeddings, as llama.cpp decides).
  const std::vector<float>& layer_rope_inv_freq(int il, int n_ctx) const;

  size_t weight_bytes = 0;  // bytes of all tensors used

  // Used by the loaders: a view of a [rows, cols] matrix stored in the mapped file (counted in
  // weight_bytes), and an f32 copy of a small F32/F16/BF16 vector (nullptr for any other type).
  WeightView add_matrix(GgmlType type, const void* data, int64_t rows, int64_t cols, uint64_t n_bytes);
  // shift is added to every element (Gemma's HF norm weights w become the 1 + w llama.cpp stores).
  const float* add_vector(GgmlType type, const void* data, int64_t n, uint64_t n_bytes, float shift = 0);

  // Keeps the mapped files (and the f32 copies) alive.
  std::shared_ptr<gguf::Reader> gguf;
  std::shared_ptr<safetensors::Checkpoint> st;
  std::vector<std::vector<float>> owned;
  std::vector<std::vector<uint32_t>> owned_words;    // TQ1_0 / TQ2_0 matrices repacked to TERNARY
  std::vector<std::vector<WeightView>> owned_views;  // the experts' views (LayerWeights::gate_exps ...)
  std::vector<std::vector<uint8_t>> owned_bytes;     // matrices rearranged at load (gpt-oss's HF experts)
};

// "[a, b, c]" for error messages.
std::string shape_string(const std::vector<uint64_t>& shape);

// Loads a GGUF file or an HF model directory (config.json + safetensors). Throws ultra::Error naming the
// file and the problem (missing tensor, wrong shape, unsupported type or architecture).
std::unique_ptr<ModelData> load_model(const std::string& path);
std::unique_ptr<ModelData> load_gguf_model(const std::string& path);
std::unique_ptr<ModelData> load_hf_model(const std::string& dir);

}  // namespace ultra
