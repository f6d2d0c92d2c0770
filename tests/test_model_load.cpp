// Model-level validation: missing tensors, wrong shapes, unsupported architectures, absurd
// hyper-parameters and truncated files all give an ultra::Error naming the file and the problem.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "../fuzz/fuzz_harness.h"
#include "core/error.h"
#include "core/mmap.h"
#include "expect_error.h"
#include "io/convert.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "tmp_dir.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "ultra/context.h"
#include "ultra/model.h"

using namespace ultra;
namespace fs = std::filesystem;

namespace {

const fs::path kHf = fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "hf";

// Files and directories of this test binary live in one mkdtemp directory, removed at exit.
fs::path tmp(const std::string& name) {
  static const ultra::test::TmpDir dir("ultra_model_load");
  return dir.path() / name;
}

using test::expect_error;

// Rewrites a GGUF with edits: drop a tensor, override a key, replace a tensor's shape.
void rewrite(const fs::path& src, const fs::path& dst, const std::string& drop_tensor,
             const std::function<void(gguf::Writer&)>& edit_keys, const std::string& reshape_tensor = "") {
  const gguf::Reader r = gguf::Reader::open(src.string());
  gguf::Writer w;
  for (const auto& [k, v] : r.metadata()) w.set_value(k, v);
  edit_keys(w);
  for (const auto& t : r.tensors()) {
    if (t.name == drop_tensor) continue;
    auto ne = t.ne;
    if (t.name == reshape_tensor) std::swap(ne[0], ne[1]);
    w.add_tensor(t.name, t.type, ne, t.data, t.n_bytes);
  }
  w.write(dst.string());
}

class ModelLoad : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = tmp("base.gguf");
    ConvertOptions opt;
    opt.out_type = "f32";
    convert_hf_to_gguf((kHf / "llama_gqa").string(), base_.string(), opt);
  }
  void TearDown() override { fs::remove(base_); }
  fs::path base_;
};

TEST_F(ModelLoad, ConvertedFileLoads) {
  auto m = load_model(base_.string());
  EXPECT_EQ(m->hp.n_layers, 2);
  EXPECT_TRUE(m->hp.rope_interleaved);
}

TEST_F(ModelLoad, MissingTensor) {
  const auto p = tmp("missing.gguf");
  rewrite(base_, p, "blk.1.ffn_down.weight", [](gguf::Writer&) {});
  expect_error([&] { load_model(p.string()); }, "missing tensor 'blk.1.ffn_down.weight'");
  fs::remove(p);
}

TEST_F(ModelLoad, WrongShape) {
  const auto p = tmp("shape.gguf");
  rewrite(
      base_, p, "", [](gguf::Writer&) {}, "blk.0.ffn_gate.weight");
  expect_error([&] { load_model(p.string()); }, "blk.0.ffn_gate.weight' has shape");
  fs::remove(p);
}

TEST_F(ModelLoad, UnsupportedArchitecture) {
  const auto p = tmp("arch.gguf");
  rewrite(base_, p, "", [](gguf::Writer& w) { w.set_string("general.architecture", "gpt2"); });
  expect_error([&] { load_model(p.string()); }, "unsupported architecture 'gpt2'");
  fs::remove(p);
}

TEST_F(ModelLoad, AbsurdHyperParameters) {
  const auto p = tmp("hp.gguf");
  rewrite(base_, p, "", [](gguf::Writer& w) { w.set_u32("llama.attention.head_count_kv", 3); });
  expect_error([&] { load_model(p.string()); }, "kv head count");
  rewrite(base_, p, "", [](gguf::Writer& w) { w.set_u32("llama.block_count", 0); });
  expect_error([&] { load_model(p.string()); }, "layer count");
  rewrite(base_, p, "", [](gguf::Writer& w) { w.set_u32("llama.block_count", 3); });
  expect_error([&] { load_model(p.string()); }, "missing tensor 'blk.2.attn_norm.weight'");
  rewrite(base_, p, "", [](gguf::Writer& w) { w.set_string("llama.embedding_length", "wide"); });
  expect_error([&] { load_model(p.string()); }, "llama.embedding_length");
  fs::remove(p);
}

