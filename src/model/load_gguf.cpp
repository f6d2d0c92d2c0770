// GGUF file -> ModelData, following llama.cpp's conventions: keys {arch}.embedding_length etc., tensors
// token_embd, blk.N.attn_q ..., output_norm, output (absent when tied), optional rope_freqs (Llama-3
// rope scaling factors), named in model/tensor_names.cpp. Arch "llama" files have Q/K rows permuted for
// interleaved-pair RoPE; "qwen2" files keep HF's rotate-half layout. Mixtures of experts: "llama" with
// {arch}.expert_count (Mixtral), "qwen2moe" (with its shared expert) and "qwen3moe", experts stacked in 3-D
// ffn_{gate,up,down}_exps tensors (read_expert_keys).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "core/error.h"
#include "core/quants.h"
#include "io/gguf.h"
#include "model/loader_util.h"
#include "model/lowbit_weights.h"
#include "model/model.h"

namespace ultra {

std::string unused_tensors_message(std::vector<std::string> names) {
  std::sort(names.begin(), names.end());
  constexpr size_t kShown = 6;
  std::string r =
      fmt::format("{} tensor{} not used by the model:", names.size(), names.size() == 1 ? " is" : "s are");
  for (size_t i = 0; i < names.size() && i < kShown; ++i) r += fmt::format("{} '{}'", i ? "," : "", names[i]);
  if (names.size() > kShown) r += fmt::format(" and {} more", names.size() - kShown);
  return r;
}

namespace {

constexpr const char* kSupportedWeightTypes =
    "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4, "
    "F8_E4M3, "
    "TERNARY, TQ1_0, TQ2_0";

struct GgufLoader {
  ModelData& m;
  const gguf::Reader& r;
  std::unordered_set<std::string> used;  // tensors the model took

  const gguf::TensorInfo& get(const std::string& name) {
    const auto* t = r.find_tensor(name);
    if (!t) fail("{}: missing tensor '{}'", r.path(), name);
    used.insert(name);
    return *t;
  }

  // Every tensor of the file must be used (llama.cpp refuses a count mismatch too): a leftover one means
  // the hyper-parameters do not describe the file (block_count 7 on an 8-layer file would otherwise run a
  // truncated model).
  void check_all_used(const std::string& hint) const {
    std::vector<std::string> unused;
    for (const auto& t : r.tensors())
      if (!used.count(t.name)) unused.push_back(t.name);
    if (!unused.empty()) fail("{}: {} ({})", r.path(), unused_tensors_message(unused), hint);
  }

  WeightView matrix(const std::string& name, int64_t rows, int64_t cols) {
    const auto& t = get(name);
    if (t.ne.size() != 2 || (int64_t)t.ne[0] != cols || (int64_t)t.ne[1] != rows)
      fail("{}: tensor '{}' has shape {}, expected [{}, {}] (ggml order)", r.path(), name, shape_string(t.ne),
           cols, rows);
    return view(t, name, rows, cols);
  }

  // llama.cpp's stacked experts: one tensor of ne {cols, rows, n_expert}, expert e its rows [e * rows,
  // (e + 1) * rows) viewed as a matrix of its own.
  std::vector<WeightView> experts(const std::string& name, int n_expert, int64_t rows, int64_t cols) {
    const auto& t = get(name);
    if (t.ne.size() != 3 || (int64_t)t.ne[0] != cols || (int64_t)t.ne[1] != rows)
      fail("{}: tensor '{}' has shape {}, expected [{}, {}, {}] (ggml order: {} experts of [{}, {}])",
           r.path(), name, shape_string(t.ne), cols, rows, n_expert, n_expert, cols, rows);
    if ((int64_t)t.ne[2] != n_expert)
      fail("{}: tensor '{}' holds {} experts but expert_count is {}", r.path(), name, t.ne[2], n_expert);
    if (has_scale_tensor(t.type) || t.type == GgmlType::TQ1_0 || t.type == GgmlType::TQ2_0)
      fail(
          "{}: tensor '{}' has type {}, not supported for experts (F32, F16, BF16, Q8_0 and the block types "
          "are)",
          r.path(), name, type_name(t.type));
    const WeightView all = view(t, name, rows * n_expert, cols);
    std::vector<WeightView> v;
    for (int e = 0; e < n_expert; ++e) v.push_back(row_slice(all, (int64_t)e * rows, rows));
    return v;
  }

