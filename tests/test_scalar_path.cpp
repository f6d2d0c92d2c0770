// The scalar kernels (the path of CPUs without AVX2, forced here with ULTRA_NO_SIMD=1) against HF
// transformers: the fixture models (tests/fixtures/hf, tools/make_fixtures.py) run through a forward pass
// written here from the public kernels of ops.h only (rmsnorm, matmul, rope, kv_write, attention,
// silu_mul, dequant_row), and their logits are compared with the reference logits of every prompt position
// (logits_f32.bin: [n_prompt, n_vocab] float32 of reference.json's prompt), in one batch (prefill) and token
// by token (decode). The bound is the fixture suite's: max |ours - HF| < 1e-4 (the scalar kernels
// accumulate in double, so they are if anything closer). A second test checks, op by op, that the public
// kernels really run the scalar references in this mode.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "io/convert.h"
#include "model/model.h"
#include "tmp_dir.h"

using namespace ultra;
namespace fs = std::filesystem;

namespace {

// Set before any kernel runs (the instruction set is chosen once, at the first kernel call).
const bool kScalarForced = [] { return setenv("ULTRA_NO_SIMD", "1", 1) == 0; }();

const fs::path kRoot = fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "hf";

std::vector<float> read_floats(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  EXPECT_TRUE(f.good()) << p;
  f.seekg(0, std::ios::end);
  std::vector<float> v((size_t)f.tellg() / 4);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), (std::streamsize)(v.size() * 4));
  return v;
}

// A forward pass over the model with an F32 KV cache of one slot, written from ops.h alone.
class Forward {
 public:
  Forward(const ModelData& m, int max_ctx, int max_batch)
      : m_(m), hp_(m.hp), pool_(2), max_ctx_(max_ctx), max_batch_(max_batch) {
    const size_t kv_elems = (size_t)hp_.n_kv_heads * max_ctx * hp_.head_dim;
    k_cache_.assign(hp_.n_layers, std::vector<float>(kv_elems));
    v_cache_.assign(hp_.n_layers, std::vector<float>(kv_elems));
    const size_t q_dim = (size_t)hp_.n_heads * hp_.head_dim, kv_dim = (size_t)hp_.n_kv_heads * hp_.head_dim;
    x_.resize(max_batch * (size_t)hp_.dim);
    xb_.resize(max_batch * std::max<size_t>(hp_.dim, q_dim));
    q_.resize(max_batch * q_dim);
    k_.resize(max_batch * kv_dim);
    v_.resize(max_batch * kv_dim);
    att_.resize(max_batch * q_dim);
    hb_.resize(max_batch * (size_t)hp_.ffn_dim);
    hb2_.resize(max_batch * (size_t)hp_.ffn_dim);
    logits_.resize(max_batch * (size_t)hp_.n_vocab);
    scratch_.resize(cpu::attention_scratch_floats(max_ctx, pool_.size()));
  }

  // Tokens at positions pos0, pos0+1, ...; returns their logits [n, n_vocab].
  const std::vector<float>& step(const int32_t* tokens, int n, int pos0) {
    const int dim = hp_.dim;
    std::vector<int32_t> pos(n), slot(n, 0);
    for (int t = 0; t < n; ++t) pos[t] = pos0 + t;
    for (int t = 0; t < n; ++t) cpu::dequant_row(m_.tok_embd, tokens[t], x_.data() + (size_t)t * dim);
    const float scale = 1.0f / std::sqrt((float)hp_.head_dim);
    for (int il = 0; il < hp_.n_layers; ++il) {
      const LayerWeights& l = m_.layers[il];
      const KvLayerView kv{GgmlType::F32, k_cache_[il].data(), v_cache_[il].data(), 1, hp_.n_kv_heads,
                           max_ctx_,      hp_.head_dim};
      cpu::rmsnorm(x_.data(), l.attn_norm, n, dim, hp_.rms_eps, xb_.data());
      cpu::matmul(pool_, l.wq, xb_.data(), n, q_.data(), l.bq, nullptr);
      cpu::matmul(pool_, l.wk, xb_.data(), n, k_.data(), l.bk, nullptr);
      cpu::matmul(pool_, l.wv, xb_.data(), n, v_.data(), l.bv, nullptr);
      cpu::rope(q_.data(), n, hp_.n_heads, hp_.head_dim, pos.data(), m_.rope_inv_freq.data(),
                hp_.rope_interleaved);
      cpu::rope(k_.data(), n, hp_.n_kv_heads, hp_.head_dim, pos.data(), m_.rope_inv_freq.data(),
                hp_.rope_interleaved);
      cpu::kv_write(kv, k_.data(), v_.data(), n, pos.data(), slot.data());
      cpu::attention(pool_, kv, q_.data(), n, hp_.n_heads, pos.data(), slot.data(), scale, att_.data(),
                     scratch_.data());
      cpu::matmul(pool_, l.wo, att_.data(), n, xb_.data(), nullptr, nullptr);
      for (size_t i = 0; i < (size_t)n * dim; ++i) x_[i] += xb_[i];
      cpu::rmsnorm(x_.data(), l.ffn_norm, n, dim, hp_.rms_eps, xb_.data());
      cpu::matmul(pool_, l.w_gate, xb_.data(), n, hb_.data(), nullptr, nullptr);
      cpu::matmul(pool_, l.w_up, xb_.data(), n, hb2_.data(), nullptr, nullptr);
      cpu::silu_mul(hb_.data(), hb2_.data(), (int64_t)n * hp_.ffn_dim, hb2_.data());
      cpu::matmul(pool_, l.w_down, hb2_.data(), n, xb_.data(), nullptr, nullptr);
      for (size_t i = 0; i < (size_t)n * dim; ++i) x_[i] += xb_[i];
    }
    cpu::rmsnorm(x_.data(), m_.output_norm, n, dim, hp_.rms_eps, xb_.data());
    cpu::matmul(pool_, m_.output, xb_.data(), n, logits_.data(), nullptr, nullptr);
    return logits_;
  }