TEST_F(ModelLoad, TokenIdsAndHeadSizes) {
  const auto p = tmp("ids.gguf");
  rewrite(base_, p, "", [](gguf::Writer& w) {
    w.set_u32("tokenizer.ggml.eos_token_id", 2);
    w.set_u32("tokenizer.ggml.eot_token_id", 7);
    w.set_i32("tokenizer.ggml.eom_token_id", -1);  // llama.cpp's "none"
  });
  auto m = load_model(p.string());
  EXPECT_EQ(m->hp.eos_ids, (std::vector<int32_t>{2, 7}));
  EXPECT_EQ(m->hp.eos_id, 2);
  rewrite(base_, p, "", [](gguf::Writer& w) { w.set_u32("tokenizer.ggml.eot_token_id", 320); });
  expect_error([&] { load_model(p.string()); },
               "tokenizer.ggml.eot_token_id = 320 is outside the vocabulary of 320 tokens");
  rewrite(base_, p, "", [](gguf::Writer& w) { w.set_u32("tokenizer.ggml.bos_token_id", 5000); });
  expect_error([&] { load_model(p.string()); },
               "tokenizer.ggml.bos_token_id = 5000 is outside the vocabulary");
  rewrite(base_, p, "", [](gguf::Writer& w) { w.set_u32("llama.attention.value_length", 8); });
  expect_error([&] { load_model(p.string()); },
               "llama.attention.value_length 8 differs from the key head dim 16");
  rewrite(base_, p, "", [](gguf::Writer& w) {
    w.set_value("llama.rope.freq_base", gguf::Value::of_float(gguf::ValueType::F64, 1e300));
  });
  expect_error([&] { load_model(p.string()); }, "key 'llama.rope.freq_base' = 1e+300 is not a finite float");
  rewrite(base_, p, "", [](gguf::Writer& w) { w.set_f32("llama.attention.layer_norm_rms_epsilon", -1); });
  expect_error([&] { load_model(p.string()); }, "invalid rms norm eps -1");
  fs::remove(p);
}

// Every tensor must be used: leftover tensors mean the hyper-parameters do not describe the file.
TEST_F(ModelLoad, UnusedTensors) {
  const auto p = tmp("unused.gguf");
  rewrite(base_, p, "", [](gguf::Writer& w) { w.set_u32("llama.block_count", 1); });
  expect_error([&] { load_model(p.string()); },
               p.string() +
                   ": 9 tensors are not used by the model: 'blk.1.attn_k.weight', "
                   "'blk.1.attn_norm.weight', 'blk.1.attn_output.weight', 'blk.1.attn_q.weight', "
                   "'blk.1.attn_v.weight', 'blk.1.ffn_down.weight' and 3 more (llama.block_count = 1");
  {
    const gguf::Reader r = gguf::Reader::open(base_.string());
    gguf::Writer w;
    for (const auto& [k, v] : r.metadata()) w.set_value(k, v);
    for (const auto& t : r.tensors()) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
    const float extra[4] = {};
    w.add_tensor("blk.0.extra.weight", GgmlType::F32, {4}, extra, sizeof extra);
    w.write(p.string());
  }
  expect_error([&] { load_model(p.string()); }, "1 tensor is not used by the model: 'blk.0.extra.weight'");
  fs::remove(p);
}

// The base file with one matrix replaced by blocks of another type (same shape).
void retype(const fs::path& src, const fs::path& dst, const std::string& name, GgmlType type,
            const std::vector<uint8_t>& blocks) {
  const gguf::Reader r = gguf::Reader::open(src.string());
  gguf::Writer w;
  for (const auto& [k, v] : r.metadata()) w.set_value(k, v);
  for (const auto& t : r.tensors()) {
    if (t.name == name)
      w.add_tensor(t.name, type, t.ne, blocks.data(), blocks.size());
    else
      w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
  }
  w.write(dst.string());
}