  WeightView view(const gguf::TensorInfo& t, const std::string& name, int64_t rows, int64_t cols) {
    if (is_block_weight_type(t.type) || t.type == GgmlType::Q8_0) {
      // A block scale that is not finite would turn every output it touches into NaN: refused here, once.
      const auto tt = type_traits(t.type);
      if (const int64_t b = first_nonfinite_block(t.type, t.data, (int64_t)(t.n_bytes / tt->block_bytes));
          b >= 0)
        fail("{}: tensor '{}' ({}): block {} (row {}) has a scale that is not finite", r.path(), name,
             type_name(t.type), b, b / (cols / tt->block_elems));
      return m.add_matrix(t.type, t.data, rows, cols, t.n_bytes);
    }
    switch (t.type) {
      case GgmlType::F32:
      case GgmlType::F16:
      case GgmlType::BF16:
        return m.add_matrix(t.type, t.data, rows, cols, t.n_bytes);
      case GgmlType::F8_E4M3:
      case GgmlType::TERNARY:
      case GgmlType::TQ1_0:
      case GgmlType::TQ2_0: {
        std::string scale_name;
        const WeightView w = gguf_matrix_view(r, t, &scale_name);
        if (!scale_name.empty()) used.insert(scale_name);
        m.weight_bytes += t.n_bytes + (w.scale ? (w.scale_row_stride ? rows : 1) * 4 : 0);
        return prepare_lowbit(m, w, fmt::format("{}: tensor '{}'", r.path(), name));
      }
      default:
        fail("{}: tensor '{}' has type {} ({}), supported: {}", r.path(), name, type_name(t.type),
             (uint32_t)t.type, kSupportedWeightTypes);
    }
  }

  bool has(const std::string& name) const { return r.find_tensor(name) != nullptr; }

  // (Gemma's norm weights are stored as 1 + w by llama.cpp's converter and ours: used as they are, shift 0.)
  const float* vec(const std::string& name, int64_t n, float shift = 0) {
    const auto& t = get(name);
    if (t.ne.size() != 1 || (int64_t)t.ne[0] != n)
      fail("{}: tensor '{}' has shape {}, expected [{}]", r.path(), name, shape_string(t.ne), n);
    const float* v = m.add_vector(t.type, t.data, n, t.n_bytes, shift);
    if (!v) fail("{}: tensor '{}' has type {}, expected F32, F16 or BF16", r.path(), name, type_name(t.type));
    return v;
  }

  // A [rows, cols] tensor (ggml ne {cols, rows}) as rows * cols f32 values (gpt-oss's expert biases).
  const float* vec2(const std::string& name, int64_t rows, int64_t cols) {
    const auto& t = get(name);
    if (t.ne.size() != 2 || (int64_t)t.ne[0] != cols || (int64_t)t.ne[1] != rows)
      fail("{}: tensor '{}' has shape {}, expected [{}, {}] (ggml order)", r.path(), name, shape_string(t.ne),
           cols, rows);
    const float* v = m.add_vector(t.type, t.data, rows * cols, t.n_bytes);
    if (!v) fail("{}: tensor '{}' has type {}, expected F32, F16 or BF16", r.path(), name, type_name(t.type));
    return v;
  }

  // A whole-model vector the file may lack (GGUF-only rope factors): nullptr when absent.
  const float* optional_vec(TensorRole role, const HParams& hp) {
    const TensorSpec& t = tensor_spec(role);
    const std::string name = tensor_name(t, hp, TensorFormat::Gguf);
    return has(name) ? vec(name, dim_size(t.rows, hp)) : nullptr;
  }

