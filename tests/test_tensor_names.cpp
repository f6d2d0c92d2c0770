// The tensor-name table (model/tensor_names.h) as both loaders and the converter use it: for every HF fixture
// and its converted GGUF file, dropping any one tensor the model needs gives an error naming the file and
// the tensor; the GGUF names are llama.cpp's; fused rows split exactly into their parts.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/convert.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "model/tensor_names.h"
#include "tmp_dir.h"

using namespace ultra;
namespace fs = std::filesystem;

namespace {

const fs::path kHf = fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "hf";

const std::vector<std::string> kFixtures = {"gemma2",           "gemma3",  "llama_gqa", "llama_gqa_bf16",
                                            "llama_tied_rope3", "mistral", "phi3_long", "phi3_short",
                                            "qwen2_bias",       "qwen3"};

const ultra::test::TmpDir& tmp() {
  static const ultra::test::TmpDir dir("ultra_tensor_names");
  return dir;
}

// The message of the error load_model(path) throws, or "" when it loads.
std::string load_error(const std::string& path) {
  try {
    load_model(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// dir/model.safetensors: src's tensors except `drop`, as they are.
void write_without(const safetensors::File& src, const std::string& drop, const fs::path& dir) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& t : src.tensors()) {
    if (t.name == drop) continue;
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.n_bytes}}};
    data.append((const char*)t.data, t.n_bytes);
  }
  const std::string h = header.dump();
  const uint64_t n = h.size();
  std::ofstream out(dir / "model.safetensors", std::ios::binary);
  out.write((const char*)&n, 8);
  out << h << data;
}

}  // namespace

// HF: every tensor of every fixture is required; a missing one is named with the model directory.
TEST(TensorNames, HfMissingTensorNamesTensorAndDirectory) {
  for (const std::string& fx : kFixtures) {
    const fs::path d = tmp().path() / ("hf_" + fx);
    fs::create_directories(d);
    for (const char* f : {"config.json", "generation_config.json"})
      if (fs::exists(kHf / fx / f)) fs::copy_file(kHf / fx / f, d / f, fs::copy_options::overwrite_existing);
    const auto src = safetensors::File::open((kHf / fx / "model.safetensors").string());
    ASSERT_GT(src->tensors().size(), 10u) << fx;
    for (const auto& t : src->tensors()) {
      write_without(*src, t.name, d);
      EXPECT_EQ(load_error(d.string()).find(d.string() + ": missing tensor '" + t.name + "'"), 0u)
          << fx << ": " << load_error(d.string());
    }
    fs::remove_all(d);
  }
}

// GGUF: every tensor of every converted fixture is required, except output.weight (its absence means tied
// embeddings) and the rope factor vectors (optional); a missing one is named with the file.
TEST(TensorNames, GgufMissingTensorNamesTensorAndFile) {
  for (const std::string& fx : kFixtures) {
    const std::string base = tmp().file(fx + ".gguf"), p = tmp().file(fx + "_drop.gguf");
    ConvertOptions opt;
    opt.out_type = "f32";
    convert_hf_to_gguf((kHf / fx).string(), base, opt);
    const gguf::Reader r = gguf::Reader::open(base);
    int checked = 0;
    for (const auto& drop : r.tensors()) {
      if (drop.name == gguf_name(TensorRole::Output) || drop.name.starts_with("rope_")) continue;
      gguf::Writer w;
      for (const auto& [k, v] : r.metadata()) w.set_value(k, v);
      for (const auto& t : r.tensors())
        if (t.name != drop.name) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
      w.write(p);
      EXPECT_EQ(load_error(p).find(p + ": missing tensor '" + drop.name + "'"), 0u)
          << fx << ": " << load_error(p);
      ++checked;
    }
    EXPECT_GT(checked, 10) << fx;
    fs::remove(base);
    fs::remove(p);
  }
}