// Block-quantized weights: a valid Q4_0 / IQ4_NL / MXFP4 matrix loads and gives finite logits; a block scale
// that is not finite is refused naming the tensor, block and row; a type the CPU does not compute with is
// refused naming it and the supported ones.
TEST_F(ModelLoad, BlockQuantizedWeights) {
  const auto p = tmp("blocks.gguf");
  const std::string name = "blk.0.attn_q.weight";  // [64, 64]: 2 blocks of 32 per row
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::IQ4_NL, GgmlType::MXFP4}) {
    SCOPED_TRACE(std::string(type_name(t)));
    const auto tt = type_traits(t);
    std::vector<uint8_t> blocks(64 * 2 * tt->block_bytes);
    for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = (uint8_t)(i * 37 + 11);
    for (size_t b = 0; b < 128; ++b) {  // a small finite scale in each block
      uint8_t* blk = blocks.data() + b * tt->block_bytes;
      if (t == GgmlType::MXFP4) {
        blk[0] = 120;
      } else {
        blk[0] = 0x00;
        blk[1] = 0x20;  // f16 0x2000 = 2^-7
      }
    }
    retype(base_, p, name, t, blocks);
    const Model m = Model::load(p.string());
    Context ctx(m, {.n_ctx = 16});
    const int32_t toks[] = {1, 5, 9};
    Batch b(8);
    b.add_sequence(toks, 0, 0, Output::logits);
    ctx.step(b);
    const auto logits = ctx.logits(2);
    ASSERT_EQ((int)logits.size(), m.info().n_vocab);
    for (size_t i = 0; i < logits.size(); ++i) ASSERT_TRUE(std::isfinite(logits[i])) << i;
    if (t == GgmlType::MXFP4) continue;
    blocks[5 * tt->block_bytes + 1] = 0x7e;  // block 5 (row 2): f16 NaN
    retype(base_, p, name, t, blocks);
    expect_error([&] { load_model(p.string()); }, "tensor '" + name + "' (" + std::string(tt->name) +
                                                      "): block 5 (row 2) has a scale that is not finite");
  }
  std::vector<uint8_t> q8_1(64 * 2 * 36, 0);
  retype(base_, p, name, GgmlType::Q8_1, q8_1);
  expect_error([&] { load_model(p.string()); },
               "tensor '" + name + "' has type Q8_1 (9), supported: F32, F16");
  fs::remove(p);
}

TEST_F(ModelLoad, TruncatedFile) {
  const auto p = tmp("trunc.gguf");
  const auto size = fs::file_size(base_);
  for (uintmax_t cut : {(uintmax_t)3, (uintmax_t)100, size / 2, size - 1}) {
    fs::copy_file(base_, p, fs::copy_options::overwrite_existing);
    fs::resize_file(p, cut);
    expect_error([&] { load_model(p.string()); }, p.string());
  }
  fs::remove(p);
}

// HF directories: a copy of a fixture with one file edited.
fs::path hf_copy(const std::string& name) {
  const fs::path d = tmp("hf_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(kHf / "llama_gqa" / f, d / f);
  return d;
}

TEST(ModelLoadHf, UnsupportedArchitecture) {
  const fs::path d = hf_copy("arch");
  std::ofstream(d / "config.json") << R"({"architectures": ["GPT2LMHeadModel"], "vocab_size": 10})";
  expect_error([&] { load_model(d.string()); }, "unsupported architecture 'GPT2LMHeadModel'");
  fs::remove_all(d);
}

TEST(ModelLoadHf, BadConfig) {
  const fs::path d = hf_copy("cfg");
  std::ofstream(d / "config.json") << "{ not json";
  expect_error([&] { load_model(d.string()); }, "invalid JSON");
  std::ofstream(d / "config.json") << R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 320})";
  expect_error([&] { load_model(d.string()); }, "missing 'hidden_size'");
  std::ofstream(d / "config.json")
      << R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 320, "hidden_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": -5})";
  expect_error([&] { load_model(d.string()); }, "intermediate_size");
  std::string deep = R"({"architectures": ["LlamaForCausalLM"], "x": )";
  for (int i = 0; i < 100; ++i) deep += "[";
  std::ofstream(d / "config.json") << deep;
  expect_error([&] { load_model(d.string()); }, "config.json: JSON nested deeper than 64 levels");
  fs::remove_all(d);
}

