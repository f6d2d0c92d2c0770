#include "model/hparams.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file.h"
#include "core/json.h"

namespace ultra {

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::Llama:
      return "llama";
    case Arch::Mistral:
      return "mistral";
    case Arch::Qwen2:
      return "qwen2";
    case Arch::Qwen3:
      return "qwen3";
    case Arch::Gemma2:
      return "gemma2";
    case Arch::Gemma3:
      return "gemma3";
    case Arch::Phi3:
      return "phi3";
    case Arch::GptOss:
      return "gpt-oss";
  }
  return "?";
}

void HParams::validate(const std::string& source) const {
  auto check = [&](bool ok, const char* what, long long v) {
    if (!ok) fail("{}: invalid hyper-parameter {} = {}", source, what, v);
  };
  constexpr long long kMax = 1 << 24;
  check(n_vocab > 0 && n_vocab < (1 << 22), "vocab size", n_vocab);
  check(dim > 0 && dim < kMax, "hidden size", dim);
  check(n_layers > 0 && n_layers <= 1024, "layer count", n_layers);
  check(n_heads > 0 && n_heads <= 1024, "head count", n_heads);
  check(n_kv_heads > 0 && n_kv_heads <= n_heads && n_heads % n_kv_heads == 0, "kv head count", n_kv_heads);
  check(head_dim > 0 && head_dim % 2 == 0 && head_dim <= 1024, "head dim", head_dim);
  check(ffn_dim > 0 && ffn_dim < kMax, "ffn size", ffn_dim);
  check(train_ctx > 0, "context length", train_ctx);
  if (bos_id < -1 || bos_id >= n_vocab)
    fail("{}: bos token id {} is outside the vocabulary of {} tokens", source, bos_id, n_vocab);
  for (int32_t id : eos_ids) {
    if (id < 0 || id >= n_vocab)
      fail("{}: eos token id {} is outside the vocabulary of {} tokens", source, id, n_vocab);
  }
  if (eos_id != (eos_ids.empty() ? -1 : eos_ids[0]))
    fail("{}: eos id {} is not the first of the eos ids", source, eos_id);
  if (!(rms_eps > 0 && rms_eps < 1))
    fail("{}: invalid rms norm eps {} (expected 0 < eps < 1)", source, rms_eps);
  if (!(rope_theta > 0 && std::isfinite(rope_theta)))
    fail("{}: invalid rope theta {} (expected a finite base > 0)", source, rope_theta);
  if (rope_scaling.type == "llama3") {
    if (!(rope_scaling.factor > 0 && rope_scaling.high_freq_factor > rope_scaling.low_freq_factor &&
          rope_scaling.low_freq_factor > 0 && rope_scaling.original_max_position_embeddings > 0 &&
          std::isfinite(rope_scaling.factor) && std::isfinite(rope_scaling.high_freq_factor)))
      fail("{}: invalid llama3 rope_scaling parameters", source);
  } else if (rope_scaling.type == "linear") {
    if (!(rope_scaling.factor > 0 && std::isfinite(rope_scaling.factor)))
      fail("{}: invalid linear rope_scaling factor {}", source, rope_scaling.factor);
  } else if (rope_scaling.type == "longrope") {
    const size_t half = (size_t)head_dim / 2;
    if (rope_scaling.short_factor.size() != half || rope_scaling.long_factor.size() != half)
      fail("{}: longrope short_factor and long_factor must have head_dim/2 = {} entries (got {} and {})",
           source, half, rope_scaling.short_factor.size(), rope_scaling.long_factor.size());
    for (size_t i = 0; i < half; ++i)
      if (!(rope_scaling.short_factor[i] > 0) || !(rope_scaling.long_factor[i] > 0))
        fail("{}: longrope factors must be positive (entry {})", source, i);
    if (!(rope_scaling.attention_factor > 0) || rope_scaling.original_max_position_embeddings <= 0)
      fail("{}: invalid longrope attention factor or original_max_position_embeddings", source);
  } else if (rope_scaling.type == "yarn") {
    const RopeScaling& r = rope_scaling;
    if (!(r.factor > 0 && std::isfinite(r.factor) && r.attention_factor > 0 &&
          std::isfinite(r.attention_factor) && r.beta_fast > 0 && std::isfinite(r.beta_fast) &&
          r.beta_slow > 0 && std::isfinite(r.beta_slow) && r.original_max_position_embeddings > 0))
      fail(
          "{}: invalid yarn rope_scaling parameters (factor {}, attention factor {}, beta {} / {}, original "
          "context {})",
          source, r.factor, r.attention_factor, r.beta_fast, r.beta_slow, r.original_max_position_embeddings);
  } else if (rope_scaling.type != "default") {
    fail("{}: unsupported rope scaling type '{}' (supported: default, llama3, linear, longrope, yarn)",
         source, rope_scaling.type);
  }
  if (!swa_layers.empty() && ((int)swa_layers.size() != n_layers || sliding_window <= 0))
    fail("{}: {} per-layer sliding-window flags for {} layers, window {}", source, swa_layers.size(),
         n_layers, sliding_window);
  if (!(swiglu_limit >= 0 && std::isfinite(swiglu_limit)))
    fail("{}: invalid swiglu limit {}", source, swiglu_limit);
  if (!(rope_theta_swa >= 0 && std::isfinite(rope_theta_swa)))
    fail("{}: invalid sliding-layer rope theta {}", source, rope_theta_swa);
  for (float v : {attn_scale, attn_softcap, final_softcap, embed_scale})
    if (!(v >= 0 && std::isfinite(v)))
      fail("{}: invalid attention scale, soft-cap or embedding scale {}", source, v);
  validate_experts(source);
}