// The GGUF names are llama.cpp's (llama-arch.cpp's LLM_TENSOR_NAMES, ".weight"/".bias" added), HF's are
// transformers'.
TEST(TensorNames, Names) {
  EXPECT_EQ(gguf_name(TensorRole::TokEmbd), "token_embd.weight");
  EXPECT_EQ(gguf_name(TensorRole::AttnQ, 3), "blk.3.attn_q.weight");
  EXPECT_EQ(gguf_name(TensorRole::AttnQkv, 0), "blk.0.attn_qkv.weight");
  EXPECT_EQ(gguf_name(TensorRole::AttnKBias, 12), "blk.12.attn_k.bias");
  EXPECT_EQ(gguf_name(TensorRole::AttnPostNorm, 1), "blk.1.post_attention_norm.weight");
  EXPECT_EQ(gguf_name(TensorRole::FfnPostNorm, 1), "blk.1.post_ffw_norm.weight");
  EXPECT_EQ(gguf_name(TensorRole::FfnGateUp, 2), "blk.2.ffn_up.weight");
  HParams hp;
  EXPECT_EQ(hf_name(TensorRole::FfnNorm, hp, 4), "model.layers.4.post_attention_layernorm.weight");
  hp.arch = Arch::Gemma2;
  hp.post_norms = true;
  EXPECT_EQ(hf_name(TensorRole::FfnNorm, hp, 4), "model.layers.4.pre_feedforward_layernorm.weight");
  EXPECT_EQ(hf_name(TensorRole::AttnPostNorm, hp, 4), "model.layers.4.post_attention_layernorm.weight");
  EXPECT_EQ(norm_shift(tensor_spec(TensorRole::FfnNorm), hp, TensorFormat::Hf), 1.0f);
  EXPECT_EQ(norm_shift(tensor_spec(TensorRole::FfnNorm), hp, TensorFormat::Gguf), 0.0f);
  EXPECT_THROW(hf_name(TensorRole::RopeFreqs, hp), Error);  // GGUF only
  EXPECT_EQ(tensor_need(tensor_spec(TensorRole::AttnQBias), hp, TensorFormat::Gguf), Need::Optional);
  EXPECT_EQ(tensor_need(tensor_spec(TensorRole::AttnQBias), hp, TensorFormat::Hf), Need::Absent);
}

// Mixture of experts: llama.cpp's stacked names; HF's per-expert names (Qwen's, Mixtral's); the dense FFN
// rows absent and the expert rows required exactly when the model has experts.
TEST(TensorNames, ExpertNames) {
  EXPECT_EQ(gguf_name(TensorRole::FfnGateInp, 1), "blk.1.ffn_gate_inp.weight");
  EXPECT_EQ(gguf_name(TensorRole::FfnDownExps, 2), "blk.2.ffn_down_exps.weight");
  EXPECT_EQ(gguf_name(TensorRole::FfnGateInpShexp, 0), "blk.0.ffn_gate_inp_shexp.weight");
  EXPECT_EQ(gguf_name(TensorRole::FfnUpShexp, 0), "blk.0.ffn_up_shexp.weight");
  HParams hp;
  hp.arch = Arch::Qwen3;
  hp.n_expert = 8;
  const TensorSpec& up = tensor_spec(TensorRole::FfnUpExps);
  EXPECT_EQ(tensor_name(up, hp, TensorFormat::Hf, 3, 7), "model.layers.3.mlp.experts.7.up_proj.weight");
  EXPECT_EQ(hf_name(TensorRole::FfnGateInp, hp, 3), "model.layers.3.mlp.gate.weight");
  EXPECT_EQ(hf_name(TensorRole::FfnGateInpShexp, hp, 3), "model.layers.3.mlp.shared_expert_gate.weight");
  EXPECT_EQ(tensor_need(up, hp, TensorFormat::Gguf), Need::Required);
  EXPECT_EQ(tensor_need(tensor_spec(TensorRole::FfnUp), hp, TensorFormat::Gguf), Need::Absent);
  EXPECT_EQ(tensor_need(tensor_spec(TensorRole::FfnDown), hp, TensorFormat::Hf), Need::Absent);
  EXPECT_EQ(tensor_need(tensor_spec(TensorRole::FfnUpShexp), hp, TensorFormat::Gguf), Need::Absent);
  hp.shexp_ffn_dim = 32;
  EXPECT_EQ(tensor_need(tensor_spec(TensorRole::FfnUpShexp), hp, TensorFormat::Gguf), Need::Required);
  hp.arch = Arch::Mistral;  // Mixtral
  EXPECT_EQ(tensor_name(up, hp, TensorFormat::Hf, 3, 7),
            "model.layers.3.block_sparse_moe.experts.7.w3.weight");
  EXPECT_EQ(tensor_name(tensor_spec(TensorRole::FfnGateExps), hp, TensorFormat::Hf, 0, 1),
            "model.layers.0.block_sparse_moe.experts.1.w1.weight");
  EXPECT_EQ(tensor_name(tensor_spec(TensorRole::FfnDownExps), hp, TensorFormat::Hf, 0, 1),
            "model.layers.0.block_sparse_moe.experts.1.w2.weight");
  EXPECT_EQ(hf_name(TensorRole::FfnGateInp, hp, 0), "model.layers.0.block_sparse_moe.gate.weight");
  hp.n_expert = 0;  // dense: the expert rows absent
  EXPECT_EQ(tensor_need(up, hp, TensorFormat::Gguf), Need::Absent);
  EXPECT_EQ(tensor_need(tensor_spec(TensorRole::FfnUp), hp, TensorFormat::Gguf), Need::Required);
}

