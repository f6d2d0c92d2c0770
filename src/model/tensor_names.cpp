#include "model/tensor_names.h"

#include <fmt/format.h>

#include "core/error.h"

namespace ultra {

namespace {

using R = TensorRole;
using L = LayerWeights;

// One row per role, in TensorRole order (checked below).
constexpr TensorSpec kTensors[] = {
    {.role = R::TokEmbd,
     .gguf = "token_embd.weight",
     .hf = "model.embed_tokens.weight",
     .rows = Dim::Vocab,
     .cols = Dim::Embd},
    {.role = R::OutputNorm,
     .gguf = "output_norm.weight",
     .hf = "model.norm.weight",
     .rows = Dim::Embd,
     .norm = true},
    {.role = R::Output,
     .gguf = "output.weight",
     .hf = "lm_head.weight",
     .rows = Dim::Vocab,
     .cols = Dim::Embd},
    {.role = R::RopeFreqs,
     .gguf = "rope_freqs.weight",
     .hf = nullptr,
     .when = When::Never,
     .gguf_optional = true,
     .rows = Dim::HalfHead},
    {.role = R::RopeFactorsShort,
     .gguf = "rope_factors_short.weight",
     .hf = nullptr,
     .when = When::Never,
     .gguf_optional = true,
     .rows = Dim::HalfHead},
    {.role = R::RopeFactorsLong,
     .gguf = "rope_factors_long.weight",
     .hf = nullptr,
     .when = When::Never,
     .gguf_optional = true,
     .rows = Dim::HalfHead},
    // Per layer, in file order.
    {.role = R::AttnNorm,
     .gguf = "blk.{}.attn_norm.weight",
     .hf = "model.layers.{}.input_layernorm.weight",
     .rows = Dim::Embd,
     .vector = &L::attn_norm,
     .norm = true},
    {.role = R::AttnQkv,
     .gguf = "blk.{}.attn_qkv.weight",
     .hf = "model.layers.{}.self_attn.qkv_proj.weight",
     .when = When::Fused,
     .rows = Dim::QkvDim,
     .cols = Dim::Embd,
     .matrix = &L::wqkv,
     .parts = {{{&L::wq, Dim::QDim}, {&L::wk, Dim::KvDim}, {&L::wv, Dim::KvDim}}}},
    {.role = R::AttnQ,
     .gguf = "blk.{}.attn_q.weight",
     .hf = "model.layers.{}.self_attn.q_proj.weight",
     .when = When::Unfused,
     .rows = Dim::QDim,
     .cols = Dim::Embd,
     .matrix = &L::wq,
     .rope_rows = true},
    {.role = R::AttnK,
     .gguf = "blk.{}.attn_k.weight",
     .hf = "model.layers.{}.self_attn.k_proj.weight",
     .when = When::Unfused,
     .rows = Dim::KvDim,
     .cols = Dim::Embd,
     .matrix = &L::wk,
     .rope_rows = true},
    {.role = R::AttnV,
     .gguf = "blk.{}.attn_v.weight",
     .hf = "model.layers.{}.self_attn.v_proj.weight",
     .when = When::Unfused,
     .rows = Dim::KvDim,
     .cols = Dim::Embd,
     .matrix = &L::wv},
    {.role = R::AttnOut,
     .gguf = "blk.{}.attn_output.weight",
     .hf = "model.layers.{}.self_attn.o_proj.weight",
     .rows = Dim::Embd,
     .cols = Dim::QDim,
     .matrix = &L::wo},
    {.role = R::AttnQBias,
     .gguf = "blk.{}.attn_q.bias",
     .hf = "model.layers.{}.self_attn.q_proj.bias",
     .when = When::QkvBias,
     .gguf_optional = true,
     .rows = Dim::QDim,
     .vector = &L::bq,
     .rope_rows = true},
    {.role = R::AttnKBias,
     .gguf = "blk.{}.attn_k.bias",
     .hf = "model.layers.{}.self_attn.k_proj.bias",
     .when = When::QkvBias,
     .gguf_optional = true,
     .rows = Dim::KvDim,
     .vector = &L::bk,
     .rope_rows = true},
    {.role = R::AttnVBias,
     .gguf = "blk.{}.attn_v.bias",
     .hf = "model.layers.{}.self_attn.v_proj.bias",
     .when = When::QkvBias,
     .gguf_optional = true,
     .rows = Dim::KvDim,
     .vector = &L::bv},
    {.role = R::AttnOutBias,
     .gguf = "blk.{}.attn_output.bias",
     .hf = "model.layers.{}.self_attn.o_proj.bias",
     .when = When::OBias,
     .rows = Dim::Embd,
     .vector = &L::bo},
    {.role = R::AttnSinks,
     .gguf = "blk.{}.attn_sinks.weight",
     .hf = "model.layers.{}.self_attn.sinks",
     .when = When::Sinks,
     .rows = Dim::Heads,
     .vector = &L::attn_sinks},
    {.role = R::AttnQNorm,
     .gguf = "blk.{}.attn_q_norm.weight",
     .hf = "model.layers.{}.self_attn.q_norm.weight",
     .when = When::QkNorm,
     .rows = Dim::HeadDim,
     .vector = &L::q_norm,
     .norm = true},
    {.role = R::AttnKNorm,
     .gguf = "blk.{}.attn_k_norm.weight",
     .hf = "model.layers.{}.self_attn.k_norm.weight",
     .when = When::QkNorm,
     .rows = Dim::HeadDim,
     .vector = &L::k_norm,
     .norm = true},
    {.role = R::AttnPostNorm,
     .gguf = "blk.{}.post_attention_norm.weight",
     .hf = "model.layers.{}.post_attention_layernorm.weight",
     .when = When::PostNorms,
     .rows = Dim::Embd,
     .vector = &L::attn_post_norm,
     .norm = true},
    // HF's post_attention_layernorm is the FFN input norm, except with post norms (Gemma).
    {.role = R::FfnNorm,
     .gguf = "blk.{}.ffn_norm.weight",
     .hf = "model.layers.{}.post_attention_layernorm.weight",
     .hf_alt_when = When::PostNorms,
     .hf_alt = "model.layers.{}.pre_feedforward_layernorm.weight",
     .gguf_alt_when = When::GptOss,
     .gguf_alt = "blk.{}.post_attention_norm.weight",
     .rows = Dim::Embd,
     .vector = &L::ffn_norm,
     .norm = true},
    {.role = R::FfnPostNorm,
     .gguf = "blk.{}.post_ffw_norm.weight",
     .hf = "model.layers.{}.post_feedforward_layernorm.weight",
     .when = When::PostNorms,
     .rows = Dim::Embd,
     .vector = &L::ffn_post_norm,
     .norm = true},
    {.role = R::FfnGateUp,
     .gguf = "blk.{}.ffn_up.weight",
     .hf = "model.layers.{}.mlp.gate_up_proj.weight",
     .when = When::Fused,
     .rows = Dim::Ffn2,
     .cols = Dim::Embd,
     .matrix = &L::w_gate_up,
     .parts = {{{&L::w_gate, Dim::Ffn}, {&L::w_up, Dim::Ffn}}}},
    {.role = R::FfnGate,
     .gguf = "blk.{}.ffn_gate.weight",
     .hf = "model.layers.{}.mlp.gate_proj.weight",
     .when = When::DenseUnfused,
     .rows = Dim::Ffn,
     .cols = Dim::Embd,
     .matrix = &L::w_gate},
    {.role = R::FfnUp,
     .gguf = "blk.{}.ffn_up.weight",
     .hf = "model.layers.{}.mlp.up_proj.weight",
     .when = When::DenseUnfused,
     .rows = Dim::Ffn,
     .cols = Dim::Embd,
     .matrix = &L::w_up},
    {.role = R::FfnDown,
     .gguf = "blk.{}.ffn_down.weight",
     .hf = "model.layers.{}.mlp.down_proj.weight",
     .when = When::Dense,
     .rows = Dim::Embd,
     .cols = Dim::Ffn,
     .matrix = &L::w_down},
    // Mixture of experts: Qwen2/3-MoE's HF names, Mixtral's as the alternative.
    {.role = R::FfnGateInp,
     .gguf = "blk.{}.ffn_gate_inp.weight",
     .hf = "model.layers.{}.mlp.gate.weight",
     .when = When::Moe,
     .hf_alt_when = When::MixtralNames,
     .hf_alt = "model.layers.{}.block_sparse_moe.gate.weight",
     .hf_gpt_oss = "model.layers.{}.mlp.router.weight",
     .rows = Dim::Experts,
     .cols = Dim::Embd,
     .matrix = &L::ffn_gate_inp},
    {.role = R::FfnGateInpBias,
     .gguf = "blk.{}.ffn_gate_inp.bias",
     .hf = "model.layers.{}.mlp.router.bias",
     .when = When::ExpertBias,
     .rows = Dim::Experts,
     .vector = &L::ffn_gate_inp_b},
    {.role = R::FfnGateExps,
     .gguf = "blk.{}.ffn_gate_exps.weight",
     .hf = "model.layers.{}.mlp.experts.{}.gate_proj.weight",
     .when = When::Moe,
     .hf_alt_when = When::MixtralNames,
     .hf_alt = "model.layers.{}.block_sparse_moe.experts.{}.w1.weight",
     .hf_when = When::NotGptOss,
     .rows = Dim::ExpertFfn,
     .cols = Dim::Embd,
     .experts = &L::gate_exps},
    {.role = R::FfnGateExpsBias,
     .gguf = "blk.{}.ffn_gate_exps.bias",
     .hf = nullptr,
     .when = When::ExpertBias,
     .rows = Dim::Experts,
     .cols = Dim::ExpertFfn,
     .vector = &L::gate_exps_b},
    {.role = R::FfnUpExps,
     .gguf = "blk.{}.ffn_up_exps.weight",
     .hf = "model.layers.{}.mlp.experts.{}.up_proj.weight",
     .when = When::Moe,
     .hf_alt_when = When::MixtralNames,
     .hf_alt = "model.layers.{}.block_sparse_moe.experts.{}.w3.weight",
     .hf_when = When::NotGptOss,
     .rows = Dim::ExpertFfn,
     .cols = Dim::Embd,
     .experts = &L::up_exps},
    {.role = R::FfnUpExpsBias,
     .gguf = "blk.{}.ffn_up_exps.bias",
     .hf = nullptr,
     .when = When::ExpertBias,
     .rows = Dim::Experts,
     .cols = Dim::ExpertFfn,
     .vector = &L::up_exps_b},
    {.role = R::FfnDownExps,
     .gguf = "blk.{}.ffn_down_exps.weight",
     .hf = "model.layers.{}.mlp.experts.{}.down_proj.weight",
     .when = When::Moe,
     .hf_alt_when = When::MixtralNames,
     .hf_alt = "model.layers.{}.block_sparse_moe.experts.{}.w2.weight",
     .hf_when = When::NotGptOss,
     .rows = Dim::Embd,
     .cols = Dim::ExpertFfn,
     .experts = &L::down_exps},
    {.role = R::FfnDownExpsBias,
     .gguf = "blk.{}.ffn_down_exps.bias",
     .hf = nullptr,
     .when = When::ExpertBias,
     .rows = Dim::Experts,
     .cols = Dim::Embd,
     .vector = &L::down_exps_b},
    // HF stores the shared expert's gate as a [1, dim] matrix (loaded as the vector).
    {.role = R::FfnGateInpShexp,
     .gguf = "blk.{}.ffn_gate_inp_shexp.weight",
     .hf = "model.layers.{}.mlp.shared_expert_gate.weight",
     .when = When::SharedExpert,
     .rows = Dim::Embd,
     .vector = &L::ffn_gate_inp_shexp},
    {.role = R::FfnGateShexp,
     .gguf = "blk.{}.ffn_gate_shexp.weight",
     .hf = "model.layers.{}.mlp.shared_expert.gate_proj.weight",
     .when = When::SharedExpert,
     .rows = Dim::ShexpFfn,
     .cols = Dim::Embd,
     .matrix = &L::w_gate_shexp},
    {.role = R::FfnUpShexp,
     .gguf = "blk.{}.ffn_up_shexp.weight",
     .hf = "model.layers.{}.mlp.shared_expert.up_proj.weight",
     .when = When::SharedExpert,
     .rows = Dim::ShexpFfn,
     .cols = Dim::Embd,
     .matrix = &L::w_up_shexp},
    {.role = R::FfnDownShexp,
     .gguf = "blk.{}.ffn_down_shexp.weight",
     .hf = "model.layers.{}.mlp.shared_expert.down_proj.weight",
     .when = When::SharedExpert,
     .rows = Dim::Embd,
     .cols = Dim::ShexpFfn,
     .matrix = &L::w_down_shexp},
};

constexpr size_t kFirstLayerRow = (size_t)R::AttnNorm;
constexpr size_t kRows = sizeof kTensors / sizeof kTensors[0];

constexpr bool in_role_order() {
  for (size_t i = 0; i < kRows; ++i)
    if ((size_t)kTensors[i].role != i) return false;
  return kRows == (size_t)R::Count;
}
static_assert(in_role_order(), "kTensors must have one row per TensorRole, in TensorRole order");

}  // namespace

int64_t dim_size(Dim d, const HParams& hp) {
  const int64_t q_dim = (int64_t)hp.n_heads * hp.head_dim, kv_dim = (int64_t)hp.n_kv_heads * hp.head_dim;
  switch (d) {
    case Dim::None:
      return 0;
    case Dim::Embd:
      return hp.dim;
    case Dim::QDim:
      return q_dim;
    case Dim::KvDim:
      return kv_dim;
    case Dim::QkvDim:
      return q_dim + 2 * kv_dim;
    case Dim::HeadDim:
      return hp.head_dim;
    case Dim::HalfHead:
      return hp.head_dim / 2;
    case Dim::Ffn:
      return hp.ffn_dim;
    case Dim::Ffn2:
      return 2 * (int64_t)hp.ffn_dim;
    case Dim::Vocab:
      return hp.n_vocab;
    case Dim::ExpertFfn:
      return hp.expert_ffn_dim;
    case Dim::ShexpFfn:
      return hp.shexp_ffn_dim;
    case Dim::Experts:
      return hp.n_expert;
    case Dim::Heads:
      return hp.n_heads;
  }
  return 0;
}

bool holds(When w, const HParams& hp) {
  switch (w) {
    case When::Always:
      return true;
    case When::Never:
      return false;
    case When::Fused:
      return hp.arch == Arch::Phi3;
    case When::Unfused:
      return hp.arch != Arch::Phi3;
    case When::QkvBias:
      return hp.qkv_bias;
    case When::QkNorm:
      return hp.qk_norm;
    case When::PostNorms:
      return hp.post_norms;
    case When::Dense:
      return !hp.moe();
    case When::DenseUnfused:
      return !hp.moe() && hp.arch != Arch::Phi3;
    case When::Moe:
      return hp.moe();
    case When::SharedExpert:
      return hp.shexp_ffn_dim > 0;
    case When::MixtralNames:
      return hp.moe() && (hp.arch == Arch::Llama || hp.arch == Arch::Mistral);
    case When::OBias:
      return hp.o_bias;
    case When::Sinks:
      return hp.attn_sinks;
    case When::ExpertBias:
      return hp.expert_bias;
    case When::GptOss:
      return hp.arch == Arch::GptOss;
    case When::NotGptOss:
      return hp.arch != Arch::GptOss;
  }
  return false;
}

Need tensor_need(const TensorSpec& t, const HParams& hp, TensorFormat f) {
  if (f == TensorFormat::Hf && (!t.hf || !holds(t.hf_when, hp))) return Need::Absent;
  if (holds(t.when, hp)) return Need::Required;
  return f == TensorFormat::Gguf && t.gguf_optional ? Need::Optional : Need::Absent;
}

std::span<const TensorSpec> layer_tensors() {
  return std::span<const TensorSpec>(kTensors).subspan(kFirstLayerRow);
}

const TensorSpec& tensor_spec(TensorRole r) {
  return kTensors[(size_t)r];
}

std::string tensor_name(const TensorSpec& t, const HParams& hp, TensorFormat f, int il, int e) {
  if (f == TensorFormat::Gguf)
    return fmt::format(fmt::runtime(t.gguf_alt && holds(t.gguf_alt_when, hp) ? t.gguf_alt : t.gguf), il);
  const char* pattern = t.hf_alt && holds(t.hf_alt_when, hp) ? t.hf_alt : t.hf;
  if (t.hf_gpt_oss && hp.arch == Arch::GptOss) pattern = t.hf_gpt_oss;
  if (!pattern) fail("tensor '{}' has no HF name", t.gguf);
  return fmt::format(fmt::runtime(pattern), il, e);
}

std::string gguf_name(TensorRole r, int il) {
  return fmt::format(fmt::runtime(tensor_spec(r).gguf), il);
}

std::string hf_name(TensorRole r, const HParams& hp, int il) {
  return tensor_name(tensor_spec(r), hp, TensorFormat::Hf, il);
}

float norm_shift(const TensorSpec& t, const HParams& hp, TensorFormat f) {
  const bool gemma = hp.arch == Arch::Gemma2 || hp.arch == Arch::Gemma3;
  return t.norm && f == TensorFormat::Hf && gemma ? 1.0f : 0.0f;
}

}  // namespace ultra
