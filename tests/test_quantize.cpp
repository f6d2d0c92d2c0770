// `ultra quantize` (quantize_model): the bundled target to every low-bit type, loaded and run: greedy
// generation, and perplexity on the held-out text finite, within 3% of the F16 file's for FP8 and Q8_0
// (measured over these 6 windows: +0.14% / +0.04%), within 1% for llama.cpp's Q4_K_M / Q6_K mixes (+0.35% /
// +0.06%) and 2% for Q4_0 / IQ4_XS (+0.47% / -0.16%); TQ1_0 / TQ2_0 written where the row length allows it
// and Q8_0 elsewhere (llama.cpp's fallback); an HF directory as input; clear errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "greedy_util.h"
#include "io/gguf.h"
#include "run_ultra.h"
#include "sanitized.h"
#include "tmp_dir.h"
#include "ultra/convert.h"
#include "ultra/perplexity.h"

using namespace ultra;
namespace fs = std::filesystem;

namespace {

const fs::path kRoot = ULTRA_SOURCE_DIR;
// Under AddressSanitizer perplexity runs ~15x slower: one window exercises the same code for memory
// errors, and the bounds are checked in the normal build.
using test::kSanitized;
const std::string kTarget = (kRoot / "models" / "target.gguf").string();

std::vector<int32_t> val_ids() {
  std::ifstream f(kRoot / "tests" / "fixtures" / "bundled" / "val_ids.txt");
  std::vector<int32_t> ids;
  int32_t x;
  while (f >> x) ids.push_back(x);
  return ids;
}

// Perplexity over the first 6 windows of 256 tokens of the held-out text (all positions).
double ppl(const std::string& path) {
  const Model m = Model::load(path);
  Context s(m, {.n_ctx = 256, .n_batch = 256, .n_outputs = 256});
  PerplexityParams pp;
  pp.n_window = 256;
  pp.mode = PerplexityParams::Mode::AllPositions;
  pp.max_windows = kSanitized ? 1 : 6;
  return perplexity(s, val_ids(), pp).ppl;
}

// The bundled target's quantised files, made once per test program and read by several tests (quantize_model
// is deterministic: a second run writes the same bytes). Removed at exit.
const test::TmpDir& target_files() {
  static const test::TmpDir dir("ultra_quantize_target");
  return dir;
}

// `in` quantised to `type` in `dir`; the bundled target's files in target_files(), each quantised once (the
// progress checks below run on that one run).
std::string quantize(const test::TmpDir& dir, const std::string& in, const std::string& type,
                     bool keep_embeddings = false, bool per_row = false) {
  const std::string out = (in == kTarget ? target_files() : dir)
                              .file(fs::path(in).stem().string() + "-" + type +
                                    (keep_embeddings ? "-ke" : "") + (per_row ? "-row" : "") + ".gguf");
  if (in == kTarget && fs::exists(out)) return out;
  ConvertOptions opt;
  opt.out_type = type;
  opt.keep_embeddings = keep_embeddings;
  opt.ternary_per_row = per_row;
  int last_done = 0, total = 0;
  opt.progress = [&](int done, int n, const std::string&) {
    EXPECT_EQ(done, last_done + 1);
    last_done = done;
    total = n;
  };
  const int n = quantize_model(in, out, opt);
  EXPECT_EQ(n, total);
  EXPECT_EQ(last_done, total);
  return out;
}

GgmlType tensor_type(const gguf::Reader& r, const std::string& name) {
  const auto* t = r.find_tensor(name);
  EXPECT_NE(t, nullptr) << name;
  return t ? t->type : GgmlType::F32;
}

}  // namespace

