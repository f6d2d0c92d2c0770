#include "io/quant_mix.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <numeric>

#include "core/error.h"

namespace ultra {

namespace {

// llama.cpp's LLAMA_FTYPE_MOSTLY_* values of the mixes
enum Ftype : uint32_t {
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 8,
  kQ5_1 = 9,
  kQ2_K = 10,
  kQ3_K_S = 11,
  kQ3_K_M = 12,
  kQ3_K_L = 13,
  kQ4_K_S = 14,
  kQ4_K_M = 15,
  kQ5_K_S = 16,
  kQ5_K_M = 17,
  kQ6_K = 18,
  kIQ4_NL = 25,
  kIQ4_XS = 30,
};

constexpr QuantMix kMixes[] = {
    {"q4_0", kQ4_0, GgmlType::Q4_0},       {"q4_1", kQ4_1, GgmlType::Q4_1},
    {"q5_0", kQ5_0, GgmlType::Q5_0},       {"q5_1", kQ5_1, GgmlType::Q5_1},
    {"q2_k", kQ2_K, GgmlType::Q2_K},       {"q3_k_s", kQ3_K_S, GgmlType::Q3_K},
    {"q3_k_m", kQ3_K_M, GgmlType::Q3_K},   {"q3_k_l", kQ3_K_L, GgmlType::Q3_K},
    {"q4_k_s", kQ4_K_S, GgmlType::Q4_K},   {"q4_k_m", kQ4_K_M, GgmlType::Q4_K},
    {"q5_k_s", kQ5_K_S, GgmlType::Q5_K},   {"q5_k_m", kQ5_K_M, GgmlType::Q5_K},
    {"q6_k", kQ6_K, GgmlType::Q6_K},       {"iq4_nl", kIQ4_NL, GgmlType::IQ4_NL},
    {"iq4_xs", kIQ4_XS, GgmlType::IQ4_XS},
};

enum class Category {
  Output,
  TokenEmbd,
  AttnQkv,
  AttnKvB,
  AttnV,
  AttnK,
  AttnQ,
  AttnOutput,
  FfnUp,
  FfnGate,
  FfnDown,
  Other
};

bool has(const std::string& s, const char* part) {
  return s.find(part) != std::string::npos;
}

bool is_token_embd(const std::string& n) {
  return n == "token_embd.weight" || n == "per_layer_token_embd.weight";
}

Category category(const std::string& n) {
  if (n == "output.weight") return Category::Output;
  if (is_token_embd(n)) return Category::TokenEmbd;
  if (has(n, "attn_qkv.weight")) return Category::AttnQkv;
  if (has(n, "attn_kv_b.weight")) return Category::AttnKvB;
  if (has(n, "attn_v.weight")) return Category::AttnV;
  if (has(n, "attn_k.weight")) return Category::AttnK;
  if (has(n, "attn_q.weight")) return Category::AttnQ;
  if (has(n, "attn_output.weight")) return Category::AttnOutput;
  if (has(n, "ffn_up")) return Category::FfnUp;
  if (has(n, "ffn_gate")) return Category::FfnGate;
  if (has(n, "ffn_down")) return Category::FfnDown;
  return Category::Other;
}

bool is_attn_v_like(Category c) {
  return c == Category::AttnV || c == Category::AttnQkv || c == Category::AttnKvB;
}

// ggml_n_dims: dimensions up to the last one larger than 1
int n_dims(const std::vector<uint64_t>& ne) {
  int n = 1;
  for (size_t i = 1; i < ne.size(); ++i)
    if (ne[i] > 1) n = (int)i + 1;
  return n;
}

// tensor_allows_quantization (with llama-quantize's defaults: the output tensor is quantized)
bool allows_quantization(const std::string& n, const std::vector<uint64_t>& ne) {
  if (n_dims(ne) < 2) return false;
  if (!n.ends_with("weight")) return false;
  static const char* const kKept[] = {"_norm.weight",
                                      "ffn_gate_inp.weight",
                                      "ffn_gate_tid2eid.weight",
                                      "altup",
                                      "laurel",
                                      "per_layer_model_proj",
                                      "ssm_conv1d",
                                      "shortconv.conv.weight",
                                      "indexer.k_proj.weight",
                                      "indexer.q_proj.weight",
                                      "time_mix_first.weight",
                                      "time_mix_w0.weight",
                                      "time_mix_w1.weight",
                                      "time_mix_w2.weight",
                                      "time_mix_v0.weight",
                                      "time_mix_v1.weight",
                                      "time_mix_v2.weight",
                                      "time_mix_a0.weight",
                                      "time_mix_a1.weight",
                                      "time_mix_a2.weight",
                                      "time_mix_g1.weight",
                                      "time_mix_g2.weight",
                                      "time_mix_decay_w1.weight",
                                      "time_mix_decay_w2.weight",
                                      "time_mix_lerp_fused.weight",
                                      "attn_rel_b.weight",
                                      ".position_embd",
                                      "sam.pos_embd",
                                      "sam.neck.",
                                      "sam.net_",
                                      ".rel_pos",
                                      ".patch_embd",
                                      ".patch_merger",
                                      "a.rvq.codebook",
                                      "mm.a.code_embd"};
  for (const char* k : kKept)
    if (has(n, k)) return false;
  return n != "position_embd.weight" && n != "token_types.weight";
}

int layer_of(const std::string& n) {
  int il = -1;
  std::sscanf(n.c_str(), "blk.%d.", &il);
  return il;
}

struct State {
  const QuantMix& mix;
  const MixModel& m;
  bool tied = true;  // no output.weight: token_embd is also the LM head
  int n_attention_wv = 0, i_attention_wv = 0, i_ffn_down = 0;