// config.json values of the wrong type or outside their range are errors naming the key, not silently
// ignored or (for floats beyond float range) converted with undefined behaviour.
TEST(ModelLoadHf, ConfigValuesOutOfRange) {
  const fs::path d = hf_copy("range");
  std::ifstream in(kHf / "llama_gqa" / "config.json");
  const nlohmann::json base = nlohmann::json::parse(in);
  const std::string cfg = (d / "config.json").string();
  auto with = [&](const char* key, const nlohmann::json& v) {
    nlohmann::json j = base;
    j[key] = v;
    std::ofstream(d / "config.json") << j.dump(1);
  };
  auto err = [&](const std::string& phrase) { expect_error([&] { load_model(d.string()); }, phrase); };
  with("eos_token_id", 320);
  err(cfg + ": eos token id 320 is outside the vocabulary of 320 tokens");
  with("eos_token_id", -1);
  err(cfg + ": 'eos_token_id' holds -1, not a valid token id");
  with("eos_token_id", nlohmann::json::array({2, 400}));
  err("eos token id 400 is outside the vocabulary of 320 tokens");
  with("eos_token_id", nlohmann::json::array({2, "x"}));
  err("'eos_token_id' must be a token id or a list of token ids");
  with("bos_token_id", 1000);
  err("bos token id 1000 is outside the vocabulary of 320 tokens");
  with("tie_word_embeddings", "false");
  err(cfg + ": 'tie_word_embeddings' must be true or false, got \"false\"");
  with("attention_bias", 0);
  err("'attention_bias' must be true or false");
  with("rms_norm_eps", 1e39);
  err(cfg + ": 'rms_norm_eps' = 1e+39 is not a finite float");
  with("rms_norm_eps", 1e-300);  // 0 as a float
  err("invalid rms norm eps 0");
  with("rms_norm_eps", -1e-5);
  err("invalid rms norm eps");
  with("rope_theta", -10000.0);
  err("invalid rope theta -10000");
  with("rope_theta", 1e300);
  err("'rope_theta' = 1e+300 is not a finite float");
  with("rope_theta", "10000");
  err("'rope_theta' must be a number");
  with("v_head_dim", 8);
  err("v_head_dim 8 differs from the key head dim 16");
  // A key given twice: the safetensors header's rule, in config.json too.
  std::string text = base.dump(1);
  text.insert(1, "\"hidden_size\": 32,");
  std::ofstream(d / "config.json") << text;
  err(cfg + ": JSON key 'hidden_size' appears twice in one object");
  fs::remove_all(d);
}

// eos_token_id may be a list (as in Llama 3 configs); generation_config.json adds its own ids.
TEST(ModelLoadHf, EosIdLists) {
  const fs::path d = hf_copy("eos");
  std::ifstream in(kHf / "llama_gqa" / "config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["eos_token_id"] = {2, 5};
  std::ofstream(d / "config.json") << j.dump(1);
  auto m = load_model(d.string());
  EXPECT_EQ(m->hp.eos_ids, (std::vector<int32_t>{2, 5}));
  EXPECT_EQ(m->hp.eos_id, 2);
  EXPECT_EQ(m->hp.bos_id, 1);
  std::ofstream(d / "generation_config.json") << R"({"bos_token_id": 1, "eos_token_id": [5, 7, 2]})";
  m = load_model(d.string());
  EXPECT_EQ(m->hp.eos_ids, (std::vector<int32_t>{2, 5, 7}));
  j.erase("eos_token_id");
  j.erase("bos_token_id");
  std::ofstream(d / "config.json") << j.dump(1);
  std::ofstream(d / "generation_config.json") << R"({"bos_token_id": 3, "eos_token_id": 9})";
  m = load_model(d.string());
  EXPECT_EQ(m->hp.eos_ids, (std::vector<int32_t>{9}));
  EXPECT_EQ(m->hp.eos_id, 9);
  EXPECT_EQ(m->hp.bos_id, 3);
  std::ofstream(d / "generation_config.json") << R"({"eos_token_id": [9, 320]})";
  expect_error([&] { load_model(d.string()); }, "eos token id 320 is outside the vocabulary of 320 tokens");
  fs::remove_all(d);
}

// A safetensors file (F32 tensors, packed in order) holding a fixture's tensors plus extra ones.
void write_checkpoint(const fs::path& dir, const std::string& fixture,
                      const std::vector<std::pair<std::string, std::vector<float>>>& extra,
                      const std::vector<std::string>& drop = {}) {
  const auto src = safetensors::File::open((kHf / fixture / "model.safetensors").string());
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  auto add = [&](const std::string& name, const std::string& dtype, const std::vector<uint64_t>& shape,
                 const void* p, size_t n) {
    header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {data.size(), data.size() + n}}};
    data.append((const char*)p, n);
  };
  for (const auto& t : src->tensors())
    if (std::find(drop.begin(), drop.end(), t.name) == drop.end())
      add(t.name, t.dtype, t.shape, t.data, t.n_bytes);
  for (const auto& [name, v] : extra) add(name, "F32", {v.size()}, v.data(), v.size() * 4);
  const std::string h = header.dump();
  const uint64_t n = h.size();
  std::ofstream out(dir / "model.safetensors", std::ios::binary);
  out.write((const char*)&n, 8);
  out << h << data;
}