 private:
  const ModelData& m_;
  const HParams& hp_;
  ThreadPool pool_;
  int max_ctx_, max_batch_;
  std::vector<std::vector<float>> k_cache_, v_cache_;
  std::vector<float> x_, xb_, q_, k_, v_, att_, hb_, hb2_, logits_, scratch_;
};

struct Errors {
  double prefill = 0, decode = 0;
};

// Max |ours - want| over every prompt position, in one batch and token by token.
Errors run(const std::string& model_path, const fs::path& fixture, const std::string& logits_file) {
  std::ifstream rf(fixture / "reference.json");
  const nlohmann::json ref = nlohmann::json::parse(rf);
  const auto prompt = ref["prompt"].get<std::vector<int32_t>>();
  const int n = (int)prompt.size(), V = ref["n_vocab"].get<int>();
  const std::vector<float> want = read_floats(fixture / logits_file);
  EXPECT_EQ(want.size(), (size_t)n * V);
  const auto m = load_model(model_path);
  EXPECT_EQ(m->hp.n_vocab, V);
  Errors e;
  {
    Forward f(*m, 64, n);
    const std::vector<float>& got = f.step(prompt.data(), n, 0);
    for (size_t i = 0; i < (size_t)n * V; ++i)
      e.prefill = std::max(e.prefill, (double)std::fabs(got[i] - want[i]));
  }
  {
    Forward f(*m, 64, 1);
    for (int t = 0; t < n; ++t) {
      const std::vector<float>& got = f.step(&prompt[t], 1, t);
      for (int v = 0; v < V; ++v)
        e.decode = std::max(e.decode, (double)std::fabs(got[v] - want[(size_t)t * V + v]));
    }
  }
  return e;
}

TEST(ScalarPath, KernelsRunScalar) {
  ASSERT_TRUE(kScalarForced);
  EXPECT_STREQ(cpu::kernel_isa(), "scalar");
}

// The safetensors fixtures (F32 and BF16 weights) and converted GGUF files (F16 and Q8_0 matrices, Q/K
// permuted for interleaved RoPE in arch llama) against HF.
TEST(ScalarPath, FixtureLogitsMatchHf) {
  ASSERT_TRUE(kScalarForced);
  const test::TmpDir tmp("ultra_scalar");
  for (const char* name : {"llama_gqa", "llama_gqa_bf16", "llama_tied_rope3", "qwen2_bias", "mistral"}) {
    const Errors e = run((kRoot / name).string(), kRoot / name, "logits_f32.bin");
    std::printf("[scalar] %-18s safetensors   prefill max-abs %.2e  decode max-abs %.2e\n", name, e.prefill,
                e.decode);
    EXPECT_LT(e.prefill, 1e-4) << name;
    EXPECT_LT(e.decode, 1e-4) << name;
    EXPECT_GT(e.prefill, 0) << name << ": suspiciously exact";
  }
  for (const char* name : {"llama_gqa", "qwen2_bias"}) {
    for (const auto& [type, file] :
         {std::pair{GgmlType::F16, "logits_f16w.bin"}, {GgmlType::Q8_0, "logits_q8_0w.bin"}}) {
      const std::string out = tmp.file(std::string(name) + ".gguf");
      ConvertOptions opt;
      opt.out_type = std::string(type_name(type));
      convert_hf_to_gguf((kRoot / name).string(), out, opt);
      const Errors e = run(out, kRoot / name, file);
      std::printf("[scalar] %-18s gguf %-8s prefill max-abs %.2e  decode max-abs %.2e\n", name,
                  std::string(type_name(type)).c_str(), e.prefill, e.decode);
      EXPECT_LT(e.prefill, 1e-4) << name << " " << type_name(type);
      EXPECT_LT(e.decode, 1e-4) << name << " " << type_name(type);
    }
  }
}

