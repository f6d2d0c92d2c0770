// Tiny random-weight mixture-of-experts GGUF files in llama.cpp's layout (Mixtral as arch "llama" with
// experts, qwen2moe with its shared expert, qwen3moe, gpt-oss with its sinks, biases, alternating sliding
// window of 8 and YaRN), written at test time: the bundled model's tokenizer
// (models/target.gguf's tokenizer.* keys, so llama.cpp's llama-perplexity reads the same tokens), weights
// from a fixed-seed std::mt19937 (the same bytes on every platform), scaled so that activations stay near
// unit size and the logits are peaked (a wrong routing changes the perplexity by far more than 0.5%).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "core/quantize_blocks.h"
#include "io/gguf.h"

namespace ultra::test {

struct MoeSpec {
  std::string arch = "llama";  // "llama" (Mixtral), "qwen2moe", "qwen3moe" or "gpt-oss"
  int n_expert = 4;
  int n_expert_used = 2;
  int dim = 64;
  int n_layers = 2;
  int n_heads = 4;
  int n_kv_heads = 2;
  int expert_ffn = 64;            // llama: feed_forward_length; qwen: expert_feed_forward_length
  int shexp_ffn = 96;             // qwen2moe only
  GgmlType type = GgmlType::F32;  // of the matrices (the router and norms stay F32, as llama.cpp writes)
  std::optional<GgmlType> expert_type;  // of the experts' and the shared expert's matrices; unset: type
  uint32_t seed = 1;
  // Called before writing: change keys (w.set_*) or the tensors (names, shapes) about to be added.
  struct Tensor {
    std::string name;
    std::vector<uint64_t> ne;  // ggml order
    GgmlType type;
    std::vector<uint8_t> data;
  };
  std::function<void(gguf::Writer&, std::vector<Tensor>&)> edit;
};

inline void write_moe_gguf(const std::string& path, const MoeSpec& s,
                           const std::string& tokenizer_from = std::string(ULTRA_SOURCE_DIR) +
                                                               "/models/target.gguf") {
  const gguf::Reader tok = gguf::Reader::open(tokenizer_from);
  const int n_vocab = (int)tok.find_tensor("token_embd.weight")->ne[1];
  gguf::Writer w;
  const std::string a = s.arch + ".";
  w.set_string("general.architecture", s.arch);
  w.set_string("general.name", "tiny-moe-" + s.arch);
  w.set_u32(a + "context_length", 512);
  w.set_u32(a + "embedding_length", s.dim);
  w.set_u32(a + "block_count", s.n_layers);
  w.set_u32(a + "feed_forward_length", s.arch == "llama" ? s.expert_ffn : s.expert_ffn * s.n_expert_used);
  w.set_u32(a + "attention.head_count", s.n_heads);
  w.set_u32(a + "attention.head_count_kv", s.n_kv_heads);
  w.set_f32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
  w.set_f32(a + "rope.freq_base", 10000.0f);
  w.set_u32(a + "expert_count", s.n_expert);
  w.set_u32(a + "expert_used_count", s.n_expert_used);
  if (s.arch != "llama") w.set_u32(a + "expert_feed_forward_length", s.expert_ffn);
  if (s.arch == "qwen2moe") w.set_u32(a + "expert_shared_feed_forward_length", s.shexp_ffn);
  const bool gpt_oss = s.arch == "gpt-oss";
  if (gpt_oss) {
    w.set_u32(a + "attention.sliding_window", 8);
    w.set_string(a + "rope.scaling.type", "yarn");
    w.set_f32(a + "rope.scaling.factor", 32.0f);
    w.set_u32(a + "rope.scaling.original_context_length", 4096);
  }
  for (const auto& [k, v] : tok.metadata())
    if (k.rfind("tokenizer.", 0) == 0) w.set_value(k, v);

  std::mt19937 rng(s.seed);
  auto uniform = [&](float a) { return (float)((rng() / 4294967296.0) * 2 - 1) * a; };
  std::vector<MoeSpec::Tensor> ts;
  // ne {cols, rows[, n]}: values U(-a, a) with a = gain * sqrt(3 / cols) (output variance ~ gain^2).
  auto add = [&](const std::string& name, std::vector<uint64_t> ne, float gain, GgmlType type) {
    uint64_t n = 1;
    for (uint64_t d : ne) n *= d;
    std::vector<float> v(n);
    const float amp = gain * std::sqrt(3.0f / (float)ne[0]);
    for (float& x : v) x = uniform(amp);
    MoeSpec::Tensor t{name, ne, type, {}};
    if (type == GgmlType::F32) {
      t.data.resize(n * 4);
      std::memcpy(t.data.data(), v.data(), n * 4);
    } else if (type == GgmlType::F16) {
      t.data.resize(n * 2);
      for (uint64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_fp16(v[i]);
        std::memcpy(t.data.data() + 2 * i, &h, 2);
      }
    } else {
      const auto tt = type_traits(type);
      const uint64_t rb = row_bytes(*tt, ne[0]), rows = n / ne[0];
      t.data.resize(rb * rows);
      for (uint64_t r = 0; r < rows; ++r) {
        uint8_t* dst = t.data.data() + r * rb;
        if (type == GgmlType::Q8_0)
          cpu::quantize_row_q8_0(v.data() + r * ne[0], (int64_t)ne[0], reinterpret_cast<BlockQ8_0*>(dst));
        else
          quantize_row(type, v.data() + r * ne[0], (int64_t)ne[0], dst);
      }
    }
    ts.push_back(std::move(t));
  };
  auto norm = [&](const std::string& name, uint64_t n) {
    MoeSpec::Tensor t{name, {n}, GgmlType::F32, std::vector<uint8_t>(n * 4)};
    for (uint64_t i = 0; i < n; ++i) {
      const float x = 1 + uniform(0.2f);
      std::memcpy(t.data.data() + 4 * i, &x, 4);
    }
    ts.push_back(std::move(t));
  };
  const uint64_t D = s.dim, hd = s.dim / s.n_heads, Q = hd * s.n_heads, KV = hd * s.n_kv_heads,
                 E = s.n_expert, F = s.expert_ffn;
  const GgmlType et = s.expert_type.value_or(s.type);
  add("token_embd.weight", {D, (uint64_t)n_vocab}, std::sqrt((float)D / 3), s.type);  // entries U(-1, 1)
  for (int il = 0; il < s.n_layers; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    norm(b + "attn_norm.weight", D);
    add(b + "attn_q.weight", {D, Q}, 1, s.type);
    add(b + "attn_k.weight", {D, KV}, 1, s.type);
    add(b + "attn_v.weight", {D, KV}, 1, s.type);
    if (s.arch == "qwen2moe" || gpt_oss) {
      add(b + "attn_q.bias", {Q}, 0.1f, GgmlType::F32);
      add(b + "attn_k.bias", {KV}, 0.1f, GgmlType::F32);
      add(b + "attn_v.bias", {KV}, 0.1f, GgmlType::F32);
    }
    if (s.arch == "qwen3moe") {
      norm(b + "attn_q_norm.weight", hd);
      norm(b + "attn_k_norm.weight", hd);
    }
    add(b + "attn_output.weight", {Q, D}, 0.5f, s.type);
    norm(b + (gpt_oss ? "post_attention_norm.weight" : "ffn_norm.weight"), D);
    add(b + "ffn_gate_inp.weight", {D, E}, 2, GgmlType::F32);
    add(b + "ffn_gate_exps.weight", {D, F, E}, 1, et);
    add(b + "ffn_up_exps.weight", {D, F, E}, 1, et);
    add(b + "ffn_down_exps.weight", {F, D, E}, 1.5f, et);
    if (gpt_oss) {  // gain * sqrt(3 / ne[0]) per entry: the biases' spread set through the gain
      add(b + "attn_output.bias", {D}, 0.1f * std::sqrt((float)D / 3), GgmlType::F32);
      add(b + "attn_sinks.weight", {(uint64_t)s.n_heads}, 1.0f, GgmlType::F32);
      add(b + "ffn_gate_inp.bias", {E}, 0.3f, GgmlType::F32);
      add(b + "ffn_gate_exps.bias", {F, E}, 0.3f * std::sqrt((float)F / 3), GgmlType::F32);
      add(b + "ffn_up_exps.bias", {F, E}, 0.3f * std::sqrt((float)F / 3), GgmlType::F32);
      add(b + "ffn_down_exps.bias", {D, E}, 0.1f * std::sqrt((float)D / 3), GgmlType::F32);
    }
    if (s.arch == "qwen2moe") {
      add(b + "ffn_gate_inp_shexp.weight", {D}, 1, GgmlType::F32);
      add(b + "ffn_gate_shexp.weight", {D, (uint64_t)s.shexp_ffn}, 1, et);
      add(b + "ffn_up_shexp.weight", {D, (uint64_t)s.shexp_ffn}, 1, et);
      add(b + "ffn_down_shexp.weight", {(uint64_t)s.shexp_ffn, D}, 0.5f, et);
    }
  }
  norm("output_norm.weight", D);
  add("output.weight", {D, (uint64_t)n_vocab}, 1, s.type);
  if (s.edit) s.edit(w, ts);
  for (const auto& t : ts) w.add_tensor(t.name, t.type, t.ne, t.data.data(), t.data.size());
  w.write(path);
}

}  // namespace ultra::test
