// The bundled GGUF files load in llama.cpp (the npm package node-llama-cpp, a prebuilt llama.cpp) and its
// greedy tokens for a fixed prompt equal ours. Runs when node and bench/node_modules/node-llama-cpp are
// installed (.ci/run installs them with `npm install` in bench/); skipped otherwise, saying so.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "greedy_util.h"

using namespace ultra;
namespace fs = std::filesystem;

namespace {

const fs::path kRoot = ULTRA_SOURCE_DIR;

bool have_node_llama_cpp() {
  return fs::exists(kRoot / "bench" / "node_modules" / "node-llama-cpp" / "package.json") &&
         std::system("node --version >/dev/null 2>&1") == 0;
}

std::vector<int32_t> llamacpp_greedy(const fs::path& model, const std::vector<int32_t>& prompt, int n) {
  std::string ids;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (i) ids += ',';
    ids += std::to_string(prompt[i]);
  }
  const std::string cmd = "cd " + (kRoot / "bench").string() + " && node llamacpp_greedy.mjs " +
                          model.string() + " " + ids + " " + std::to_string(n);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {};
  std::string out;
  std::array<char, 4096> buf;
  size_t k;
  while ((k = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), k);
  EXPECT_EQ(pclose(p), 0) << out;
  return nlohmann::json::parse(out)["generated_ids"].get<std::vector<int32_t>>();
}

TEST(LlamaCppPeer, BundledModelsGreedyTokensEqual) {
  if (!have_node_llama_cpp())
    GTEST_SKIP() << "node-llama-cpp is not installed (cd bench && npm install): llama.cpp comparison skipped";
  const std::vector<int32_t> prompt = {814, 26};  // "ROMEO:" in the bundled tokenizer
  for (const char* name : {"target.gguf", "draft.gguf"}) {
    const fs::path model = kRoot / "models" / name;
    const auto ours = testing_util::greedy_tokens(model.string(), prompt, 64);
    const auto theirs = llamacpp_greedy(model, prompt, 64);
    std::printf("[llama.cpp] %s: %zu/%zu greedy tokens compared\n", name, theirs.size(), ours.size());
    EXPECT_EQ(ours, theirs) << name;
  }
}

}  // namespace