  int n_gqa() const { return m.n_head_kv ? m.n_head / m.n_head_kv : 0; }
  bool falcon() const { return m.arch == "falcon"; }
  bool is70b() const { return m.arch == "llama" && m.n_layer == 80 && m.n_head != m.n_head_kv; }
  static bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }
  int ffn_layer(const std::string& name, int counter) const {
    if (m.n_expert <= 1) return counter;
    const int il = layer_of(name);
    if (il < 0 || il >= m.n_layer) fail("tensor {}: cannot tell its layer (0..{})", name, m.n_layer - 1);
    return il;
  }

  // llama_tensor_get_type_impl for the mixes of kMixes
  GgmlType mixed(GgmlType t, const std::string& name, uint64_t ne0, Category c) {
    const uint32_t f = mix.ftype;
    if (c == Category::Output || (tied && c == Category::TokenEmbd)) {
      if (falcon() || ne0 % type_traits(t)->block_elems != 0)
        t = GgmlType::Q8_0;
      else if (t != GgmlType::Q8_0)
        t = GgmlType::Q6_K;
    } else if (c == Category::TokenEmbd) {
      // (the IQ1/IQ2/IQ3 / ternary mixes only)
    } else if (is_attn_v_like(c)) {
      if (f == kQ2_K)
        t = n_gqa() >= 4 ? GgmlType::Q4_K : GgmlType::Q3_K;
      else if (f == kQ3_K_M)
        t = i_attention_wv < 2 ? GgmlType::Q5_K : GgmlType::Q4_K;
      else if (f == kQ3_K_L)
        t = GgmlType::Q5_K;
      else if ((f == kIQ4_NL || f == kIQ4_XS) && n_gqa() >= 4)
        t = GgmlType::Q5_K;
      else if ((f == kQ4_K_M || f == kQ5_K_M) && use_more_bits(i_attention_wv, n_attention_wv))
        t = GgmlType::Q6_K;
      else if (f == kQ4_K_S && i_attention_wv < 4)
        t = GgmlType::Q5_K;
      if (is70b() && (t == GgmlType::Q3_K || t == GgmlType::Q4_K)) t = GgmlType::Q5_K;
      if (m.n_expert == 8) t = GgmlType::Q8_0;
      ++i_attention_wv;
    } else if (c == Category::AttnK) {
      if (m.n_expert == 8) t = GgmlType::Q8_0;
    } else if (c == Category::FfnDown) {
      const int il = ffn_layer(name, i_ffn_down), nl = m.n_layer;
      if (f == kQ2_K) {
        t = GgmlType::Q3_K;
      } else if (f == kQ3_K_M) {
        t = il < nl / 16                         ? GgmlType::Q5_K
            : !falcon() || use_more_bits(il, nl) ? GgmlType::Q4_K
                                                 : GgmlType::Q3_K;
      } else if (f == kQ3_K_L) {
        t = falcon() ? GgmlType::Q4_K : GgmlType::Q5_K;
      } else if (f == kQ4_K_M) {
        if (falcon())
          t = il < nl / 16 ? GgmlType::Q6_K : use_more_bits(il, nl) ? GgmlType::Q5_K : GgmlType::Q4_K;
        else if (use_more_bits(il, nl))
          t = GgmlType::Q6_K;
      } else if (il < nl / 8 && (f == kIQ4_NL || f == kIQ4_XS) && !m.has_imatrix) {
        t = GgmlType::Q5_K;
      } else if (f == kQ5_K_M && use_more_bits(il, nl)) {
        t = GgmlType::Q6_K;
      } else if (f == kQ4_K_S && !falcon() && il < nl / 8) {
        t = GgmlType::Q5_K;
      } else if ((f == kQ4_0 || f == kQ5_0) && m.has_imatrix && il < nl / 8) {
        t = f == kQ4_0 ? GgmlType::Q4_1 : GgmlType::Q5_1;
      }
      ++i_ffn_down;
    } else if (c == Category::AttnOutput) {
      if (!falcon()) {
        if (m.n_expert == 8) {
          if (f == kQ2_K || f == kQ3_K_S || f == kQ3_K_M || f == kIQ4_NL || f == kQ4_K_S || f == kQ4_K_M ||
              f == kIQ4_XS)
            t = GgmlType::Q5_K;
        } else {
          if (f == kQ2_K)
            t = GgmlType::Q3_K;
          else if (f == kQ3_K_M)
            t = GgmlType::Q4_K;
          else if (f == kQ3_K_L)
            t = GgmlType::Q5_K;
        }
      } else if (f == kQ3_K_L) {
        t = GgmlType::Q4_K;
      }
    }
    return t;
  }
};

// tensor_type_fallback: a type whose block divides the row length
GgmlType fallback(GgmlType t, uint64_t ne0, std::string* warning) {
  const uint32_t blck = type_traits(t)->block_elems;
  if (ne0 % blck == 0) return t;
  GgmlType r = t;
  switch (t) {
    case GgmlType::IQ4_XS:
      r = GgmlType::IQ4_NL;
      break;
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
      r = GgmlType::Q4_0;
      break;
    case GgmlType::Q4_K:
      r = GgmlType::Q5_0;
      break;
    case GgmlType::Q5_K:
      r = GgmlType::Q5_1;
      break;
    case GgmlType::Q6_K:
      r = GgmlType::Q8_0;
      break;
    default:
      break;  // a 32-element type: only F16 below
  }
  if (ne0 % type_traits(r)->block_elems != 0) r = GgmlType::F16;
  *warning = fmt::format("{} columns are not a multiple of {} (required for {}); written as {}", ne0, blck,
                         type_name(t), type_name(r));
  return r;
}

}  // namespace