void HParams::validate_experts(const std::string& source) const {
  constexpr int kMaxExperts = 512;  // llama.cpp's LLAMA_MAX_EXPERTS
  if (n_expert < 0 || n_expert > kMaxExperts)
    fail("{}: expert count {} is out of range (0: dense, at most {})", source, n_expert, kMaxExperts);
  if (n_expert == 0) {
    if (n_expert_used != 0 || shexp_ffn_dim != 0)
      fail("{}: expert_used_count {} (or a shared expert) without experts (expert_count 0)", source,
           n_expert_used);
    return;
  }
  if (n_expert_used < 1 || n_expert_used > n_expert)
    fail("{}: expert_used_count {} must be between 1 and expert_count {}", source, n_expert_used, n_expert);
  if (expert_ffn_dim <= 0 || expert_ffn_dim >= (1 << 24))
    fail("{}: invalid expert feed-forward size {}", source, expert_ffn_dim);
  if (shexp_ffn_dim < 0 || shexp_ffn_dim >= (1 << 24))
    fail("{}: invalid shared-expert feed-forward size {}", source, shexp_ffn_dim);
}

std::vector<float> HParams::rope_inv_freq(bool swa, bool long_rope) const {
  const int half = head_dim / 2;
  std::vector<float> inv(half);
  const float base = swa && rope_theta_swa > 0 ? rope_theta_swa : rope_theta;
  for (int i = 0; i < half; ++i) {
    // HF: 1 / base ** (arange(0, dim, 2).float() / dim), in float32
    const float e = (float)(2 * i) / (float)head_dim;
    inv[i] = 1.0f / std::pow(base, e);
  }
  if (swa && rope_theta_swa > 0) return inv;  // Gemma 3's sliding layers: default RoPE
  if (rope_scaling.type == "linear") {
    for (float& f : inv) f /= rope_scaling.factor;
  } else if (rope_scaling.type == "yarn") {
    // HF _compute_yarn_parameters, in float32 where it computes in float32 (the correction range in double)
    const RopeScaling& r = rope_scaling;
    const double pi = 3.14159265358979323846, dim = head_dim;
    auto corr_dim = [&](double rotations) {
      return dim * std::log(r.original_max_position_embeddings / (rotations * 2 * pi)) / (2 * std::log(base));
    };
    double low = corr_dim(r.beta_fast), high = corr_dim(r.beta_slow);
    if (r.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1);
    if (low == high) high += 0.001;  // HF: prevents a division by zero
    for (int i = 0; i < half; ++i) {
      const float ramp = std::clamp(((float)i - (float)low) / (float)(high - low), 0.0f, 1.0f);
      const float extrap = 1.0f - ramp;  // the share of the unscaled frequency
      const float pos_freq = std::pow(base, (float)(2 * i) / (float)head_dim);
      inv[i] = 1.0f / (r.factor * pos_freq) * (1.0f - extrap) + 1.0f / pos_freq * extrap;
    }
  } else if (rope_scaling.type == "longrope") {
    // HF: 1 / (ext_factors * base ** (arange(0, dim, 2) / dim))
    const auto& ext = long_rope ? rope_scaling.long_factor : rope_scaling.short_factor;
    for (int i = 0; i < half; ++i)
      inv[i] = 1.0f / (ext[i] * std::pow(base, (float)(2 * i) / (float)head_dim));
  } else if (rope_scaling.type == "llama3") {
    const double pi = 3.14159265358979323846;
    const float factor = rope_scaling.factor, lo = rope_scaling.low_freq_factor,
                hi = rope_scaling.high_freq_factor;
    const float old_ctx = (float)rope_scaling.original_max_position_embeddings;
    const float low_wavelen = old_ctx / lo, high_wavelen = old_ctx / hi;
    for (int i = 0; i < half; ++i) {
      const float wavelen = (float)(2 * pi) / inv[i];
      float f = wavelen > low_wavelen ? inv[i] / factor : inv[i];
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      if (medium) {
        const float smooth = (old_ctx / wavelen - lo) / (hi - lo);
        f = (1 - smooth) * f / factor + smooth * f;
      }
      inv[i] = f;
    }
  }
  return inv;
}