TEST(ModelLoadHf, UnusedTensors) {
  const fs::path d = hf_copy("unused");
  std::ifstream in(kHf / "llama_gqa" / "config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["num_hidden_layers"] = 1;
  std::ofstream(d / "config.json") << j.dump(1);
  expect_error(
      [&] { load_model(d.string()); },
      d.string() + ": 9 tensors are not used by the model: 'model.layers.1.input_layernorm.weight', ");
  expect_error([&] { load_model(d.string()); }, "(config.json: num_hidden_layers = 1, llama)");
  fs::copy_file(kHf / "llama_gqa" / "config.json", d / "config.json", fs::copy_options::overwrite_existing);
  write_checkpoint(d, "llama_gqa", {{"model.layers.0.mlp.extra.weight", {1, 2}}});
  expect_error([&] { load_model(d.string()); },
               "1 tensor is not used by the model: 'model.layers.0.mlp.extra.weight'");
  // Saved rotary inverse frequencies are recomputed from the config, not counted.
  write_checkpoint(d, "llama_gqa", {{"model.layers.0.self_attn.rotary_emb.inv_freq", std::vector<float>(8)}});
  EXPECT_NO_THROW(load_model(d.string()));
  fs::remove_all(d);
}

// tie_word_embeddings with an lm_head.weight in the checkpoint: accepted only when it is the embedding.
TEST(ModelLoadHf, TiedEmbeddingsWithLmHead) {
  const fs::path d = tmp("hf_tied");
  fs::remove_all(d);
  fs::create_directories(d);
  fs::copy_file(kHf / "llama_tied_rope3" / "config.json", d / "config.json");
  const auto src = safetensors::File::open((kHf / "llama_tied_rope3" / "model.safetensors").string());
  const safetensors::Tensor* embd = nullptr;
  for (const auto& t : src->tensors())
    if (t.name == "model.embed_tokens.weight") embd = &t;
  ASSERT_TRUE(embd && embd->dtype == "F32");
  std::vector<float> head(embd->n_bytes / 4);
  std::memcpy(head.data(), embd->data, embd->n_bytes);
  // write_checkpoint writes extras as 1-D: build [rows, cols] by hand through the header instead.
  auto write_with_head = [&](const std::vector<float>& h) {
    nlohmann::json header = nlohmann::json::object();
    std::string data;
    for (const auto& t : src->tensors()) {
      header[t.name] = {
          {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.n_bytes}}};
      data.append((const char*)t.data, t.n_bytes);
    }
    header["lm_head.weight"] = {{"dtype", "F32"},
                                {"shape", embd->shape},
                                {"data_offsets", {data.size(), data.size() + h.size() * 4}}};
    data.append((const char*)h.data(), h.size() * 4);
    const std::string hs = header.dump();
    const uint64_t n = hs.size();
    std::ofstream out(d / "model.safetensors", std::ios::binary);
    out.write((const char*)&n, 8);
    out << hs << data;
  };
  write_with_head(head);
  EXPECT_NO_THROW(load_model(d.string()));
  head[5] += 1.0f;
  write_with_head(head);
  expect_error([&] { load_model(d.string()); },
               "tie_word_embeddings is true but the checkpoint's lm_head.weight (F32 [320, 64]) differs from "
               "model.embed_tokens.weight (F32 [320, 64])");
  fs::remove_all(d);
}

// A byte-level BPE tokenizer.json with fewer tokens than the embedding table has rows (320): the 256 byte
// tokens, 2 merges ("h e", "he l"), an id left undefined (260) and a special token at id 261.
std::string small_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[std::string(tok::utf8::byte_to_unicode((uint8_t)b))] = b;
  vocab["he"] = 256;
  vocab["hel"] = 257;
  vocab["\xc4\xa0w"] = 258;  // " w"
  vocab["or"] = 259;
  nlohmann::json j;
  j["added_tokens"] = {{{"id", 261}, {"content", "<|end|>"}, {"special", true}}};
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"h e", "he l", "\xc4\xa0 w", "o r"}}};
  return j.dump();
}