// gpt-oss: llama.cpp's names (its FFN input norm is post_attention_norm, the sinks attn_sinks.weight, the
// biases .bias), HF's mlp.router and self_attn.sinks; the experts absent from the HF table (fused tensors
// of their own, model/gpt_oss.h) and their biases GGUF-only rows.
TEST(TensorNames, GptOssNames) {
  HParams hp;
  hp.arch = Arch::GptOss;
  hp.n_expert = 4;
  hp.qkv_bias = hp.o_bias = hp.attn_sinks = hp.expert_bias = true;
  EXPECT_EQ(tensor_name(tensor_spec(TensorRole::FfnNorm), hp, TensorFormat::Gguf, 2),
            "blk.2.post_attention_norm.weight");
  EXPECT_EQ(hf_name(TensorRole::FfnNorm, hp, 2), "model.layers.2.post_attention_layernorm.weight");
  EXPECT_EQ(hf_name(TensorRole::FfnGateInp, hp, 1), "model.layers.1.mlp.router.weight");
  EXPECT_EQ(hf_name(TensorRole::FfnGateInpBias, hp, 1), "model.layers.1.mlp.router.bias");
  EXPECT_EQ(hf_name(TensorRole::AttnSinks, hp, 0), "model.layers.0.self_attn.sinks");
  EXPECT_EQ(gguf_name(TensorRole::AttnSinks, 0), "blk.0.attn_sinks.weight");
  EXPECT_EQ(gguf_name(TensorRole::AttnOutBias, 5), "blk.5.attn_output.bias");
  EXPECT_EQ(gguf_name(TensorRole::FfnUpExpsBias, 5), "blk.5.ffn_up_exps.bias");
  for (TensorRole r : {TensorRole::FfnGateExps, TensorRole::FfnUpExps, TensorRole::FfnDownExps,
                       TensorRole::FfnGateExpsBias, TensorRole::FfnDownExpsBias}) {
    EXPECT_EQ(tensor_need(tensor_spec(r), hp, TensorFormat::Hf), Need::Absent) << (int)r;
    EXPECT_EQ(tensor_need(tensor_spec(r), hp, TensorFormat::Gguf), Need::Required) << (int)r;
  }
  EXPECT_EQ(tensor_need(tensor_spec(TensorRole::AttnSinks), hp, TensorFormat::Hf), Need::Required);
  EXPECT_EQ(tensor_need(tensor_spec(TensorRole::AttnOutBias), hp, TensorFormat::Gguf), Need::Required);
  hp.arch = Arch::Qwen3;  // the other MoE models keep their names and have none of these rows
  hp.qkv_bias = hp.o_bias = hp.attn_sinks = hp.expert_bias = false;
  EXPECT_EQ(tensor_name(tensor_spec(TensorRole::FfnNorm), hp, TensorFormat::Gguf, 2),
            "blk.2.ffn_norm.weight");
  EXPECT_EQ(tensor_need(tensor_spec(TensorRole::FfnUpExps), hp, TensorFormat::Hf), Need::Required);
  for (TensorRole r : {TensorRole::AttnSinks, TensorRole::AttnOutBias, TensorRole::FfnGateInpBias,
                       TensorRole::FfnUpExpsBias})
    EXPECT_EQ(tensor_need(tensor_spec(r), hp, TensorFormat::Gguf), Need::Absent) << (int)r;
}

// Each per-layer row: exactly one of a matrix, a vector or an experts slot; a fused matrix's parts cover
// its rows exactly.
TEST(TensorNames, RowsAreConsistent) {
  HParams hp;
  hp.dim = 64, hp.n_heads = 4, hp.n_kv_heads = 2, hp.head_dim = 16, hp.ffn_dim = 96;
  for (const TensorSpec& t : layer_tensors()) {
    EXPECT_EQ((t.matrix != nullptr) + (t.vector != nullptr) + (t.experts != nullptr), 1) << t.gguf;
    // matrices have cols; vectors do not, except gpt-oss's expert biases ([n_expert, n] in one vector slot)
    if (t.vector && t.cols != Dim::None)
      EXPECT_EQ(t.rows, Dim::Experts) << t.gguf;
    else
      EXPECT_EQ(t.matrix != nullptr || t.experts != nullptr, t.cols != Dim::None) << t.gguf;
    int64_t rows = 0;
    for (const RowPart& p : t.parts)
      if (p.slot) rows += dim_size(p.rows, hp);
    if (t.parts[0].slot) {
      EXPECT_EQ(rows, dim_size(t.rows, hp)) << t.gguf;
    }
  }
}