// In this mode each public kernel gives its reference's result exactly (they are the same code), or for
// attention (float scores, double sums) within 1e-6 of it.
TEST(ScalarPath, PublicKernelsAreTheReferences) {
  ASSERT_TRUE(kScalarForced);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto randn = [&](size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
  };
  ThreadPool pool(3);
  const int rows = 37, cols = 96, nt = 5;
  const auto wf = randn((size_t)rows * cols), x = randn((size_t)nt * cols), bias = randn(rows);
  std::vector<uint16_t> wh(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) wh[i] = fp32_to_fp16(wf[i]);
  for (const WeightView& w : {WeightView{GgmlType::F32, wf.data(), rows, cols, (size_t)cols * 4},
                              WeightView{GgmlType::F16, wh.data(), rows, cols, (size_t)cols * 2}}) {
    std::vector<float> y(rows * nt), ref(rows * nt);
    cpu::matmul(pool, w, x.data(), nt, y.data(), bias.data(), nullptr);
    cpu::matmul_ref(w, x.data(), nt, ref.data(), bias.data());
    EXPECT_EQ(y, ref) << type_name(w.type);
    std::vector<float> row(cols);
    cpu::dequant_row(w, 3, row.data());
    for (int c = 0; c < cols; ++c)
      ASSERT_EQ(row[c], w.type == GgmlType::F32 ? wf[3 * cols + c] : fp16_to_fp32(wh[3 * cols + c]));
  }
  const auto g = randn(1000), u = randn(1000), nw = randn(cols);
  std::vector<float> a(1000), b(1000);
  cpu::silu_mul(g.data(), u.data(), 1000, a.data());
  cpu::silu_mul_ref(g.data(), u.data(), 1000, b.data());
  EXPECT_EQ(a, b);
  std::vector<float> n1(nt * cols), n2(nt * cols);
  cpu::rmsnorm(x.data(), nw.data(), nt, cols, 1e-5f, n1.data());
  cpu::rmsnorm_ref(x.data(), nw.data(), nt, cols, 1e-5f, n2.data());
  EXPECT_EQ(n1, n2);
  // kv_write (F16 cache: fp32_to_fp16) and attention against attention_ref.
  const int n_kv = 2, n_heads = 4, hd = 20, max_ctx = 40;
  std::vector<uint16_t> kc((size_t)n_kv * max_ctx * hd), vc(kc.size());
  const KvLayerView kv{GgmlType::F16, kc.data(), vc.data(), 1, n_kv, max_ctx, hd};
  const int n_tok = 30;
  const auto k = randn((size_t)n_tok * n_kv * hd), v = randn((size_t)n_tok * n_kv * hd),
             q = randn((size_t)n_tok * n_heads * hd);
  std::vector<int32_t> pos(n_tok), slot(n_tok, 0);
  for (int t = 0; t < n_tok; ++t) pos[t] = t;
  cpu::kv_write(kv, k.data(), v.data(), n_tok, pos.data(), slot.data());
  for (int t = 0; t < n_tok; ++t)
    for (int h = 0; h < n_kv; ++h)
      for (int i = 0; i < hd; ++i)
        ASSERT_EQ(kc[((size_t)h * max_ctx + t) * hd + i], fp32_to_fp16(k[((size_t)t * n_kv + h) * hd + i]));
  std::vector<float> o1(q.size()), o2(q.size()), scratch(cpu::attention_scratch_floats(max_ctx, pool.size()));
  cpu::attention(pool, kv, q.data(), n_tok, n_heads, pos.data(), slot.data(), 0.2f, o1.data(),
                 scratch.data());
  cpu::attention_ref(kv, q.data(), n_tok, n_heads, pos.data(), slot.data(), 0.2f, o2.data());
  for (size_t i = 0; i < o1.size(); ++i) ASSERT_NEAR(o1[i], o2[i], 1e-6) << i;
}

}  // namespace
