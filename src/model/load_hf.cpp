// HF model directory -> ModelData. Tensor names (model/tensor_names.cpp): model.embed_tokens.weight,
// model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
// mlp.{gate,up,down}_proj}, model.norm.weight, lm_head.weight (absent when tied). Mixtures of experts:
// mlp.gate and mlp.experts.E.{gate,up,down}_proj (Qwen2/3-MoE, with Qwen2-MoE's mlp.shared_expert.* and
// mlp.shared_expert_gate), block_sparse_moe.gate and block_sparse_moe.experts.E.w1/w3/w2 (Mixtral), each
// expert a view of the mapped file; gpt-oss's mlp.router (+ bias), self_attn.sinks and fused experts
// (model/gpt_oss.h, rearranged at load). Q/K are in HF's rotate-half
// layout. Qwen3/Gemma 3 add self_attn.{q,k}_norm; Gemma 2/3 add pre_feedforward_layernorm and
// post_feedforward_layernorm (post_attention_layernorm is then the attention output's norm) and store norms
// as w for x * (1 + w): loaded as 1 + w. Phi-3 fuses self_attn.qkv_proj and mlp.gate_up_proj. FP8 checkpoints
// (safetensors dtype F8_E4M3): each FP8 matrix X.weight has a scale X.weight_scale (compressed-tensors /
// llm-compressor) or X.weight_scale_inv (DeepSeek, Qwen FP8), which multiplies either way: one value (per
// tensor), [rows] or [rows, 1] (per output channel), or [ceil(rows / Br), ceil(cols / Bc)] for config.json's
// quantization_config.weight_block_size [Br, Bc] (default [128, 128]); block scales are expanded at load to
// one per row and Bc columns. X.input_scale (static activation scales) is accepted and not used: activations
// stay f32.
#include <cstring>
#include <filesystem>
#include <unordered_set>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "io/safetensors.h"
#include "model/gpt_oss.h"
#include "model/loader_util.h"
#include "model/lowbit_weights.h"
#include "model/model.h"

namespace ultra {

namespace {

struct HfLoader {
  ModelData& m;
  const safetensors::Checkpoint& ck;
  std::string dir;
  std::unordered_set<std::string> used;  // tensors the model took

  const safetensors::Tensor& get(const std::string& name) {
    const auto* t = ck.find(name);
    if (!t) fail("{}: missing tensor '{}'", dir, name);
    used.insert(name);
    if (!t->type_supported)
      fail("{}: tensor '{}' has dtype {}, supported: F32, F16, BF16 (and F8_E4M3 matrices)", t->file, name,
           t->dtype);
    return *t;
  }

  int64_t block_rows = 128, block_cols = 128;  // quantization_config.weight_block_size

  WeightView matrix(const std::string& name, int64_t rows, int64_t cols) {
    const auto& t = get(name);
    if (t.shape.size() != 2 || (int64_t)t.shape[0] != rows || (int64_t)t.shape[1] != cols)
      fail("{}: tensor '{}' has shape {}, expected [{}, {}]", t.file, name, shape_string(t.shape), rows,
           cols);
    if (t.type == GgmlType::F8_E4M3) return fp8_matrix(t, name, rows, cols);
    return m.add_matrix(t.type, t.data, rows, cols, t.n_bytes);
  }