// convert pads the token list to the embedding rows with "[PAD{id}]" tokens of type UNUSED (llama.cpp's
// convert_hf_to_gguf.py), filling undefined ids too, so that llama.cpp (which needs one token per row)
// loads the file.
TEST(ModelLoadHf, ConvertPadsTheTokenList) {
  const fs::path d = hf_copy("pad");
  std::ofstream(d / "tokenizer.json") << small_tokenizer_json();
  const fs::path out = tmp("pad.gguf");
  ConvertOptions opt;
  opt.out_type = "f32";
  convert_hf_to_gguf(d.string(), out.string(), opt);
  const gguf::Reader r = gguf::Reader::open(out.string());
  const gguf::Array& tokens = r.find("tokenizer.ggml.tokens")->as_array();
  const gguf::Array& types = r.find("tokenizer.ggml.token_type")->as_array();
  ASSERT_EQ(tokens.size(), 320u);  // = token_embd rows
  ASSERT_EQ(types.size(), 320u);
  EXPECT_EQ(r.find_tensor("token_embd.weight")->ne[1], 320u);
  EXPECT_EQ(tokens.string_at(257), "hel");
  EXPECT_EQ(tokens.string_at(260), "[PAD260]");
  EXPECT_EQ(types.int_at(260), 5);  // UNUSED
  EXPECT_EQ(tokens.string_at(261), "<|end|>");
  EXPECT_EQ(types.int_at(261), 3);  // CONTROL
  for (size_t i = 262; i < 320; ++i) {
    EXPECT_EQ(tokens.string_at(i), "[PAD" + std::to_string(i) + "]");
    EXPECT_EQ(types.int_at(i), 5);
  }
  // The padded file's tokenizer encodes as the tokenizer.json does, and never yields a padding token.
  const tok::Tokenizer from_gguf = tok::Tokenizer::from_file(out.string());
  const tok::Tokenizer from_json(tok::load_hf_json(small_tokenizer_json(), "", "tokenizer.json"));
  EXPECT_EQ(from_gguf.n_vocab(), 320);
  for (const char* text : {"hello world", "help<|end|>", "\xff\xfe h"})
    EXPECT_EQ(from_gguf.encode(text, false, true), from_json.encode(text, false, true)) << text;
  EXPECT_EQ(load_model(out.string())->hp.n_vocab, 320);
  fs::remove_all(d);
}

// tokenizer_config.json's chat_template is written as tokenizer.chat_template (Model::chat_template() reads
// it back from the GGUF as it does from the HF directory); without one the key is absent.
TEST(ModelLoadHf, ConvertKeepsTheChatTemplate) {
  const fs::path d = hf_copy("tmpl");
  std::ofstream(d / "tokenizer.json") << small_tokenizer_json();
  const std::string tmpl = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}";
  std::ofstream(d / "tokenizer_config.json") << nlohmann::json{{"chat_template", tmpl}}.dump();
  ConvertOptions opt;
  opt.out_type = "f32";
  const fs::path out = tmp("tmpl.gguf");
  convert_hf_to_gguf(d.string(), out.string(), opt);
  EXPECT_EQ(gguf::Reader::open(out.string()).get_string("tokenizer.chat_template"), tmpl);
  EXPECT_EQ(ultra::Model::load(out.string()).chat_template(), tmpl);
  EXPECT_EQ(ultra::Model::load(d.string()).chat_template(), tmpl);
  fs::remove(d / "tokenizer_config.json");
  const fs::path out2 = tmp("notmpl.gguf");
  convert_hf_to_gguf(d.string(), out2.string(), opt);
  EXPECT_EQ(gguf::Reader::open(out2.string()).find("tokenizer.chat_template"), nullptr);
  fs::remove_all(d);
}

TEST(ModelLoadHf, ShapeMismatchAndMissingFiles) {
  const fs::path d = hf_copy("shape");
  std::ifstream in(kHf / "llama_gqa" / "config.json");
  std::string cfg((std::istreambuf_iterator<char>(in)), {});
  const auto pos = cfg.find("\"intermediate_size\": 128");
  ASSERT_NE(pos, std::string::npos);
  cfg.replace(pos, 24, "\"intermediate_size\": 96");
  std::ofstream(d / "config.json") << cfg;
  expect_error([&] { load_model(d.string()); }, "mlp.gate_proj.weight' has shape");
  fs::remove(d / "model.safetensors");
  expect_error([&] { load_model(d.string()); }, "model.safetensors");
  fs::remove_all(d);
  expect_error([&] { load_model(d.string()); }, "no such file");
}

}  // namespace

// Inputs of the fuzz target fuzz_hf_config that once mattered, replayed through the same harness
// (fuzz/fuzz_harness.h): each parses or fails with ultra::Error, nothing else.
TEST(FuzzRegression, HfConfig) {
  const fs::path dir = fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "fuzz" / "hf_config";
  ASSERT_TRUE(fs::is_directory(dir)) << dir << " not found";
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::ifstream f(e.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), {});
    SCOPED_TRACE(e.path().string());
    EXPECT_NO_THROW(ultra::fuzz::hf_config_one(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    ++n;
  }
  EXPECT_GT(n, 0);
}

