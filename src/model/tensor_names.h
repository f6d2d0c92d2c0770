// The tensors of a model, named once for every format (as llama.cpp's llama-arch.cpp keeps
// {LLM_TENSOR_ATTN_Q, "blk.%d.attn_q"}): one row per tensor role gives its GGUF name (llama.cpp's
// convention), its HF transformers name, the architectures that have it, its shape in hyper-parameters and
// the LayerWeights slot it fills. The GGUF loader, the HF loader (load_layer_tensors in loader_util.h) and
// the HF -> GGUF converter iterate the per-layer rows in table order, which is also the order the converter
// writes them in; the whole-model rows give their names and shapes to code of their own (tied output,
// rope factors).
//
// A new tensor is a new row plus its LayerWeights slot (and its use in forward). Mixture-of-experts rows
// have an `experts` slot: llama.cpp's stacked blk.{}.ffn_{gate,up,down}_exps [n_expert, rows, cols] in GGUF,
// one tensor per expert in HF (the second "{}" of the HF name is the expert), each expert a view of its own.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "model/hparams.h"
#include "model/model.h"

namespace ultra {

// Every tensor role, in table order: the whole-model tensors, then the per-layer ones in file order.
enum class TensorRole : uint8_t {
  TokEmbd,
  OutputNorm,
  Output,            // absent when the embeddings are tied
  RopeFreqs,         // Llama-3 rope scaling as per-pair frequency divisors (GGUF only)
  RopeFactorsShort,  // Phi-3 LongRoPE divisors (GGUF only; HF keeps them in config.json)
  RopeFactorsLong,
  AttnNorm,
  AttnQkv,  // Phi-3's fused [Wq; Wk; Wv]
  AttnQ,
  AttnK,
  AttnV,
  AttnOut,
  AttnQBias,
  AttnKBias,
  AttnVBias,
  AttnOutBias,  // gpt-oss
  AttnSinks,    // gpt-oss: a logit per head in the softmax's denominator
  AttnQNorm,
  AttnKNorm,
  AttnPostNorm,
  FfnNorm,
  FfnPostNorm,
  FfnGateUp,  // Phi-3's fused [W_gate; W_up] (GGUF names it ffn_up)
  FfnGate,
  FfnUp,
  FfnDown,
  FfnGateInp,      // the router [n_expert, dim]
  FfnGateInpBias,  // gpt-oss: the router's bias and the experts' biases
  FfnGateExps,
  FfnGateExpsBias,
  FfnUpExps,
  FfnUpExpsBias,
  FfnDownExps,
  FfnDownExpsBias,
  FfnGateInpShexp,  // Qwen2-MoE: the shared expert's sigmoid gate [dim], and its SwiGLU FFN
  FfnGateShexp,
  FfnUpShexp,
  FfnDownShexp,
  Count
};

// A tensor dimension in hyper-parameters (dim_size).
enum class Dim : uint8_t {
  None,       // no dimension: a vector's cols
  Embd,       // hp.dim
  QDim,       // n_heads * head_dim
  KvDim,      // n_kv_heads * head_dim
  QkvDim,     // QDim + 2 * KvDim
  HeadDim,    // head_dim
  HalfHead,   // head_dim / 2
  Ffn,        // ffn_dim
  Ffn2,       // 2 * ffn_dim
  Vocab,      // n_vocab
  ExpertFfn,  // expert_ffn_dim
  ShexpFfn,   // shexp_ffn_dim
  Experts,    // n_expert
  Heads,      // n_heads
};
int64_t dim_size(Dim d, const HParams& hp);

// Which models have a tensor, from the hyper-parameters the architecture set (holds).
enum class When : uint8_t {
  Always,
  Never,
  Fused,         // fused QKV and gate/up matrices (Phi-3)
  Unfused,       // separate Q, K, V and gate, up matrices (every other architecture)
  QkvBias,       // hp.qkv_bias (Qwen2)
  QkNorm,        // hp.qk_norm (Qwen3, Gemma 3)
  PostNorms,     // hp.post_norms (Gemma 2/3)
  Dense,         // a dense FFN (no experts)
  DenseUnfused,  // a dense FFN with separate gate and up matrices
  Moe,           // experts (hp.n_expert > 0)
  SharedExpert,  // a shared expert (hp.shexp_ffn_dim > 0)
  MixtralNames,  // experts in an HF Mixtral checkpoint (block_sparse_moe.*)
  OBias,         // hp.o_bias (gpt-oss)
  Sinks,         // hp.attn_sinks (gpt-oss)
  ExpertBias,    // hp.expert_bias (gpt-oss)
  GptOss,        // arch gpt-oss
  NotGptOss,     // any other arch
};
bool holds(When w, const HParams& hp);

enum class TensorFormat : uint8_t { Gguf, Hf };

// Consecutive row ranges of a fused matrix, viewed as matrices of their own (row_slice).
struct RowPart {
  WeightView LayerWeights::*slot = nullptr;
  Dim rows = Dim::None;
};

struct TensorSpec {
  TensorRole role;
  // Names; "{}" stands for the layer index. hf: nullptr where HF checkpoints have no such tensor.
  const char* gguf;
  const char* hf;
  When when = When::Always;
  // The HF name where hf_alt_when holds, instead of hf (Gemma's pre_feedforward_layernorm for ffn_norm).
  When hf_alt_when = When::Never;
  const char* hf_alt = nullptr;
  // The HF name in gpt-oss checkpoints, where it differs (its router is mlp.router).
  const char* hf_gpt_oss = nullptr;
  // HF checkpoints hold the tensor under its hf name only where hf_when holds too (gpt-oss's experts are
  // fused tensors of their own, which model/gpt_oss.h reads).
  When hf_when = When::Always;
  // The GGUF name where gguf_alt_when holds, instead of gguf (llama.cpp names gpt-oss's FFN input norm
  // post_attention_norm).
  When gguf_alt_when = When::Never;
  const char* gguf_alt = nullptr;
  // A GGUF file may carry the tensor where `when` does not hold; it is then loaded if present (llama.cpp's
  // TENSOR_NOT_REQUIRED: attention biases of any Llama-family file).
  bool gguf_optional = false;
  // Shape [rows, cols] as HF and WeightView order it (GGUF's ne is {cols, rows}); cols None: a vector [rows].
  // A vector slot with cols: rows * cols floats, row-major (gpt-oss's expert biases [n_expert, n]).
  Dim rows = Dim::None;
  Dim cols = Dim::None;
  // Where a per-layer tensor goes: a matrix or a vector slot.
  WeightView LayerWeights::*matrix = nullptr;
  const float* LayerWeights::*vector = nullptr;
  // Or the experts: hp.n_expert matrices [rows, cols] (GGUF: one tensor of ne {cols, rows, n_expert}).
  const WeightView* LayerWeights::*experts = nullptr;
  bool norm = false;       // an RMSNorm weight: HF Gemma stores w for x * (1 + w), loaded as 1 + w
  bool rope_rows = false;  // rows in HF's rotate-half order; GGUF arch "llama" permutes them (interleaved)
  std::array<RowPart, 3> parts{};  // a fused matrix: its row ranges as these slots
};

// Whether a model has a tensor, in a file of format f.
enum class Need : uint8_t { Absent, Required, Optional };
Need tensor_need(const TensorSpec& t, const HParams& hp, TensorFormat f);

// The per-layer rows, in file order.
std::span<const TensorSpec> layer_tensors();
// The row of a role.
const TensorSpec& tensor_spec(TensorRole r);

// The tensor's name in format f for layer il (ignored by whole-model tensors) and expert e (HF's experts).
std::string tensor_name(const TensorSpec& t, const HParams& hp, TensorFormat f, int il = 0, int e = 0);
std::string gguf_name(TensorRole r, int il = 0);
std::string hf_name(TensorRole r, const HParams& hp, int il = 0);

// What a vector of t is shifted by when loaded from format f (Gemma's HF norms: 1).
float norm_shift(const TensorSpec& t, const HParams& hp, TensorFormat f);

}  // namespace ultra
