// The bundled GGUF files load in llama.cpp (the npm package node-llama-cpp, a prebuilt llama.cpp) and its
// greedy tokens for a fixed prompt equal ours; so do `ultra convert`'s files of every architecture of the HF
// fixtures, whose llama.cpp greedy tokens must equal HF transformers' (tests/fixtures/hf/*/reference.json).
// Runs when node and bench/node_modules/node-llama-cpp are installed (.ci/run installs them with `npm
// install` in bench/); skipped otherwise, saying so.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "greedy_util.h"
#include "io/convert.h"
#include "sanitized.h"
#include "tmp_dir.h"
#include "ultra/convert.h"

using namespace ultra;
namespace fs = std::filesystem;

namespace {

const fs::path kRoot = ULTRA_SOURCE_DIR;

bool have_node_llama_cpp() {
  return fs::exists(kRoot / "bench" / "node_modules" / "node-llama-cpp" / "package.json") &&
         std::system("node --version >/dev/null 2>&1") == 0;
}

// One generation for llama.cpp: greedy tokens of `model` after `prompt`.
struct PeerJob {
  fs::path model;
  std::vector<int32_t> prompt;
  int n;
};

// llama.cpp's greedy tokens for each job, from one node process (it starts in ~2 s; the generations are
// quick).
std::vector<std::vector<int32_t>> llamacpp_greedy(const std::vector<PeerJob>& jobs) {
  std::string cmd = "cd " + (kRoot / "bench").string() + " && node llamacpp_greedy.mjs";
  for (const PeerJob& j : jobs) {
    std::string ids;
    for (size_t i = 0; i < j.prompt.size(); ++i) ids += (i ? "," : "") + std::to_string(j.prompt[i]);
    cmd += " " + j.model.string() + " " + ids + " " + std::to_string(j.n);
  }
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return std::vector<std::vector<int32_t>>(jobs.size());
  std::string out;
  std::array<char, 4096> buf;
  size_t k;
  while ((k = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), k);
  EXPECT_EQ(pclose(p), 0) << out;
  std::vector<std::vector<int32_t>> r;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty()) r.push_back(nlohmann::json::parse(line)["generated_ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(r.size(), jobs.size()) << out;
  r.resize(jobs.size());
  return r;
}

TEST(LlamaCppPeer, BundledModelsGreedyTokensEqual) {
  if (!have_node_llama_cpp())
    GTEST_SKIP() << "node-llama-cpp is not installed (cd bench && npm install): llama.cpp comparison skipped";
  const std::vector<int32_t> prompt = {814, 26};  // "ROMEO:" in the bundled tokenizer
  const char* const names[] = {"target.gguf", "draft.gguf"};
  std::vector<PeerJob> jobs;
  for (const char* name : names) jobs.push_back({kRoot / "models" / name, prompt, 64});
  const auto all = llamacpp_greedy(jobs);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const auto ours = testing_util::greedy_tokens(jobs[i].model.string(), prompt, 64);
    const auto& theirs = all[i];
    std::printf("[llama.cpp] %s: %zu/%zu greedy tokens compared\n", names[i], theirs.size(), ours.size());
    EXPECT_EQ(ours, theirs) << names[i];
  }
}

// A byte-level BPE tokenizer.json of n_vocab tokens (the 256 bytes, then merges of two lowercase letters),
// for the fixtures, which have none: llama.cpp (through node-llama-cpp) needs a vocabulary to run a model.
nlohmann::json synthetic_tokenizer(int n_vocab) {
  // GPT-2's byte -> printable code point map
  std::vector<int> cps;
  for (int b = 0; b < 256; ++b)
    cps.push_back((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174 ? b : -1);
  for (int b = 0, n = 0; b < 256; ++b)
    if (cps[b] < 0) cps[b] = 256 + n++;
  auto utf8 = [](int cp) {
    std::string s;
    if (cp < 0x80) {
      s += (char)cp;
    } else {
      s += (char)(0xC0 | (cp >> 6));
      s += (char)(0x80 | (cp & 0x3F));
    }
    return s;
  };
  nlohmann::json vocab = nlohmann::json::object(), merges = nlohmann::json::array();
  for (int b = 0; b < 256; ++b) vocab[utf8(cps[b])] = b;
  for (int id = 256, k = 0; id < n_vocab; ++id, ++k) {
    const std::string a(1, (char)('a' + k / 26 % 26)), c(1, (char)('a' + k % 26));
    vocab[a + c] = id;
    merges.push_back(a + " " + c);
  }
  return {{"version", "1.0"},
          {"added_tokens", nlohmann::json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
          {"post_processor", nullptr},
          {"decoder",
           {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
}

// HF checkpoint (+ a synthetic tokenizer) -> `ultra convert` (F32) -> llama.cpp: the greedy continuation of
// the fixture's prompt is HF's (every fixture was made with a top-2 logit margin of at least ~0.08, far above
// F32 rounding).
void expect_llamacpp_matches_hf(const std::vector<const char*>& archs) {
  const fs::path tmp = fs::temp_directory_path() / ("ultra_llamacpp_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  int n_models = 0;
  std::vector<PeerJob> jobs;
  std::vector<std::vector<int32_t>> wants;
  for (const char* arch : archs) {
    const fs::path dir = kRoot / "tests" / "fixtures" / "hf" / arch;
    std::ifstream f(dir / "reference.json");
    const auto ref = nlohmann::json::parse(f);
    const auto prompt = ref["prompt"].get<std::vector<int32_t>>();
    const auto want = ref["greedy"].get<std::vector<int32_t>>();
    // (a neutral directory name: it becomes general.name, from which llama.cpp infers per-model token rules)
    const fs::path hf = tmp / ("model_" + std::to_string(++n_models)),
                   gguf = tmp / (std::string(arch) + ".gguf");
    fs::create_directories(hf);
    for (const char* name : {"config.json", "model.safetensors"}) fs::copy_file(dir / name, hf / name);
    std::ofstream(hf / "tokenizer.json") << synthetic_tokenizer(ref["n_vocab"].get<int>()).dump();
    ConvertOptions opt;
    opt.out_type = "f32";
    convert_hf_to_gguf(hf.string(), gguf.string(), opt);
    jobs.push_back({gguf, prompt, (int)want.size()});
    wants.push_back(want);
  }
  const auto all = llamacpp_greedy(jobs);
  for (size_t i = 0; i < jobs.size(); ++i) {
    std::printf("[llama.cpp] %s: %zu/%zu greedy tokens compared with HF transformers\n", archs[i],
                all[i].size(), wants[i].size());
    EXPECT_EQ(all[i], wants[i]) << archs[i] << ": llama.cpp's greedy tokens on ultra convert's F32 file";
  }
  fs::remove_all(tmp);
}

TEST(LlamaCppPeer, ConvertedArchitecturesMatchHf) {
  if (!have_node_llama_cpp())
    GTEST_SKIP() << "node-llama-cpp is not installed (cd bench && npm install): llama.cpp comparison skipped";
  expect_llamacpp_matches_hf({"llama_gqa", "llama_tied_rope3", "mistral", "qwen2_bias", "qwen3", "gemma3",
                              "phi3_long", "qwen3_moe"});
}

// Known to differ (2026-12-01, the llama.cpp of node-llama-cpp's prebuilt binaries, source of 2026-09-28):
//  * Gemma 2: the fixture's query_pre_attn_scalar is 24 with head_dim 16; llama.cpp ignores that key (and our
//    gemma2.attention.scale) and scales queries by 1/sqrt(head_dim), or 1/sqrt(dim / heads) for the 27B,
//    which is right for the released Gemma 2 models (query_pre_attn_scalar = head_dim for 2B / 9B, dim /
//    heads for 27B) but not for this fixture: llama.cpp repeats token 204 where HF continues 204, 156, 156,
//    ...
//  * Phi-3 with short factors: llama.cpp pads every context to a multiple of 256 positions and picks the long
//    factors when that exceeds the original context, which this fixture sets at 64; HF (and ultra, given a
//    64-position context) use the short ones, so every token differs. (phi3_long, which HF runs with the
//    long factors, matches above.)
//  * Mixtral and Qwen2-MoE (2026-12-06): llama.cpp loads the converted files and follows HF's greedy
//    tokens for 4 (Mixtral) and 12 (Qwen2-MoE) tokens, then departs (Qwen3-MoE: 32 of 32, above). ultra on
//    the same files stays within 1e-5 of HF's logits on every position (test_moe, test_model_fixtures). The
//    tiny random routers (4 experts, 2 used) have near ties: where Mixtral departs, layer 1's 2nd and 3rd
//    experts are 8.5e-4 apart in probability (ultra's router, measured), within what llama.cpp's F16 KV
//    cache (its default) moves; a flipped expert in a 64-wide model moves the logits past their margin.
// ultra reads these same files to HF's logits within 1e-4 (test_model_fixtures). Run with
// --gtest_also_run_disabled_tests.
TEST(LlamaCppPeer, DISABLED_ConvertedGemma2AndPhi3MatchHf) {
  if (!have_node_llama_cpp())
    GTEST_SKIP() << "node-llama-cpp is not installed (cd bench && npm install): llama.cpp comparison skipped";
  expect_llamacpp_matches_hf({"gemma2", "phi3_short", "mixtral", "qwen2_moe"});
}

// Our logits after `tokens` (one prefill step).
std::vector<float> our_logits(const std::string& model_path, const std::vector<int32_t>& tokens) {
  const Model model = Model::load(model_path);
  Context ctx(model, {.n_ctx = 256, .n_batch = 256});
  Batch b(256);
  b.add_sequence(tokens, 0, 0, Output::logits);
  ctx.step(b);
  const auto l = ctx.logits(b.size() - 1);
  return {l.begin(), l.end()};
}

// Files written by `ultra quantize` in llama.cpp's types (TQ2_0, TQ1_0 with their Q8_0 fallback for rows of
// 384, Q8_0, and the mixes Q4_K_M, Q6_K, Q4_0, IQ4_XS) load in llama.cpp and decode to our greedy tokens, up
// to a near tie: llama.cpp's CPU dot products quantise the activations (Q8_0 / Q8_K) where ours keep them in
// f32, so a pair of logits within a hundredth can order differently (measured: Q8_0 diverged at token 46 of
// 64 on a gap of 0.0004, TQ2_0 and TQ1_0 at token 63 on 0.0104, Q6_K at token 46 on 0.0036; Q4_K_M, Q4_0
// and IQ4_XS gave 64 of 64). The test asks for at least 32 equal tokens, and at the first
// difference (if any) for llama.cpp's token to be within 0.05 of our best logit (logits here are ~8-10).
TEST(LlamaCppPeer, QuantizedFilesGreedyTokensEqualUpToNearTies) {
  if (!have_node_llama_cpp())
    GTEST_SKIP() << "node-llama-cpp is not installed (cd bench && npm install): llama.cpp comparison skipped";
  const std::vector<int32_t> prompt = {814, 26};
  test::TmpDir dir("ultra_peer");
  const char* const types[] = {"tq2_0", "tq1_0", "q8_0", "q4_k_m", "q6_k", "q4_0", "iq4_xs"};
  // Under AddressSanitizer a sample of the types (every kernel is also checked there by test_backend_ops).
  std::vector<const char*> run;
  std::vector<PeerJob> jobs;
  for (size_t i = 0; i < std::size(types); i += test::kSanitized ? 3 : 1) {
    const std::string out = dir.file(std::string("target-") + types[i] + ".gguf");
    ConvertOptions opt;
    opt.out_type = types[i];
    quantize_model((kRoot / "models" / "target.gguf").string(), out, opt);
    run.push_back(types[i]);
    jobs.push_back({out, prompt, 64});
  }
  const auto all = llamacpp_greedy(jobs);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const char* type = run[i];
    SCOPED_TRACE(type);
    const std::string out = jobs[i].model.string();
    const auto ours = testing_util::greedy_tokens(out, prompt, 64);
    const auto& theirs = all[i];
    ASSERT_EQ(ours.size(), 64u);
    ASSERT_EQ(theirs.size(), 64u);
    size_t k = 0;
    while (k < ours.size() && ours[k] == theirs[k]) ++k;
    std::printf("[llama.cpp] target %s: %zu of 64 greedy tokens equal\n", type, k);
    EXPECT_GE(k, 32u);
    if (k == ours.size()) continue;
    std::vector<int32_t> ctx = prompt;
    ctx.insert(ctx.end(), ours.begin(), ours.begin() + (long)k);
    const auto l = our_logits(out, ctx);
    const float gap = l[ours[k]] - l[theirs[k]];
    std::printf("[llama.cpp]   at token %zu: ours %d, llama.cpp %d, logit gap %.5f\n", k, ours[k], theirs[k],
                gap);
    EXPECT_GE(gap, 0.0f);
    EXPECT_LT(gap, 0.05f) << "llama.cpp chose a token well below our best";
  }
}

}  // namespace