  // An F8_E4M3 matrix with its scales (see the top of the file), as WeightView scale groups.
  WeightView fp8_matrix(const safetensors::Tensor& t, const std::string& name, int64_t rows, int64_t cols) {
    std::string sn = name + "_scale";
    const safetensors::Tensor* s = ck.find(sn);
    if (!s) s = ck.find(sn = name + "_scale_inv");
    if (!s)
      fail("{}: FP8 tensor '{}' has no scale tensor '{}_scale' or '{}_scale_inv'", dir, name, name, name);
    used.insert(sn);
    const std::string base =
        name.size() > 7 && name.ends_with(".weight") ? name.substr(0, name.size() - 7) : name;
    if (ck.find(base + ".input_scale")) used.insert(base + ".input_scale");
    uint64_t n = 1;
    for (uint64_t d : s->shape) n *= d;
    std::vector<float> sv(n);
    if (!to_f32(s->type, s->data, (int64_t)n, sv.data()))
      fail("{}: scale tensor '{}' has dtype {}, expected F32, F16 or BF16", s->file, sn, s->dtype);
    WeightView w = m.add_matrix(GgmlType::F8_E4M3, t.data, rows, cols, t.n_bytes);
    m.weight_bytes += s->n_bytes;
    const int64_t sr = (rows + block_rows - 1) / block_rows, sc = (cols + block_cols - 1) / block_cols;
    if (n == 1) {  // per tensor
      w.scale_group = cols;
      w.scale_row_stride = 0;
    } else if ((int64_t)n == rows && (s->shape.size() == 1 || (s->shape.size() == 2 && s->shape[1] == 1))) {
      w.scale_group = cols;  // per output channel
      w.scale_row_stride = 1;
    } else if (s->shape.size() == 2 && (int64_t)s->shape[0] == sr && (int64_t)s->shape[1] == sc) {
      std::vector<float> e((size_t)(rows * sc));  // block (r / Br, g) -> every row r of the block
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t g = 0; g < sc; ++g) e[(size_t)(r * sc + g)] = sv[(size_t)((r / block_rows) * sc + g)];
      sv = std::move(e);
      w.scale_group = block_cols;
      w.scale_row_stride = sc;
    } else {
      fail(
          "{}: scale tensor '{}' has shape {}; expected one value, [{}] or [{}, 1] (per channel), or [{}, "
          "{}] "
          "(blocks of {}x{}, quantization_config.weight_block_size)",
          s->file, sn, shape_string(s->shape), rows, rows, sr, sc, block_rows, block_cols);
    }
    w.scale = m.owned.emplace_back(std::move(sv)).data();
    return prepare_lowbit(m, w, fmt::format("{}: tensor '{}'", t.file, name));
  }

  bool has(const std::string& name) const { return ck.find(name) != nullptr; }

  const float* vec(const std::string& name, int64_t n, float shift = 0) {
    const auto& t = get(name);
    // [1, n] too: Qwen2-MoE's shared_expert_gate is a Linear(dim, 1).
    const bool row = t.shape.size() == 2 && t.shape[0] == 1 && (int64_t)t.shape[1] == n;
    if (!row && (t.shape.size() != 1 || (int64_t)t.shape[0] != n))
      fail("{}: tensor '{}' has shape {}, expected [{}]", t.file, name, shape_string(t.shape), n);
    const float* v = m.add_vector(t.type, t.data, n, t.n_bytes, shift);
    if (!v) fail("{}: tensor '{}': unsupported dtype {}", t.file, name, t.dtype);
    return v;
  }

  // A [rows, cols] tensor as rows * cols f32 values.
  const float* vec2(const std::string& name, int64_t rows, int64_t cols) {
    const auto& t = get(name);
    if (t.shape.size() != 2 || (int64_t)t.shape[0] != rows || (int64_t)t.shape[1] != cols)
      fail("{}: tensor '{}' has shape {}, expected [{}, {}]", t.file, name, shape_string(t.shape), rows,
           cols);
    const float* v = m.add_vector(t.type, t.data, rows * cols, t.n_bytes);
    if (!v) fail("{}: tensor '{}': unsupported dtype {}", t.file, name, t.dtype);
    return v;
  }