namespace {

using nlohmann::json;

int get_int(const json& j, const char* key, const std::string& path, int fallback = -1,
            bool required = true) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) fail("{}: missing '{}'", path, key);
    return fallback;
  }
  if (!it->is_number_integer()) fail("{}: '{}' must be an integer", path, key);
  const auto v = it->get<int64_t>();
  if (v < 0 || v > (int64_t)1 << 30) fail("{}: '{}' = {} is out of range", path, key, v);
  return (int)v;
}

// A float hyper-parameter: a JSON number that is finite and representable as a float (converting a larger
// double to float is undefined behaviour). Range checks of the value itself are HParams::validate's.
float get_num(const json& j, const char* key, const std::string& path, double fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return (float)fallback;
  if (!it->is_number()) fail("{}: '{}' must be a number, got {}", path, key, dump_json(*it));
  const double v = it->get<double>();
  if (!std::isfinite(v) || std::fabs(v) > std::numeric_limits<float>::max())
    fail("{}: '{}' = {} is not a finite float", path, key, dump_json(*it));
  return (float)v;
}

// true/false, or the fallback when absent or null; anything else is an error (a string "true" is not a
// bool).
bool get_bool(const json& j, const char* key, const std::string& path, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) fail("{}: '{}' must be true or false, got {}", path, key, dump_json(*it));
  return it->get<bool>();
}

// A token id, or a list of them (HF allows "eos_token_id": [a, b]); appended to ids. Range checks against the
// vocabulary are HParams::validate's.
void get_ids(const json& j, const char* key, const std::string& path, std::vector<int32_t>& ids) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  auto one = [&](const json& v) {
    if (!v.is_number_integer())
      fail("{}: '{}' must be a token id or a list of token ids, got {}", path, key, dump_json(*it));
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id > INT32_MAX) fail("{}: '{}' holds {}, not a valid token id", path, key, dump_json(v));
    if (std::find(ids.begin(), ids.end(), (int32_t)id) == ids.end()) ids.push_back((int32_t)id);
  };
  if (it->is_array()) {
    for (const json& v : *it) one(v);
  } else {
    one(*it);
  }
}

