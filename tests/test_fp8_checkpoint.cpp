// HF FP8 checkpoints (safetensors F8_E4M3 + weight_scale / weight_scale_inv): the llama_gqa fixture's
// matrices quantised here to FP8 with per-tensor, per-channel and block-wise scales (weight_block_size
// [16, 32]), loaded by ultra, against the same model with every FP8 matrix replaced by its dequantised f32
// values (decode(code) * scale, computed here): logits and greedy tokens; the GGUF conversion of the FP8
// checkpoint; clear errors for a missing or misshapen scale.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fp8.h"
#include "greedy_util.h"
#include "tmp_dir.h"
#include "ultra/convert.h"

using namespace ultra;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const fs::path kFixture = fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "hf" / "llama_gqa";

struct St {  // a safetensors file in memory: name -> (dtype, shape, bytes)
  struct T {
    std::string dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, T> t;

  static St read(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::vector<uint8_t> b((std::istreambuf_iterator<char>(f)), {});
    uint64_t n;
    std::memcpy(&n, b.data(), 8);
    const json h = json::parse(b.begin() + 8, b.begin() + 8 + (long)n);
    St s;
    for (const auto& [name, v] : h.items()) {
      if (name == "__metadata__") continue;
      const uint64_t o0 = v["data_offsets"][0], o1 = v["data_offsets"][1];
      s.t[name] = {v["dtype"], v["shape"].get<std::vector<int64_t>>(),
                   std::vector<uint8_t>(b.begin() + 8 + (long)(n + o0), b.begin() + 8 + (long)(n + o1))};
    }
    return s;
  }
  void write(const fs::path& p) const {
    json h = json::object();
    uint64_t at = 0;
    for (const auto& [name, v] : t) {
      h[name] = {{"dtype", v.dtype}, {"shape", v.shape}, {"data_offsets", {at, at + v.bytes.size()}}};
      at += v.bytes.size();
    }
    const std::string hs = h.dump();
    std::ofstream f(p, std::ios::binary);
    const uint64_t n = hs.size();
    f.write((const char*)&n, 8);
    f.write(hs.data(), (long)hs.size());
    for (const auto& [name, v] : t) f.write((const char*)v.bytes.data(), (long)v.bytes.size());
  }
};

template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

enum class Mode { PerTensor, PerChannel, PerChannelInv, Block };

// Writes the FP8 checkpoint to fp8_dir and its dequantised f32 twin to ref_dir.
void make_checkpoints(const fs::path& fp8_dir, const fs::path& ref_dir, bool break_scale = false) {
  const int64_t br = 16, bc = 32;
  St src = St::read(kFixture / "model.safetensors"), fp8 = src, ref = src;
  int k = 0;
  for (const auto& [name, t] : src.t) {
    if (!name.ends_with("proj.weight")) continue;
    const Mode mode = name.find("q_proj") != std::string::npos   ? Mode::PerTensor
                      : name.find("k_proj") != std::string::npos ? Mode::PerChannel
                      : name.find("v_proj") != std::string::npos ? Mode::PerChannelInv
                                                                 : Mode::Block;
    const int64_t rows = t.shape[0], cols = t.shape[1];
    std::vector<float> w(rows * cols);
    std::memcpy(w.data(), t.bytes.data(), t.bytes.size());
    const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
    auto block_of = [&](int64_t r, int64_t c) -> int64_t {
      switch (mode) {
        case Mode::PerTensor:
          return 0;
        case Mode::PerChannel:
        case Mode::PerChannelInv:
          return r;
        case Mode::Block:
          return (r / br) * sc + c / bc;
      }
      return 0;
    };
    const int64_t ns = mode == Mode::PerTensor ? 1 : mode == Mode::Block ? sr * sc : rows;
    std::vector<float> amax(ns, 0.0f), scale(ns);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        amax[block_of(r, c)] = std::max(amax[block_of(r, c)], std::fabs(w[r * cols + c]));
    for (int64_t i = 0; i < ns; ++i) scale[i] = amax[i] / 448.0f;
    std::vector<uint8_t> codes(rows * cols);
    std::vector<float> deq(rows * cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const float s = scale[block_of(r, c)];
        codes[r * cols + c] = fp32_to_fp8_e4m3(w[r * cols + c] / s);
        deq[r * cols + c] = fp8_e4m3_to_fp32(codes[r * cols + c]) * s;
      }
    fp8.t[name] = {"F8_E4M3", {rows, cols}, codes};
    std::vector<int64_t> sshape = mode == Mode::PerTensor    ? std::vector<int64_t>{}
                                  : mode == Mode::PerChannel ? std::vector<int64_t>{rows, 1}
                                  : mode == Mode::Block      ? std::vector<int64_t>{sr, sc}
                                                             : std::vector<int64_t>{rows};
    if (break_scale && mode == Mode::Block && k++ == 0) sshape = {sr + 1, sc}, scale.resize((sr + 1) * sc);
    fp8.t[name + (mode == Mode::PerChannelInv ? "_scale_inv" : "_scale")] = {"F32", sshape, bytes_of(scale)};
    if (mode == Mode::PerChannel)  // a static activation scale, as compressed-tensors writes: ignored
      fp8.t[name.substr(0, name.size() - 7) + ".input_scale"] = {
          "F32", {}, bytes_of(std::vector<float>{1.5f})};
    ref.t[name] = {"F32", {rows, cols}, bytes_of(deq)};
  }
  fs::create_directories(fp8_dir);
  fs::create_directories(ref_dir);
  json cfg = json::parse(std::ifstream(kFixture / "config.json"));
  std::ofstream(ref_dir / "config.json") << cfg.dump(2);
  cfg["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {br, bc}}};
  std::ofstream(fp8_dir / "config.json") << cfg.dump(2);
  fp8.write(fp8_dir / "model.safetensors");
  ref.write(ref_dir / "model.safetensors");
}

std::vector<float> logits_after(const std::string& path, const std::vector<int32_t>& prompt) {
  const Model model = Model::load(path);
  Context ctx(model, {.n_ctx = 64, .n_batch = 64});
  Batch b(64);
  b.add_sequence(prompt, 0, 0, Output::logits);
  ctx.step(b);
  const auto l = ctx.logits(b.size() - 1);
  return {l.begin(), l.end()};
}

}  // namespace

TEST(Fp8Checkpoint, LoadsAndMatchesItsDequantisedTwin) {
  test::TmpDir dir("ultra_fp8ck");
  const fs::path fp8 = dir.path() / "fp8", ref = dir.path() / "ref";
  make_checkpoints(fp8, ref);
  const std::vector<int32_t> prompt = {1, 17, 42, 99, 5, 250, 3, 77};
  const auto a = logits_after(fp8.string(), prompt), b = logits_after(ref.string(), prompt);
  ASSERT_EQ(a.size(), b.size());
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_diff = std::max(max_diff, (double)std::fabs(a[i] - b[i]));
    max_abs = std::max(max_abs, (double)std::fabs(b[i]));
  }
  EXPECT_LT(max_diff, 1e-4 * std::max(1.0, max_abs)) << "max |logit| " << max_abs;
  EXPECT_EQ(testing_util::greedy_tokens(fp8.string(), prompt, 16),
            testing_util::greedy_tokens(ref.string(), prompt, 16));
  // HF FP8 -> GGUF F32 (the dequantisation path with every scale layout)
  ConvertOptions opt;
  opt.out_type = "f32";
  const std::string gguf = dir.file("fp8-f32.gguf");
  convert_hf_to_gguf(fp8.string(), gguf, opt);
  EXPECT_EQ(testing_util::greedy_tokens(gguf, prompt, 16),
            testing_util::greedy_tokens(ref.string(), prompt, 16));
}

TEST(Fp8Checkpoint, MisshapenOrMissingScaleIsAClearError) {
  test::TmpDir dir("ultra_fp8ck");
  const fs::path fp8 = dir.path() / "fp8", ref = dir.path() / "ref";
  make_checkpoints(fp8, ref, /*break_scale=*/true);
  try {
    Model::load(fp8.string());
    FAIL() << "loaded a block scale of the wrong shape";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weight_block_size"), std::string::npos) << e.what();
  }
  St s = St::read(fp8 / "model.safetensors");
  s.t.erase("model.layers.0.self_attn.q_proj.weight_scale");
  s.write(fp8 / "model.safetensors");
  try {
    Model::load(fp8.string());
    FAIL() << "loaded an FP8 matrix without its scale";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no scale tensor"), std::string::npos) << e.what();
  }
}
