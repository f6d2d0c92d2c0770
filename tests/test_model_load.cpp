// Model-level validation: missing tensors, wrong shapes, unsupported architectures, absurd
// hyper-parameters and truncated files all give an ultra::Error naming the file and the problem.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/convert.h"
#include "io/gguf.h"
#include "model/model.h"

using namespace ultra;
namespace fs = std::filesystem;

namespace {

const fs::path kHf = fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "hf";

fs::path tmp(const std::string& name) {
  return fs::temp_directory_path() / ("ultra_model_load_" + name);
}

void expect_error(const std::function<void()>& f, const std::string& phrase) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << phrase << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
  }
}

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
    opt.out_type = GgmlType::F32;
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