// Features of the new architectures that are not implemented are refused by name.
TEST(ModelLoadHf, UnsupportedFeaturesOfNewArchitectures) {
  auto cfg = [](const std::string& arch, const std::string& extra) {
    return R"({"architectures": [")" + arch +
           R"("], "vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
               "intermediate_size": 32)" +
           extra + "}";
  };
  auto refuse = [&](const std::string& arch, const std::string& extra, const char* what) {
    expect_error([&] { parse_hf_config_json(cfg(arch, extra), "config.json"); }, what);
  };
  refuse("Gemma3ForConditionalGeneration", "", "unsupported architecture 'Gemma3ForConditionalGeneration'");
  refuse("Gemma2ForCausalLM", R"(, "hidden_activation": "gelu")", "hidden activation 'gelu'");
  refuse("Gemma2ForCausalLM",
         R"(, "sliding_window": 4, "layer_types": ["chunked_attention", "full_attention"])",
         "layer_types[0] = 'chunked_attention'");
  refuse("Gemma2ForCausalLM", R"(, "layer_types": ["sliding_attention", "full_attention"])",
         "need a sliding_window");
  refuse(
      "Gemma3ForCausalLM",
      R"(, "sliding_window": 4, "rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2}})",
      "rope type 'linear' on sliding layers");
  refuse("Phi3ForCausalLM", R"(, "partial_rotary_factor": 0.5)", "partial_rotary_factor");
  refuse("Phi3ForCausalLM", R"(, "rope_parameters": {"rope_type": "yarn", "factor": 2})", "rope type 'yarn'");
  refuse("Qwen3ForCausalLM", R"(, "attention_bias": true)",
         "attention_bias = true is not supported for qwen3");
  refuse("Qwen3ForCausalLM", R"(, "hidden_act": "gelu")", "hidden activation 'gelu'");
  refuse("Phi3ForCausalLM",
         R"(, "rope_parameters": {"rope_type": "longrope", "short_factor": [1], "long_factor": [1]})",
         "head_dim/2 = 4 entries");
  // The accepted forms: Gemma 3's transformers-4 rope keys.
  const HParams hp = parse_hf_config_json(
      cfg("Gemma3ForCausalLM", R"(, "sliding_window": 4, "sliding_window_pattern": 2, "rope_theta": 1000000.0,
          "rope_local_base_freq": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 8.0})"),
      "config.json");
  EXPECT_EQ(hp.rope_scaling.type, "linear");
  EXPECT_EQ(hp.rope_scaling.factor, 8.0f);
  EXPECT_EQ(hp.rope_theta, 1e6f);
  EXPECT_EQ(hp.rope_theta_swa, 1e4f);
  EXPECT_EQ(hp.swa_layers, (std::vector<uint8_t>{1, 0}));
  EXPECT_TRUE(hp.tie_embeddings && hp.qk_norm && hp.post_norms && hp.gelu);
}

