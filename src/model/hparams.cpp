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
  } else if (rope_scaling.type != "default") {
    fail("{}: unsupported rope scaling type '{}' (supported: default, llama3)", source, rope_scaling.type);
  }
}

std::vector<float> HParams::rope_inv_freq() const {
  const int half = head_dim / 2;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    // HF: 1 / base ** (arange(0, dim, 2).float() / dim), in float32
    const float e = (float)(2 * i) / (float)head_dim;
    inv[i] = 1.0f / std::pow(rope_theta, e);
  }
  if (rope_scaling.type == "llama3") {
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
  if (!it->is_number()) fail("{}: '{}' must be a number, got {}", path, key, it->dump());
  const double v = it->get<double>();
  if (!std::isfinite(v) || std::fabs(v) > std::numeric_limits<float>::max())
    fail("{}: '{}' = {} is not a finite float", path, key, it->dump());
  return (float)v;
}

// true/false, or the fallback when absent or null; anything else is an error (a string "true" is not a
// bool).
bool get_bool(const json& j, const char* key, const std::string& path, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) fail("{}: '{}' must be true or false, got {}", path, key, it->dump());
  return it->get<bool>();
}

// A token id, or a list of them (HF allows "eos_token_id": [a, b]); appended to ids. Range checks against the
// vocabulary are HParams::validate's.
void get_ids(const json& j, const char* key, const std::string& path, std::vector<int32_t>& ids) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  auto one = [&](const json& v) {
    if (!v.is_number_integer())
      fail("{}: '{}' must be a token id or a list of token ids, got {}", path, key, it->dump());
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id > INT32_MAX) fail("{}: '{}' holds {}, not a valid token id", path, key, v.dump());
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
  }
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
  else
    fail(
        "{}: unsupported architecture '{}' (supported: LlamaForCausalLM, MistralForCausalLM, "
        "Qwen2ForCausalLM)",
        path, archs.empty() ? std::string("<none>") : archs);

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
  // Qwen2 configs carry a sliding_window that applies only with use_sliding_window: true.
  if (hp.arch != Arch::Qwen2 || get_bool(j, "use_sliding_window", path, false))
    hp.sliding_window = get_int(j, "sliding_window", path, 0, false);
  // Llama, Mistral and Qwen2 configs default to untied embeddings.
  hp.tie_embeddings = get_bool(j, "tie_word_embeddings", path, false);
  hp.qkv_bias = hp.arch == Arch::Qwen2 || get_bool(j, "attention_bias", path, false);
  if (get_bool(j, "mlp_bias", path, false)) fail("{}: mlp_bias = true is not supported", path);
  // A value head size other than the key head size (DeepSeek-style v_head_dim) is not supported.
  if (const int v_dim = get_int(j, "v_head_dim", path, -1, false); v_dim >= 0 && v_dim != hp.head_dim)
    fail("{}: v_head_dim {} differs from the key head dim {}; only equal sizes are supported", path, v_dim,
         hp.head_dim);
  // transformers 4: rope_scaling at the top level; transformers 5: rope_parameters (with rope_theta inside)
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null())
    parse_rope(j["rope_parameters"], hp, path);
  else if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    parse_rope(j["rope_scaling"], hp, path);
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