void parse_rope(const json& r, HParams& hp, const std::string& path) {
  if (!r.is_object()) fail("{}: rope parameters must be an object", path);
  std::string type = "default";
  if (r.contains("rope_type") && r["rope_type"].is_string())
    type = r["rope_type"].get<std::string>();
  else if (r.contains("type") && r["type"].is_string())
    type = r["type"].get<std::string>();
  hp.rope_scaling.type = type;
  if (r.contains("rope_theta")) hp.rope_theta = get_num(r, "rope_theta", path, hp.rope_theta);
  if (type == "llama3") {
    hp.rope_scaling.factor = get_num(r, "factor", path, 8.0);
    hp.rope_scaling.low_freq_factor = get_num(r, "low_freq_factor", path, 1.0);
    hp.rope_scaling.high_freq_factor = get_num(r, "high_freq_factor", path, 4.0);
    hp.rope_scaling.original_max_position_embeddings =
        get_int(r, "original_max_position_embeddings", path, 8192, false);
  } else if (type == "linear") {
    hp.rope_scaling.factor = get_num(r, "factor", path, 1.0);
  } else if (type == "longrope") {
    auto factors = [&](const char* key) {
      auto it = r.find(key);
      if (it == r.end() || !it->is_array()) fail("{}: longrope needs a list '{}'", path, key);
      std::vector<float> f;
      for (const json& v : *it) {
        if (!v.is_number()) fail("{}: '{}' must hold numbers", path, key);
        f.push_back((float)v.get<double>());
      }
      return f;
    };
    hp.rope_scaling.short_factor = factors("short_factor");
    hp.rope_scaling.long_factor = factors("long_factor");
    if (r.contains("original_max_position_embeddings"))
      hp.rope_scaling.original_max_position_embeddings =
          get_int(r, "original_max_position_embeddings", path, 0, false);
    hp.rope_scaling.attention_factor = get_num(r, "attention_factor", path, 0.0);  // 0: from the lengths
    if (r.contains("partial_rotary_factor") && get_num(r, "partial_rotary_factor", path, 1.0) != 1.0f)
      fail("{}: partial_rotary_factor other than 1 is not supported", path);
  } else if (type == "yarn") {
    RopeScaling& rs = hp.rope_scaling;
    if (!r.contains("factor")) fail("{}: yarn rope scaling needs a 'factor'", path);
    rs.factor = get_num(r, "factor", path, 1.0);
    rs.beta_fast = get_num(r, "beta_fast", path, 32.0);
    rs.beta_slow = get_num(r, "beta_slow", path, 1.0);
    rs.truncate = get_bool(r, "truncate", path, true);
    // 0: max_position_embeddings (parse_hf_config_json fills it in); attention factor 0: from the factor
    rs.original_max_position_embeddings = get_int(r, "original_max_position_embeddings", path, 0, false);
    rs.attention_factor = get_num(r, "attention_factor", path, 0.0);
    for (const char* key : {"mscale", "mscale_all_dim"})
      if (r.contains(key) && !r[key].is_null())
        fail("{}: yarn with '{}' (DeepSeek's attention scaling) is not supported", path, key);
  }
}

// Gemma 3 (transformers 5): rope_parameters = {"full_attention": {...}, "sliding_attention": {...}}; the
// sliding layers must use default RoPE.
void parse_rope_per_type(const json& r, HParams& hp, const std::string& path) {
  for (const auto& [key, v] : r.items())
    if (key != "full_attention" && key != "sliding_attention")
      fail("{}: rope_parameters for unknown layer type '{}'", path, key);
  if (r.contains("full_attention")) parse_rope(r["full_attention"], hp, path);
  if (r.contains("sliding_attention")) {
    HParams local;
    parse_rope(r["sliding_attention"], local, path);
    if (local.rope_scaling.type != "default")
      fail("{}: rope type '{}' on sliding layers is not supported (only default)", path,
           local.rope_scaling.type);
    hp.rope_theta_swa = local.rope_theta;
  }
}