  // A float key, finite and representable as a float (a larger double would convert with undefined
  // behaviour); range checks of the value are HParams::validate's.
  float key_float(const std::string& key, double fallback) {
    const double v = r.get_float_opt(key).value_or(fallback);
    if (!std::isfinite(v) || std::fabs(v) > std::numeric_limits<float>::max())
      fail("{}: key '{}' = {} is not a finite float", r.path(), key, v);
    return (float)v;
  }

  // A token id key: absent, or -1 / 0xFFFFFFFF (llama.cpp's "none"), gives -1; an id >= n_vocab is an error.
  int32_t token_id(const std::string& key, int n_vocab) {
    const gguf::Value* v = r.find(key);
    if (!v) return -1;
    if (v->type == gguf::ValueType::STRING || v->type == gguf::ValueType::ARRAY)
      fail("{}: key '{}' has type {}, expected a token id", r.path(), key, gguf::value_type_name(v->type));
    const int64_t id = v->as_int();
    if (id == -1 || id == 0xFFFFFFFF) return -1;
    if (id < 0 || id >= n_vocab)
      fail("{}: {} = {} is outside the vocabulary of {} tokens", r.path(), key, id, n_vocab);
    return (int32_t)id;
  }

  int key_int(const std::string& key, std::optional<int> fallback = std::nullopt) {
    auto v = r.get_uint_opt(key);
    if (!v) {
      if (fallback) return *fallback;
      fail("{}: missing key '{}'", r.path(), key);
    }
    if (*v > (1u << 30)) fail("{}: key '{}' = {} is out of range", r.path(), key, *v);
    return (int)*v;
  }
};

// The expert keys as llama.cpp reads them: {arch}.expert_count and expert_used_count (Mixtral's "llama"
// files, qwen2moe, qwen3moe, gpt-oss); the experts' FFN size is feed_forward_length for llama, else
// expert_feed_forward_length (default feed_forward_length / expert_used_count); qwen2moe's shared expert is
// expert_shared_feed_forward_length (default feed_forward_length). llama.cpp renormalises the top-k weights
// for llama and qwen3moe, not for qwen2moe (whatever the checkpoint's norm_topk_prob); gpt-oss takes the
// softmax of the top k logits (hp.expert_topk_softmax, set by the caller).
void read_expert_keys(GgufLoader& L, const std::string& arch, HParams& hp) {
  const std::string a = arch + ".", path = L.r.path();
  const bool moe_arch = arch == "qwen2moe" || arch == "qwen3moe" || arch == "gpt-oss";
  hp.n_expert = L.key_int(a + "expert_count", 0);
  hp.n_expert_used = L.key_int(a + "expert_used_count", 0);
  const std::string router = gguf_name(TensorRole::FfnGateInp, 0);
  const gguf::TensorInfo* r0 = L.r.find_tensor(router);
  if (hp.n_expert == 0) {
    if (moe_arch) fail("{}: {} needs {}expert_count > 0", path, arch, a);
    if (r0)
      fail("{}: the file has expert tensors ('{}') but {}expert_count is 0 or missing", path, router, a);
    if (hp.n_expert_used != 0)
      fail("{}: {}expert_used_count = {} without experts", path, a, hp.n_expert_used);
    return;
  }
  if (arch != "llama" && !moe_arch)
    fail("{}: {}expert_count = {}: experts are supported for llama, qwen2moe, qwen3moe and gpt-oss", path, a,
         hp.n_expert);
  if (hp.n_expert_used < 1 || hp.n_expert_used > hp.n_expert)
    fail("{}: {}expert_used_count = {} must be between 1 and expert_count = {}", path, a, hp.n_expert_used,
         hp.n_expert);
  if (r0 && r0->ne.size() == 2 && r0->ne[1] != (uint64_t)hp.n_expert)
    fail("{}: {}expert_count = {} but '{}' routes to {} experts", path, a, hp.n_expert, router, r0->ne[1]);
  hp.expert_norm = arch != "qwen2moe" && arch != "gpt-oss";
  hp.expert_ffn_dim = arch == "llama"
                          ? hp.ffn_dim
                          : L.key_int(a + "expert_feed_forward_length", hp.ffn_dim / hp.n_expert_used);
  if (arch == "qwen2moe") hp.shexp_ffn_dim = L.key_int(a + "expert_shared_feed_forward_length", hp.ffn_dim);
}

// YaRN as llama.cpp's keys give it: rope.scaling.original_context_length (default context_length),
// yarn_beta_fast / yarn_beta_slow (32 / 1); the attention factor is HF's and llama.cpp's default
// 0.1 ln(factor) + 1 (a file that sets llama.cpp's other YaRN knobs is refused rather than run differently).
// The correction range is rounded outwards as llama.cpp does, except for gpt-oss, whose every HF config says
// truncate false (transformers computes it unrounded).
void read_yarn_keys(GgufLoader& L, const std::string& a, bool gpt_oss, RopeScaling& rs) {
  const std::string path = L.r.path();
  rs.original_max_position_embeddings =
      L.key_int(a + "rope.scaling.original_context_length", L.key_int(a + "context_length", 2048));
  rs.beta_fast = L.key_float(a + "rope.scaling.yarn_beta_fast", 32.0);
  rs.beta_slow = L.key_float(a + "rope.scaling.yarn_beta_slow", 1.0);
  rs.truncate = !gpt_oss;
  rs.attention_factor = rs.factor <= 1 ? 1.0f : (float)(0.1 * std::log((double)rs.factor) + 1.0);
  for (const char* key : {"rope.scaling.yarn_ext_factor", "rope.scaling.yarn_attn_factor",
                          "rope.scaling.yarn_log_multiplier", "rope.scaling.attn_factor"})
    if (L.r.find(a + key)) fail("{}: yarn with {}{} is not supported", path, a, key);
}

}  // namespace

std::unique_ptr<ModelData> load_gguf_model(const std::string& path) {
  auto m = std::make_unique<ModelData>();
  m->path = path;
  m->format = "gguf";
  m->gguf = std::make_shared<gguf::Reader>(gguf::Reader::open(path));
  const gguf::Reader& r = *m->gguf;
  GgufLoader L{*m, r, {}};

  const std::string arch = r.get_string("general.architecture");
  HParams& hp = m->hp;
  if (arch == "llama") {
    hp.arch = Arch::Llama;
    hp.rope_interleaved = true;
  } else if (arch == "qwen2") {
    hp.arch = Arch::Qwen2;
    hp.qkv_bias = true;
  } else if (arch == "qwen3") {
    hp.arch = Arch::Qwen3;
    hp.qk_norm = true;
  } else if (arch == "gemma2" || arch == "gemma3") {
    hp.arch = arch == "gemma2" ? Arch::Gemma2 : Arch::Gemma3;
    hp.qk_norm = hp.arch == Arch::Gemma3;
    hp.post_norms = true;
    hp.gelu = true;
  } else if (arch == "qwen2moe") {
    hp.arch = Arch::Qwen2;
    hp.qkv_bias = true;
  } else if (arch == "qwen3moe") {
    hp.arch = Arch::Qwen3;
    hp.qk_norm = true;
  } else if (arch == "phi3") {
    hp.arch = Arch::Phi3;
  } else if (arch == "gpt-oss") {
    // llama.cpp's LLM_ARCH_OPENAI_MOE: biases on q, k, v, o, the router and the experts; attention sinks;
    // the clamped SwiGLU with limit 7 (a constant there, as in transformers' GptOssExperts)
    hp.arch = Arch::GptOss;
    hp.qkv_bias = hp.o_bias = hp.attn_sinks = true;
    hp.expert_topk_softmax = hp.expert_bias = true;
    hp.swiglu_limit = 7.0f;
  } else {
    fail(
        "{}: unsupported architecture '{}' (supported: llama, qwen2, qwen3, qwen2moe, qwen3moe, gemma2, "
        "gemma3, phi3, gpt-oss)",
        path, arch);
  }
  const bool gemma = hp.arch == Arch::Gemma2 || hp.arch == Arch::Gemma3;
  const bool gpt_oss = hp.arch == Arch::GptOss;
  const std::string a = arch + ".";
  hp.dim = L.key_int(a + "embedding_length");
  hp.n_layers = L.key_int(a + "block_count");
  hp.ffn_dim = L.key_int(a + "feed_forward_length");
  hp.n_heads = L.key_int(a + "attention.head_count");
  hp.n_kv_heads = L.key_int(a + "attention.head_count_kv", hp.n_heads);
  hp.head_dim = L.key_int(a + "attention.key_length", hp.n_heads > 0 ? hp.dim / hp.n_heads : 0);
  if (const int v_dim = L.key_int(a + "attention.value_length", hp.head_dim); v_dim != hp.head_dim)
    fail("{}: {}attention.value_length {} differs from the key head dim {}; only equal sizes are supported",
         path, a, v_dim, hp.head_dim);
  const int n_rot = L.key_int(a + "rope.dimension_count", hp.head_dim);
  if (n_rot != hp.head_dim)
    fail("{}: partial rotary embeddings (n_rot {} != head dim {}) are not supported", path, n_rot,
         hp.head_dim);
  hp.train_ctx = L.key_int(a + "context_length", 2048);
  hp.sliding_window = L.key_int(a + "attention.sliding_window", 0);
  hp.rms_eps = L.key_float(a + "attention.layer_norm_rms_epsilon", 1e-5);
  hp.rope_theta = L.key_float(a + "rope.freq_base", 10000.0);
  if (auto st = r.get_string_opt(a + "rope.scaling.type"); st && *st != "none") {
    if (*st != "linear" && *st != "yarn")
      fail("{}: unsupported rope scaling type '{}' (supported: none, linear, yarn)", path, *st);
    hp.rope_scaling.type = *st;
    hp.rope_scaling.factor = L.key_float(a + "rope.scaling.factor", 1.0);
    if (*st == "yarn") read_yarn_keys(L, a, gpt_oss, hp.rope_scaling);
  }
  if (gemma) {
    // llama.cpp's gemma keys; attention.scale (query_pre_attn_scalar^-0.5) is ours: llama.cpp derives it from
    // the model size.
    hp.embed_scale = (float)std::sqrt((double)hp.dim);
    hp.attn_scale = L.key_float(a + "attention.scale", 0.0);
    hp.attn_softcap = L.key_float(a + "attn_logit_softcapping", 0.0);
    hp.final_softcap = L.key_float(a + "final_logit_softcapping", 0.0);
  }
  // Mistral (arch llama) and Phi-3: attention.sliding_window alone windows every layer (as HF does;
  // llama.cpp's llama and phi3 graphs ignore the key). Qwen2/3 window only the layers the pattern marks.
  if (gemma || gpt_oss || hp.arch == Arch::Qwen2 || hp.arch == Arch::Qwen3) {
    // Per-layer sliding windows: attention.sliding_window_pattern as a list of bools, or a period n (layer il
    // is sliding unless (il + 1) % n == 0; llama.cpp's defaults: 2 for gemma2 and gpt-oss, 6 for gemma3).
    std::vector<uint8_t> swa(hp.n_layers, 0);
    const std::string key = a + "attention.sliding_window_pattern";
    if (const gguf::Value* v = r.find(key); v && v->type == gguf::ValueType::ARRAY) {
      if (v->arr->size() != (size_t)hp.n_layers)
        fail("{}: {} has {} entries for {} layers", path, key, v->arr->size(), hp.n_layers);
      for (int il = 0; il < hp.n_layers; ++il) swa[il] = v->arr->uint_at(il) != 0;
    } else if (gemma || gpt_oss) {
      const int n = L.key_int(key, hp.arch == Arch::Gemma3 ? 6 : 2);
      for (int il = 0; il < hp.n_layers; ++il) swa[il] = n > 0 && (il + 1) % n != 0;
    }
    if (hp.sliding_window > 0 && std::find(swa.begin(), swa.end(), 1) != swa.end())
      hp.swa_layers = swa;
    else
      hp.sliding_window = 0;
    if (hp.arch == Arch::Gemma3 && !hp.swa_layers.empty())
      hp.rope_theta_swa = L.key_float(a + "rope.freq_base_swa", 10000.0);
  }
  if (hp.arch == Arch::Phi3) {
    hp.rope_scaling.original_max_position_embeddings =
        L.key_int(a + "rope.scaling.original_context_length", 0);
    hp.rope_scaling.attention_factor = L.key_float(a + "rope.scaling.attn_factor", 1.0);
  }

  const std::string embd_name = gguf_name(TensorRole::TokEmbd), output_name = gguf_name(TensorRole::Output);
  const auto& embd = L.get(embd_name);
  if (embd.ne.size() != 2) fail("{}: tensor '{}' must have 2 dims", path, embd_name);
  if (embd.ne[1] > (1u << 22)) fail("{}: vocabulary of {} tokens is too large", path, embd.ne[1]);
  hp.n_vocab = (int)embd.ne[1];
  if (auto v = r.get_uint_opt(a + "vocab_size"); v && *v != (uint64_t)hp.n_vocab)
    fail("{}: {}vocab_size = {} but token_embd has {} rows", path, a, *v, hp.n_vocab);
  hp.bos_id = L.token_id("tokenizer.ggml.bos_token_id", hp.n_vocab);
  for (const char* key :
       {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    const int32_t id = L.token_id(key, hp.n_vocab);
    if (id >= 0 && std::find(hp.eos_ids.begin(), hp.eos_ids.end(), id) == hp.eos_ids.end())
      hp.eos_ids.push_back(id);
  }
  hp.eos_id = hp.eos_ids.empty() ? -1 : hp.eos_ids[0];
  hp.tie_embeddings = r.find_tensor(output_name) == nullptr;
  read_expert_keys(L, arch, hp);
  hp.validate(path);

  m->tok_embd = L.matrix(embd_name, hp.n_vocab, hp.dim);
  m->output_norm = L.vec(gguf_name(TensorRole::OutputNorm), hp.dim);
  m->output = hp.tie_embeddings ? m->tok_embd : L.matrix(output_name, hp.n_vocab, hp.dim);
  load_layer_tensors(*m, L, TensorFormat::Gguf);
  // Phi-3 LongRoPE: per-pair frequency divisors rope_factors_short/long (llama.cpp's tensors).
  const float* f_short = L.optional_vec(TensorRole::RopeFactorsShort, hp);
  const float* f_long = L.optional_vec(TensorRole::RopeFactorsLong, hp);
  if ((f_short != nullptr) != (f_long != nullptr))
    fail("{}: rope_factors_short and rope_factors_long must come together", path);
  if (f_short) {
    if (hp.rope_scaling.original_max_position_embeddings <= 0)
      fail("{}: longrope factors need {}rope.scaling.original_context_length", path, a);
    hp.rope_scaling.type = "longrope";
    hp.rope_scaling.short_factor.assign(f_short, f_short + hp.head_dim / 2);
    hp.rope_scaling.long_factor.assign(f_long, f_long + hp.head_dim / 2);
    hp.validate(path);
  }
  set_rope_tables(*m);
  // Llama-3 rope scaling travels as per-pair divisors of the frequency (llama.cpp's rope_freqs tensor).
  if (const float* f = L.optional_vec(TensorRole::RopeFreqs, hp)) {
    for (int i = 0; i < hp.head_dim / 2; ++i) {
      if (!(f[i] > 0)) fail("{}: rope_freqs[{}] = {} must be positive", path, i, f[i]);
      m->rope_inv_freq[i] /= f[i];
    }
  }
  L.check_all_used(fmt::format("{}block_count = {}, arch {}", a, hp.n_layers, arch));
  return m;
}

}  // namespace ultra