const QuantMix* find_quant_mix(std::string_view s) {
  std::string l(s);
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return (char)std::tolower(c); });
  if (l == "q3_k" || l == "q4_k" || l == "q5_k") l += "_m";  // llama-quantize's aliases
  for (const QuantMix& m : kMixes)
    if (l == m.name) return &m;
  return nullptr;
}

std::string quant_mix_names() {
  std::string s;
  for (const QuantMix& m : kMixes) s += (s.empty() ? "" : ", ") + std::string(m.name);
  return s;
}

std::vector<MixChoice> choose_tensor_types(const QuantMix& mix, const MixModel& model,
                                           const std::vector<MixTensor>& tensors) {
  State st{mix, model};
  for (const MixTensor& t : tensors) {
    const Category c = category(t.name);
    if (is_attn_v_like(c)) ++st.n_attention_wv;
    if (c == Category::Output) st.tied = false;
  }
  // llama.cpp's order (its weights map): by layer (-1 for the tensors outside blocks), then by name
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int la = layer_of(tensors[a].name), lb = layer_of(tensors[b].name);
    return la != lb ? la < lb : tensors[a].name < tensors[b].name;
  });
  std::vector<MixChoice> out(tensors.size());
  for (size_t i : order) {
    const MixTensor& t = tensors[i];
    MixChoice& ch = out[i];
    ch.quantize = allows_quantization(t.name, t.ne);
    ch.type = t.type;
    if (!ch.quantize) continue;
    const GgmlType mixed = st.mixed(mix.base, t.name, t.ne[0], category(t.name));
    ch.type = fallback(mixed, t.ne[0], &ch.warning);
  }
  return out;
}

}  // namespace ultra