// The experts of an HF MoE config, as transformers' modules use them: Mixtral (num_local_experts of
// intermediate_size, top-k weights always renormalised), Qwen2-MoE / Qwen3-MoE (num_experts, or Qwen3's
// num_local_experts, of
// moe_intermediate_size, renormalised when norm_topk_prob; Qwen2-MoE's shared expert of
// shared_expert_intermediate_size). Every layer must be sparse (decoder_sparse_step 1, no mlp_only_layers).
void read_hf_experts(const json& j, const std::string& path, bool mixtral, bool qwen2, HParams& hp) {
  // Qwen3-MoE configs saved by transformers 5 name the count num_local_experts (Mixtral's key); the Hub's
  // Qwen2/3-MoE configs, num_experts.
  hp.n_expert = get_int(
      j, mixtral || (!qwen2 && !j.contains("num_experts")) ? "num_local_experts" : "num_experts", path);
  hp.n_expert_used = get_int(j, "num_experts_per_tok", path);
  hp.expert_ffn_dim =
      mixtral ? get_int(j, "intermediate_size", path) : get_int(j, "moe_intermediate_size", path);
  hp.expert_norm = mixtral || get_bool(j, "norm_topk_prob", path, false);
  if (qwen2) hp.shexp_ffn_dim = get_int(j, "shared_expert_intermediate_size", path);
  if (mixtral) return;
  if (const int step = get_int(j, "decoder_sparse_step", path, 1, false); step != 1)
    fail("{}: decoder_sparse_step = {}: only models whose every layer has experts are supported", path, step);
  if (auto it = j.find("mlp_only_layers");
      it != j.end() && !it->is_null() && !(it->is_array() && it->empty()))
    fail("{}: mlp_only_layers {}: only models whose every layer has experts are supported", path,
         dump_json(*it));
}

// gpt-oss (transformers' GptOssConfig / modeling_gpt_oss.py): num_local_experts experts of intermediate_size,
// num_experts_per_tok of them per token, weighed by the softmax of their router logits (bias included) over
// those k; biases on the router and on every expert matrix; the clamped SwiGLU with swiglu_limit; attention
// sinks per head.
void read_gpt_oss(const json& j, const std::string& path, HParams& hp) {
  hp.n_expert = get_int(j, "num_local_experts", path);
  hp.n_expert_used = get_int(j, "num_experts_per_tok", path);
  hp.expert_ffn_dim = get_int(j, "intermediate_size", path);
  hp.expert_norm = false;
  hp.expert_topk_softmax = true;
  hp.expert_bias = true;
  hp.swiglu_limit = get_num(j, "swiglu_limit", path, 7.0);
  if (!(hp.swiglu_limit > 0)) fail("{}: swiglu_limit must be positive, got {}", path, hp.swiglu_limit);
  hp.attn_sinks = true;
}

}  // namespace

HParams parse_hf_config(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string text = read_file(path, "config file");
  const fs::path gen = fs::path(path).parent_path() / "generation_config.json";
  std::error_code ec;
  if (!fs::exists(gen, ec)) return parse_hf_config_json(text, path);
  return parse_hf_config_json(text, path, read_file(gen.string(), "generation config"), gen.string());
}