TEST(Quantize, EveryTypeLoadsGeneratesAndKeepsPerplexity) {
  test::TmpDir dir("ultra_quantize");
  const double base = ppl(kTarget);
  ASSERT_TRUE(std::isfinite(base));
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  struct Case {
    std::string type;
    GgmlType q, ffn_down;  // attn_q (384 columns) and ffn_down (1024)
    double max_rel;        // perplexity bound relative to F16 (0: finite only)
  };
  for (const Case& c :
       {Case{"fp8", GgmlType::F8_E4M3, GgmlType::F8_E4M3, 0.03},
        Case{"q8_0", GgmlType::Q8_0, GgmlType::Q8_0, 0.03},
        Case{"ternary", GgmlType::TERNARY, GgmlType::TERNARY, 0},
        Case{"tq2_0", GgmlType::Q8_0, GgmlType::TQ2_0, 0}, Case{"tq1_0", GgmlType::Q8_0, GgmlType::TQ1_0, 0},
        // llama.cpp's mixes (test_quantize_mix holds their bytes against llama-quantize's)
        Case{"q4_k_m", GgmlType::Q5_0, GgmlType::Q6_K, 0.01},
        Case{"q6_k", GgmlType::Q8_0, GgmlType::Q6_K, 0.01},
        Case{"q4_0", GgmlType::Q4_0, GgmlType::Q4_0, 0.02},
        Case{"iq4_xs", GgmlType::IQ4_NL, GgmlType::IQ4_XS, 0.02}}) {
    SCOPED_TRACE(c.type);
    const std::string out = quantize(dir, kTarget, c.type);
    {
      const gguf::Reader r = gguf::Reader::open(out);
      EXPECT_EQ(tensor_type(r, "blk.0.attn_q.weight"), c.q);
      EXPECT_EQ(tensor_type(r, "blk.3.ffn_down.weight"), c.ffn_down);
      EXPECT_EQ(tensor_type(r, "output_norm.weight"), GgmlType::F32);
      EXPECT_EQ(r.get_string("tokenizer.ggml.model"), "gpt2");  // metadata copied
      if (c.type == "fp8") {
        const auto* s = r.find_tensor("blk.0.attn_q.scale");
        ASSERT_NE(s, nullptr);
        EXPECT_EQ(s->ne, std::vector<uint64_t>{384});
      }
      if (c.type == "ternary") {
        const auto* s = r.find_tensor("blk.0.ffn_up.scale");
        ASSERT_NE(s, nullptr);
        EXPECT_EQ(s->ne, std::vector<uint64_t>{1});  // one per tensor by default
      }
    }
    const auto toks = testing_util::greedy_tokens(out, prompt, 12);
    ASSERT_EQ(toks.size(), 12u);
    for (int32_t t : toks) EXPECT_TRUE(t >= 0 && t < 4096) << t;
    const double p = ppl(out);
    EXPECT_TRUE(std::isfinite(p)) << p;
    if (c.max_rel > 0 && !kSanitized) {
      EXPECT_LE(std::fabs(p - base) / base, c.max_rel) << "ppl " << p << " vs F16 " << base;
    }
    std::printf("[ quantize ] %-8s ppl %.3f (F16 %.3f), file %.2f MiB\n", c.type.c_str(), p, base,
                (double)fs::file_size(out) / (1 << 20));
  }
}

// The files ultra writes for llama.cpp's mixes are byte for byte llama-quantize's (test_quantize_mix); on
// them `ultra perplexity` (llama-perplexity's mode: -c 256, the first 6 windows of the held-out text, second
// halves scored) must equal what llama.cpp's llama-perplexity printed for the same file within 0.5%.
// llama.cpp's figures, from the native build of the bundle (de3ff815): llama-perplexity -m FILE -f
// tests/fixtures/bundled/val.txt -c 256 --chunks 6. ultra's were 29.3400, 29.2233, 29.2067, 29.0913 when
// recorded (the exact path, which the tests pin: tests/pin_exact_numerics.cpp; llama.cpp quantises the
// activations to int8).
TEST(Quantize, MixesGiveLlamaCppsPerplexity) {
  test::TmpDir dir("ultra_quantize_ppl");
  const std::string val = (kRoot / "tests" / "fixtures" / "bundled" / "val.txt").string();
  struct Case {
    const char* type;
    double llama_ppl;
  };
  for (const Case& c :
       {Case{"q4_k_m", 29.3264}, Case{"q6_k", 29.2343}, Case{"q4_0", 29.2010}, Case{"iq4_xs", 29.0884}}) {
    SCOPED_TRACE(c.type);
    const std::string out = quantize(dir, kTarget, c.type);
    const auto r = test::run_ultra({"perplexity", "-m", out, "-f", val, "-c", "256", "--chunks",
                                    kSanitized ? "1" : "6", "-t", "2", "--json"});
    ASSERT_EQ(r.status, 0) << r.err;
    const double p = nlohmann::json::parse(r.out).at("ppl").get<double>();
    ASSERT_TRUE(std::isfinite(p));
    if (!kSanitized)
      EXPECT_LE(std::fabs(p / c.llama_ppl - 1), 0.005) << "ultra " << p << ", llama.cpp " << c.llama_ppl;
    std::printf("[ quantize ] %-7s ultra perplexity %.4f, llama-perplexity %.4f (%+.3f%%)\n", c.type, p,
                c.llama_ppl, 100 * (p / c.llama_ppl - 1));
  }
}