  // Every tensor of the checkpoint must be used: a leftover one means config.json does not describe the
  // weights (num_hidden_layers 2 on a 3-layer checkpoint would otherwise run a truncated model). Rotary
  // inverse-frequency buffers that old checkpoints saved (*.rotary_emb.inv_freq) are recomputed from the
  // config, as transformers and llama.cpp's converter do, and are not counted.
  void check_all_used(const std::string& hint) const {
    std::vector<std::string> unused;
    for (const auto& [name, t] : ck.all()) {
      const bool inv_freq =
          name.size() >= 20 && name.compare(name.size() - 20, 20, ".rotary_emb.inv_freq") == 0;
      if (!used.count(name) && !inv_freq) unused.push_back(name);
    }
    if (!unused.empty()) fail("{}: {} ({})", dir, unused_tensors_message(unused), hint);
  }
};

// With tie_word_embeddings, transformers replaces lm_head.weight by model.embed_tokens.weight after
// loading. A checkpoint that still carries lm_head.weight is accepted only when it is the same tensor
// (same dtype, shape and bytes); a different one means the config and the weights disagree.
void check_tied_lm_head(const safetensors::Tensor& head, const safetensors::Tensor& embd,
                        const std::string& dir) {
  if (head.dtype != embd.dtype || head.shape != embd.shape || head.n_bytes != embd.n_bytes ||
      std::memcmp(head.data, embd.data, head.n_bytes) != 0)
    fail(
        "{}: tie_word_embeddings is true but the checkpoint's lm_head.weight ({} {}) differs from "
        "model.embed_tokens.weight ({} {})",
        dir, head.dtype, shape_string(head.shape), embd.dtype, shape_string(embd.shape));
}

}  // namespace

std::unique_ptr<ModelData> load_hf_model(const std::string& dir) {
  namespace fs = std::filesystem;
  auto m = std::make_unique<ModelData>();
  m->path = dir;
  m->format = "safetensors";
  const std::string cfg = (fs::path(dir) / "config.json").string();
  if (!fs::exists(cfg)) fail("{}: no config.json in the model directory", dir);
  m->hp = parse_hf_config(cfg);
  m->st = std::make_shared<safetensors::Checkpoint>(safetensors::Checkpoint::open_dir(dir));
  const HParams& hp = m->hp;
  HfLoader L{*m, *m->st, dir, {}};
  {
    std::ifstream f(cfg);
    const std::string text{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
    const nlohmann::json j = parse_json_text(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("quantization_config") && j["quantization_config"].is_object()) {
      const auto& q = j["quantization_config"];
      if (q.contains("weight_block_size") && q["weight_block_size"].is_array() &&
          q["weight_block_size"].size() == 2 && q["weight_block_size"][0].is_number_unsigned() &&
          q["weight_block_size"][1].is_number_unsigned()) {
        L.block_rows = q["weight_block_size"][0].get<int64_t>();
        L.block_cols = q["weight_block_size"][1].get<int64_t>();
        if (L.block_rows < 1 || L.block_cols < 1 || L.block_rows > (1 << 20) || L.block_cols > (1 << 20))
          fail("{}: quantization_config.weight_block_size [{}, {}] is out of range", cfg, L.block_rows,
               L.block_cols);
      }
    }
  }
  const std::string embd_name = hf_name(TensorRole::TokEmbd, hp), head_name = hf_name(TensorRole::Output, hp);
  const TensorSpec& norm = tensor_spec(TensorRole::OutputNorm);
  m->tok_embd = L.matrix(embd_name, hp.n_vocab, hp.dim);
  m->output_norm =
      L.vec(tensor_name(norm, hp, TensorFormat::Hf), hp.dim, norm_shift(norm, hp, TensorFormat::Hf));
  if (!hp.tie_embeddings) {
    m->output = L.matrix(head_name, hp.n_vocab, hp.dim);
  } else {
    m->output = m->tok_embd;
    if (const auto* head = m->st->find(head_name)) {
      check_tied_lm_head(*head, L.get(embd_name), dir);
      L.used.insert(head_name);
    }
  }
  load_layer_tensors(*m, L, TensorFormat::Hf);
  if (hp.arch == Arch::GptOss) load_gpt_oss_hf_experts(*m, *m->st, L.used, dir);
  set_rope_tables(*m);
  L.check_all_used(fmt::format("config.json: num_hidden_layers = {}, {}", hp.n_layers, arch_name(hp.arch)));
  return m;
}

std::unique_ptr<ModelData> load_model(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) return load_hf_model(path);
  if (!fs::exists(path, ec)) fail("{}: no such file or directory", path);
  return load_gguf_model(path);
}

}  // namespace ultra