HParams parse_hf_config_json(std::string_view text, const std::string& path,
                             std::string_view generation_config, const std::string& generation_path) {
  const json j = parse_json(text, path);
  if (!j.is_object()) fail("{}: expected a JSON object", path);
  json gen = json::object();
  if (!generation_config.empty()) {
    gen = parse_json(generation_config, generation_path);
    if (!gen.is_object()) fail("{}: expected a JSON object", generation_path);
  }

  HParams hp;
  std::string archs;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    archs = j["architectures"][0].get<std::string>();
  if (archs == "LlamaForCausalLM")
    hp.arch = Arch::Llama;
  else if (archs == "MistralForCausalLM")
    hp.arch = Arch::Mistral;
  else if (archs == "Qwen2ForCausalLM")
    hp.arch = Arch::Qwen2;
  else if (archs == "Qwen3ForCausalLM")
    hp.arch = Arch::Qwen3;
  else if (archs == "Gemma2ForCausalLM")
    hp.arch = Arch::Gemma2;
  else if (archs == "Gemma3ForCausalLM")
    hp.arch = Arch::Gemma3;
  else if (archs == "Phi3ForCausalLM")
    hp.arch = Arch::Phi3;
  else if (archs == "MixtralForCausalLM")
    hp.arch = Arch::Mistral;
  else if (archs == "Qwen2MoeForCausalLM")
    hp.arch = Arch::Qwen2;
  else if (archs == "Qwen3MoeForCausalLM")
    hp.arch = Arch::Qwen3;
  else if (archs == "GptOssForCausalLM")
    hp.arch = Arch::GptOss;
  else
    fail(
        "{}: unsupported architecture '{}' (supported: LlamaForCausalLM, MistralForCausalLM, "
        "Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM (text only), "
        "Phi3ForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, GptOssForCausalLM)",
        path, archs.empty() ? std::string("<none>") : archs);
  if (archs == "MixtralForCausalLM" || archs == "Qwen2MoeForCausalLM" || archs == "Qwen3MoeForCausalLM")
    read_hf_experts(j, path, archs == "MixtralForCausalLM", archs == "Qwen2MoeForCausalLM", hp);
  const bool gemma = hp.arch == Arch::Gemma2 || hp.arch == Arch::Gemma3;
  const bool gpt_oss = hp.arch == Arch::GptOss;
  if (gpt_oss) read_gpt_oss(j, path, hp);

  hp.n_vocab = get_int(j, "vocab_size", path);
  hp.dim = get_int(j, "hidden_size", path);
  hp.n_layers = get_int(j, "num_hidden_layers", path);
  hp.n_heads = get_int(j, "num_attention_heads", path);
  hp.n_kv_heads = get_int(j, "num_key_value_heads", path, hp.n_heads, false);
  hp.ffn_dim = get_int(j, "intermediate_size", path);
  hp.head_dim = get_int(j, "head_dim", path, hp.n_heads > 0 ? hp.dim / hp.n_heads : 0, false);
  hp.rms_eps = get_num(j, "rms_norm_eps", path, 1e-6);
  hp.rope_theta = get_num(j, "rope_theta", path, 10000.0);
  hp.train_ctx = get_int(j, "max_position_embeddings", path, 2048, false);
  // Qwen2/3 configs carry a sliding_window that applies only with use_sliding_window: true; Llama's attention
  // ignores one (transformers' LlamaModel builds a plain causal mask).
  const bool qwen = hp.arch == Arch::Qwen2 || hp.arch == Arch::Qwen3;
  if (hp.arch != Arch::Llama && (!qwen || get_bool(j, "use_sliding_window", path, false)))
    hp.sliding_window = get_int(j, "sliding_window", path, 0, false);
  // Llama, Mistral, Qwen and Phi-3 configs default to untied embeddings, Gemma's to tied ones.
  hp.tie_embeddings = get_bool(j, "tie_word_embeddings", path, gemma);
  hp.qkv_bias = hp.arch == Arch::Qwen2 || get_bool(j, "attention_bias", path, false);
  hp.o_bias = gpt_oss && hp.qkv_bias;  // gpt-oss: attention_bias puts a bias on all four projections
  if (hp.qkv_bias && hp.arch != Arch::Qwen2 && !gpt_oss)
    fail("{}: attention_bias = true is not supported for {}", path, arch_name(hp.arch));
  hp.qk_norm = hp.arch == Arch::Qwen3 || hp.arch == Arch::Gemma3;
  if (hp.arch == Arch::Phi3) {
    if (get_num(j, "partial_rotary_factor", path, 1.0) != 1.0f)
      fail("{}: partial_rotary_factor other than 1 is not supported", path);
  }
  if (gemma) {
    hp.embed_scale = (float)std::sqrt((double)hp.dim);
    hp.post_norms = true;
    hp.gelu = true;
    std::string act = "gelu_pytorch_tanh";
    for (const char* key : {"hidden_activation", "hidden_act"})
      if (j.contains(key) && j[key].is_string()) {
        act = j[key].get<std::string>();
        break;
      }
    if (act != "gelu_pytorch_tanh")
      fail("{}: hidden activation '{}' is not supported for {} (only gelu_pytorch_tanh)", path, act,
           arch_name(hp.arch));
    hp.attn_scale = 1.0f / std::sqrt(get_num(j, "query_pre_attn_scalar", path, hp.head_dim));
    hp.attn_softcap = get_num(j, "attn_logit_softcapping", path, 0.0);
    hp.final_softcap = get_num(j, "final_logit_softcapping", path, 0.0);
    if (get_bool(j, "use_bidirectional_attention", path, false))
      fail("{}: use_bidirectional_attention = true is not supported", path);
  } else {
    const char* act_key = j.contains("hidden_act") ? "hidden_act" : "hidden_activation";
    if (j.contains(act_key) && j[act_key].is_string() && j[act_key].get<std::string>() != "silu")
      fail("{}: hidden activation '{}' is not supported for {} (only silu)", path,
           j[act_key].get<std::string>(), arch_name(hp.arch));
  }
  // Per-layer attention types (Gemma 2/3, Qwen2/3): config.json's layer_types, or the architecture's default
  // pattern (transformers 4 Gemma configs: every 2nd layer full for Gemma 2, every sliding_window_pattern-th
  // for Gemma 3; Qwen: layers from max_window_layers on slide; gpt-oss: the even layers slide). Mistral and
  // Phi-3 keep swa_layers empty: the window applies to every layer.
  if (gemma || qwen || gpt_oss) {
    std::vector<uint8_t> swa(hp.n_layers, 0);
    if (j.contains("layer_types") && j["layer_types"].is_array()) {
      const json& lt = j["layer_types"];
      if ((int)lt.size() != hp.n_layers)
        fail("{}: layer_types has {} entries for {} layers", path, lt.size(), hp.n_layers);
      for (int il = 0; il < hp.n_layers; ++il) {
        const std::string t = lt[il].is_string() ? lt[il].get<std::string>() : dump_json(lt[il]);
        if (t == "sliding_attention")
          swa[il] = 1;
        else if (t != "full_attention")
          fail("{}: layer_types[{}] = '{}' is not supported (full_attention, sliding_attention)", path, il,
               t);
      }
    } else if (gpt_oss) {
      for (int il = 0; il < hp.n_layers; ++il) swa[il] = il % 2 == 0;
    } else if (gemma) {
      const int pattern = hp.arch == Arch::Gemma2 ? 2 : get_int(j, "sliding_window_pattern", path, 6, false);
      for (int il = 0; il < hp.n_layers; ++il) swa[il] = pattern > 0 && (il + 1) % pattern != 0;
    } else if (hp.sliding_window > 0) {  // Qwen2/3 with use_sliding_window, transformers 4
      const int first = get_int(j, "max_window_layers", path, 28, false);
      for (int il = 0; il < hp.n_layers; ++il) swa[il] = il >= first;
    }
    if (std::find(swa.begin(), swa.end(), 1) != swa.end()) {
      if (hp.sliding_window <= 0) fail("{}: sliding_attention layers need a sliding_window > 0", path);
      hp.swa_layers = swa;
    } else {
      hp.sliding_window = 0;
    }
  }
  if (get_bool(j, "mlp_bias", path, false)) fail("{}: mlp_bias = true is not supported", path);
  // A value head size other than the key head size (DeepSeek-style v_head_dim) is not supported.
  if (const int v_dim = get_int(j, "v_head_dim", path, -1, false); v_dim >= 0 && v_dim != hp.head_dim)
    fail("{}: v_head_dim {} differs from the key head dim {}; only equal sizes are supported", path, v_dim,
         hp.head_dim);
  // transformers 4: rope_scaling at the top level; transformers 5: rope_parameters (with rope_theta inside)
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    const json& r = j["rope_parameters"];
    if (r.is_object() && (r.contains("full_attention") || r.contains("sliding_attention")))
      parse_rope_per_type(r, hp, path);
    else
      parse_rope(r, hp, path);
  } else if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    parse_rope(j["rope_scaling"], hp, path);
  }
  // Gemma 3, transformers 4: the sliding layers' base is rope_local_base_freq.
  if (hp.arch == Arch::Gemma3 && j.contains("rope_local_base_freq"))
    hp.rope_theta_swa = get_num(j, "rope_local_base_freq", path, 10000.0);
  if (hp.arch == Arch::Gemma3 && hp.rope_theta_swa == 0) hp.rope_theta_swa = 10000.0f;
  if (hp.rope_scaling.type == "yarn") {
    // HF _compute_yarn_parameters: the original context defaults to max_position_embeddings, the attention
    // factor to 0.1 ln(factor) + 1 (get_mscale)
    RopeScaling& rs = hp.rope_scaling;
    if (rs.original_max_position_embeddings <= 0) rs.original_max_position_embeddings = hp.train_ctx;
    // transformers takes the factor from max_position_embeddings / original_max_position_embeddings where the
    // config gives the latter (DeepSeek's convention), in some versions instead of 'factor': only configs on
    // which both readings agree (gpt-oss's: 131072 / 4096 = 32) are taken.
    if (std::fabs((double)hp.train_ctx / rs.original_max_position_embeddings - rs.factor) >
            1e-6 * rs.factor &&
        rs.original_max_position_embeddings != hp.train_ctx)
      fail(
          "{}: yarn factor {} differs from max_position_embeddings / original_max_position_embeddings = {} / "
          "{}; "
          "transformers versions disagree on which applies, so this config is not supported",
          path, rs.factor, hp.train_ctx, rs.original_max_position_embeddings);
    if (rs.attention_factor == 0)
      rs.attention_factor = rs.factor <= 1 ? 1.0f : (float)(0.1 * std::log((double)rs.factor) + 1.0);
  }
  if (hp.rope_scaling.type == "longrope") {
    // HF _compute_longrope_parameters: with original_max_position_embeddings in the config, the attention
    // factor comes from max_position_embeddings / original_max_position_embeddings.
    RopeScaling& rs = hp.rope_scaling;
    const int orig_top = get_int(j, "original_max_position_embeddings", path, 0, false);
    if (orig_top > 0) rs.original_max_position_embeddings = orig_top;
    if (rs.original_max_position_embeddings <= 0) rs.original_max_position_embeddings = hp.train_ctx;
    if (rs.attention_factor == 0) {
      const double factor = orig_top > 0 ? (double)hp.train_ctx / orig_top : 1.0;
      rs.attention_factor =
          factor <= 1.0 ? 1.0f
                        : (float)std::sqrt(1 + std::log(factor) /
                                                   std::log((double)rs.original_max_position_embeddings));
    }
  } else if (hp.arch == Arch::Phi3 && hp.rope_scaling.type != "default") {
    fail("{}: rope type '{}' is not supported for phi3 (default, longrope)", path, hp.rope_scaling.type);
  }
  // Special ids: config.json's first, then generation_config.json's (which transformers' generate() uses);
  // every eos id of either ends generation.
  std::vector<int32_t> bos;
  get_ids(j, "bos_token_id", path, bos);
  if (bos.size() > 1) fail("{}: 'bos_token_id' must be a single token id", path);
  if (bos.empty()) get_ids(gen, "bos_token_id", generation_path, bos);
  hp.bos_id = bos.empty() ? -1 : bos[0];
  get_ids(j, "eos_token_id", path, hp.eos_ids);
  get_ids(gen, "eos_token_id", generation_path, hp.eos_ids);
  hp.eos_id = hp.eos_ids.empty() ? -1 : hp.eos_ids[0];
  hp.rope_interleaved = false;
  hp.validate(path);
  if (hp.n_heads * hp.head_dim <= 0) fail("{}: invalid head layout", path);
  return hp;
}

}  // namespace ultra