TEST(Quantize, TernaryFileIsSmallAndOptionsApply) {
  test::TmpDir dir("ultra_quantize");
  const std::string t = quantize(dir, kTarget, "ternary");
  EXPECT_LT(fs::file_size(t), fs::file_size(kTarget) / 6);  // 2 bits vs 16 per weight, plus F32 norms
  const std::string row = quantize(dir, kTarget, "ternary", /*keep_embeddings=*/true, /*per_row=*/true);
  const gguf::Reader r = gguf::Reader::open(row);
  EXPECT_EQ(tensor_type(r, "token_embd.weight"), GgmlType::F16);  // kept as in the input
  EXPECT_EQ(r.find_tensor("token_embd.scale"), nullptr);
  const auto* s = r.find_tensor("blk.0.ffn_up.scale");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->ne, std::vector<uint64_t>{1024});  // one per output row
  EXPECT_TRUE(std::isfinite(ppl(row)));
  // a quantized file can be the input (its scales are read, and rewritten)
  const std::string q8 = quantize(dir, row, "q8_0");
  const gguf::Reader r8 = gguf::Reader::open(q8);
  EXPECT_EQ(tensor_type(r8, "blk.0.ffn_up.weight"), GgmlType::Q8_0);
  EXPECT_EQ(r8.find_tensor("blk.0.ffn_up.scale"), nullptr);
  EXPECT_TRUE(std::isfinite(ppl(q8)));
}

TEST(Quantize, FromHfDirectory) {
  test::TmpDir dir("ultra_quantize");
  const std::string hf = (kRoot / "tests" / "fixtures" / "hf" / "llama_gqa").string();
  for (const char* type : {"fp8", "ternary", "q4_k_m"}) {  // q4_k_m: through a temporary F32 GGUF
    const std::string out = dir.file(std::string("hf-") + type + ".gguf");
    ConvertOptions opt;
    opt.out_type = type;
    quantize_model(hf, out, opt);
    const Model m = Model::load(out);
    Context ctx(m, {.n_ctx = 32});
    const auto toks = testing_util::greedy_tokens(ctx, {1, 2, 3}, 4);
    EXPECT_EQ(toks.size(), 4u);
  }
  for (const auto& e : fs::directory_iterator(dir.path()))  // no temporary F32 file left
    EXPECT_FALSE(e.path().string().ends_with("-tmp.gguf")) << e.path();
}

TEST(Quantize, ClearErrors) {
  test::TmpDir dir("ultra_quantize");
  ConvertOptions opt;
  opt.out_type = "q4_q";
  try {
    quantize_model(kTarget, dir.file("x.gguf"), opt);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown output type 'q4_q'"), std::string::npos) << e.what();
  }
  opt.out_type = "fp8";
  try {
    quantize_model(dir.file("missing.gguf"), dir.file("x.gguf"), opt);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.gguf"), std::string::npos) << e.what();
  }
  EXPECT_THROW(quantize_model(kTarget, kTarget, opt), Error);  // the output is the input
  EXPECT_FALSE(fs::exists(dir.file("x.gguf")));
}
