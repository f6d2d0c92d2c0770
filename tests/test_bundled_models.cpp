// The bundled models (models/target.gguf, models/draft.gguf: F16 GGUF converted by `ultra convert` from the
// checkpoints tools/train_tiny.py trained) against the PyTorch numbers recorded at training time in
// models/train_report.json: validation perplexity within 0.5% (in fact it agrees to ~1e-5), ultra's tokenizer
// reproducing the Python tokenizer's validation ids, and the greedy continuation of "ROMEO:" token for token.
// The report's "f16w" entries were computed in float32 with the weight matrices rounded to F16, i.e. exactly
// the weights in the GGUF files; the plain float32 numbers are checked too.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "greedy_util.h"
#include "sanitized.h"
#include "ultra/perplexity.h"

using namespace ultra;
namespace fs = std::filesystem;

namespace {

const fs::path kRoot = ULTRA_SOURCE_DIR;

// Under AddressSanitizer the whole validation set takes minutes; a few windows exercise the same code for
// memory errors, and the numeric comparison runs in the normal build.
using test::kSanitized;

nlohmann::json report() {
  std::ifstream f(kRoot / "models" / "train_report.json");
  return nlohmann::json::parse(f);
}

std::vector<int32_t> val_ids() {
  std::ifstream f(kRoot / "tests" / "fixtures" / "bundled" / "val_ids.txt");
  std::vector<int32_t> ids;
  int32_t x;
  while (f >> x) ids.push_back(x);
  return ids;
}

class Bundled : public ::testing::TestWithParam<std::string> {};

TEST_P(Bundled, ValidationPerplexityMatchesPyTorch) {
  const std::string name = GetParam();
  const auto rep = report()[name];
  const Model m = Model::load((kRoot / "models" / (name + ".gguf")).string());
  Context s(m, {.n_ctx = 256, .n_batch = 256, .n_outputs = 256});
  const auto ids = val_ids();
  ASSERT_EQ(ids.size(), (size_t)38426);
  PerplexityParams pp;
  pp.n_window = 256;
  pp.mode = PerplexityParams::Mode::AllPositions;
  if (kSanitized) {
    pp.max_windows = 3;
    const PerplexityResult r = perplexity(s, ids, pp);
    EXPECT_TRUE(std::isfinite(r.ppl) && r.ppl > 1);
    GTEST_SKIP()
        << "sanitizer build: 3 windows run for memory checking; the PyTorch comparison runs unsanitized";
  }
  const PerplexityResult all = perplexity(s, ids, pp);
  pp.mode = PerplexityParams::Mode::SecondHalf;
  const PerplexityResult half = perplexity(s, ids, pp);
  const double want_f16 = rep["f16w"]["ppl"].get<double>(), want_f32 = rep["val"]["ppl"].get<double>();
  const double want_half = rep["f16w"]["second_half_ppl"].get<double>();
  std::printf("[bundled] %-6s ppl all positions: ultra %.4f, PyTorch F16 weights %.4f, PyTorch F32 %.4f\n",
              name.c_str(), all.ppl, want_f16, want_f32);
  std::printf("[bundled] %-6s ppl second half:   ultra %.4f, PyTorch F16 weights %.4f\n", name.c_str(),
              half.ppl, want_half);
  EXPECT_EQ(all.n_scored, rep["val"]["n_tokens_scored"].get<int64_t>());
  EXPECT_LT(std::fabs(all.ppl / want_f16 - 1), 0.005);
  EXPECT_LT(std::fabs(all.ppl / want_f32 - 1), 0.005);
  EXPECT_LT(std::fabs(half.ppl / want_half - 1), 0.005);
  // The bound above is the issue's; the engine actually agrees far closer (f32 arithmetic only).
  EXPECT_LT(std::fabs(all.ppl / want_f16 - 1), 1e-4);
}

TEST_P(Bundled, TokenizerReproducesValidationIds) {
  const std::string name = GetParam();
  const auto tok = Tokenizer::load((kRoot / "models" / (name + ".gguf")).string());
  std::ifstream f(kRoot / "tests" / "fixtures" / "bundled" / "val.txt", std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_EQ(tok.encode(ss.str(), /*add_special=*/true, /*parse_special=*/false), val_ids());
}

TEST_P(Bundled, GreedyContinuationMatchesPyTorch) {
  const std::string name = GetParam();
  const auto rep = report()[name];
  const std::string path = (kRoot / "models" / (name + ".gguf")).string();
  const auto tok = Tokenizer::load(path);
  const auto prompt = tok.encode(rep["greedy"]["prompt"].get<std::string>(), true, true);
  EXPECT_EQ(prompt, rep["greedy"]["prompt_ids"].get<std::vector<int32_t>>());
  const auto got = testing_util::greedy_tokens(path, prompt, 64);
  EXPECT_EQ(got, rep["f16w"]["greedy_ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(got, rep["greedy"]["ids"].get<std::vector<int32_t>>());
  std::printf("[bundled] %-6s greedy 'ROMEO:' -> %s\n", name.c_str(), tok.decode(got).c_str());
}

INSTANTIATE_TEST_SUITE_P(Models, Bundled, ::testing::Values("target", "draft"));

}  // namespace