// Which layers slide (transformers' masks): Mistral and Phi-3 window every layer; Llama ignores a
// sliding_window key (LlamaModel builds a plain causal mask); Qwen2/3 slide from max_window_layers on, only
// with use_sliding_window, unless layer_types says otherwise.
TEST(ModelLoadHf, WhichLayersSlide) {
  auto parse = [](const std::string& arch, const std::string& extra) {
    return parse_hf_config_json(R"({"architectures": [")" + arch +
                                    R"("], "vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 3,
                                       "num_attention_heads": 2, "intermediate_size": 32)" +
                                    extra + "}",
                                "config.json");
  };
  auto sliding = [](const HParams& hp) {
    std::vector<int> v;
    for (int il = 0; il < hp.n_layers; ++il) v.push_back(hp.layer_swa(il) ? hp.sliding_window : 0);
    return v;
  };
  EXPECT_EQ(sliding(parse("MistralForCausalLM", R"(, "sliding_window": 12)")),
            (std::vector<int>{12, 12, 12}));
  EXPECT_EQ(sliding(parse("Phi3ForCausalLM", R"(, "sliding_window": 7)")), (std::vector<int>{7, 7, 7}));
  EXPECT_EQ(sliding(parse("MistralForCausalLM", R"(, "sliding_window": null)")), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(sliding(parse("LlamaForCausalLM", R"(, "sliding_window": 12)")), (std::vector<int>{0, 0, 0}));
  for (const char* qwen : {"Qwen2ForCausalLM", "Qwen3ForCausalLM"}) {
    SCOPED_TRACE(qwen);
    EXPECT_EQ(sliding(parse(qwen, R"(, "sliding_window": 12, "max_window_layers": 1)")),
              (std::vector<int>{0, 0, 0}));
    EXPECT_EQ(
        sliding(parse(qwen, R"(, "use_sliding_window": true, "sliding_window": 12, "max_window_layers": 1)")),
        (std::vector<int>{0, 12, 12}));
    EXPECT_EQ(sliding(parse(qwen, R"(, "use_sliding_window": true, "sliding_window": 12)")),
              (std::vector<int>{0, 0, 0}));  // max_window_layers defaults to 28
    EXPECT_EQ(
        sliding(parse(qwen, R"(, "use_sliding_window": true, "sliding_window": 12, "max_window_layers": 0,
                                  "layer_types": ["full_attention", "sliding_attention", "full_attention"])")),
        (std::vector<int>{0, 12, 0}));
  }
}

// --no-mmap (set_read_into_memory): the file read into 2 MiB-aligned anonymous memory, byte for byte the
// mapped content, for sizes below, at and above a multiple of 2 MiB; an empty file stays empty; a model
// loads from it and its weights point into that memory.
TEST(MappedFileCopy, SameBytesAlignedToHugePages) {
  std::mt19937 rng(5);
  for (size_t size : {(size_t)1, (size_t)12345, (size_t)2 << 20, ((size_t)4 << 20) + 17, (size_t)0}) {
    const fs::path p = tmp("copy_" + std::to_string(size) + ".bin");
    std::string bytes(size, '\0');
    for (char& c : bytes) c = (char)rng();
    std::ofstream(p, std::ios::binary).write(bytes.data(), (std::streamsize)bytes.size());
    set_read_into_memory(false);
    const MappedFile mapped(p.string());
    set_read_into_memory(true);
    MappedFile copied(p.string());
    set_read_into_memory(false);
    EXPECT_FALSE(mapped.copied());
    ASSERT_EQ(copied.size(), size);
    ASSERT_EQ(mapped.size(), size);
    if (size == 0) {
      EXPECT_EQ(copied.data(), nullptr);
      continue;
    }
    EXPECT_TRUE(copied.copied());
    EXPECT_EQ((uintptr_t)copied.data() % ((uintptr_t)2 << 20), 0u) << size;
    EXPECT_EQ(std::memcmp(copied.data(), bytes.data(), size), 0) << size;
    EXPECT_EQ(std::memcmp(mapped.data(), bytes.data(), size), 0) << size;
    const MappedFile moved(std::move(copied));  // the move keeps the copy's extent
    EXPECT_TRUE(moved.copied());
    EXPECT_EQ(std::memcmp(moved.data(), bytes.data(), size), 0) << size;
  }
}

TEST(HugePageMemory, AlignedZeroedWritableAndMoves) {
  for (bool prefault : {true, false}) {
    for (size_t size : {(size_t)1, (size_t)4095, (size_t)2 << 20, ((size_t)3 << 20) + 5}) {
      HugePageMemory m(size, "a test", prefault);
      ASSERT_NE(m.data(), nullptr);
      EXPECT_EQ(m.size(), size);
      EXPECT_EQ((uintptr_t)m.data() % ((uintptr_t)2 << 20), 0u);
      for (size_t i = 0; i < size; i += 997) ASSERT_EQ(m.data()[i], 0) << size;
      ASSERT_EQ(m.data()[size - 1], 0);
      m.data()[size - 1] = 7;
      HugePageMemory moved(std::move(m));
      EXPECT_EQ(m.data(), nullptr);
      EXPECT_EQ(moved.data()[size - 1], 7);
      HugePageMemory assigned;
      assigned = std::move(moved);
      EXPECT_EQ(assigned.data()[size - 1], 7);
      EXPECT_EQ(assigned.size(), size);
    }
  }
  EXPECT_EQ(HugePageMemory(0, "nothing", true).data(), nullptr);
  EXPECT_THROW(HugePageMemory((size_t)1 << 60, "an absurd size", true), Error);
}

TEST_F(ModelLoad, ReadIntoMemoryLoadsTheSameWeights) {
  const auto mapped = load_model(base_.string());
  set_read_into_memory(true);
  const auto copied = load_model(base_.string());
  set_read_into_memory(false);
  ASSERT_EQ(copied->layers.size(), mapped->layers.size());
  const WeightView& a = mapped->layers[0].wq;
  const WeightView& b = copied->layers[0].wq;
  ASSERT_EQ(a.rows * a.row_bytes, b.rows * b.row_bytes);
  EXPECT_NE(a.data, b.data);
  EXPECT_EQ(std::memcmp(a.data, b.data, a.rows * a.row_bytes), 0);
}
