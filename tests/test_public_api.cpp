// The public API stands alone: include/ultra exposes no internals (no impl() accessor, no backend-specific
// fields in StepStats, no include outside include/ultra), the `ultra` command (src/cli) and its own library
// (src/chat, src/server: ultra_app) include nothing of src/ but their own headers and the two header-only
// helpers named below, and what the command used to reach past the API for is public: the mmap choice
// (LoadParams), the backend's description and statistics, the chat encoding's tokenizer calls.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "ultra/ultra.h"

using namespace ultra;
namespace fs = std::filesystem;

namespace {

const fs::path kRoot = fs::path(ULTRA_SOURCE_DIR);
const fs::path kDraft = kRoot / "models" / "draft.gguf";

template <class T>
concept HasImplAccessor = requires(T& t) {
  t.impl();
};
template <class T>
concept HasGpuCounters = requires(T& s) {
  s.n_graph_launches;
  s.launch_us;
  s.gpu_idle_us;
  s.n_gpu_gaps;
};

// The quoted includes of every file directly in dir whose name ends in .h or .cpp: "file: include" each.
std::vector<std::pair<std::string, std::string>> quoted_includes(const fs::path& dir) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::regex inc(R"(^\s*#\s*include\s*"([^"]+)\")");
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string ext = e.path().extension().string();
    if (ext != ".h" && ext != ".cpp") continue;
    std::ifstream f(e.path());
    std::string line;
    std::smatch m;
    while (std::getline(f, line))
      if (std::regex_search(line, m, inc)) out.emplace_back(e.path().filename().string(), m[1].str());
  }
  return out;
}

// The includes of dir that are not under one of the allowed prefixes (a prefix ending in ".h" is a file).
std::vector<std::string> outside(const fs::path& dir, const std::vector<std::string>& allowed) {
  std::vector<std::string> bad;
  for (const auto& [file, inc] : quoted_includes(dir)) {
    bool ok = false;
    for (const std::string& a : allowed) ok = ok || inc.starts_with(a);
    if (!ok) bad.push_back(dir.filename().string() + "/" + file + ": " + inc);
  }
  return bad;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += x + "\n";
  return s;
}

// Whether /proc/self/maps shows a mapping of path.
bool mapped(const fs::path& path) {
  std::ifstream maps("/proc/self/maps");
  const std::string want = fs::canonical(path).string();
  std::string line;
  while (std::getline(maps, line))
    if (line.ends_with(want)) return true;
  return false;
}

}  // namespace

TEST(PublicApi, HandlesHaveNoImplAccessor) {
  EXPECT_FALSE(HasImplAccessor<Context>);
  EXPECT_FALSE(HasImplAccessor<const Model>);
  EXPECT_FALSE(HasImplAccessor<const Tokenizer>);
}

TEST(PublicApi, StepStatsHasNoBackendCounters) {
  EXPECT_FALSE(HasGpuCounters<StepStats>);
}

TEST(PublicApi, PublicHeadersIncludeOnlyPublicHeaders) {
  EXPECT_EQ(joined(outside(kRoot / "include" / "ultra", {"ultra/"})), "");
}

// The README's claim: the command is the public API plus its own library (ultra_app), which is the public
// API plus core/error.h (fail(): fmt around ultra::Error) and tokenizer/utf8.h (classify()), both
// header-only.
TEST(PublicApi, CommandAndItsLibraryUseOnlyThePublicApi) {
  const std::vector<std::string> app = {"ultra/", "chat/", "server/", "core/error.h", "tokenizer/utf8.h"};
  std::vector<std::string> cli = {"ultra/", "chat/", "server/", "cli/"};
  EXPECT_EQ(joined(outside(kRoot / "src" / "cli", cli)), "");
  EXPECT_EQ(joined(outside(kRoot / "src" / "chat", app)), "");
  EXPECT_EQ(joined(outside(kRoot / "src" / "server", app)), "");
}

TEST(PublicApi, CpuBackendDescribesItselfAndKeepsNoBackendStats) {
  const Model m = Model::load(kDraft.string());
  Context ctx(m, {.n_ctx = 64, .n_threads = 1});
  EXPECT_EQ(std::string(ctx.backend_name()), "CPU");
  const std::string d = ctx.backend_description();
  EXPECT_TRUE(std::regex_match(
      d, std::regex(R"(CPU \((scalar|avx2|avx512) kernels(; Q8_0 with int8 activations)?\))")))
      << d;
  Batch b(8);
  b.add_sequence(std::vector<int32_t>{1, 2, 3}, 0, 0, Output::logits);
  ctx.step(b);
  EXPECT_TRUE(ctx.backend_stats().empty());
  EXPECT_EQ(ctx.backend_stat("graph_launches"), 0);
  EXPECT_EQ(ctx.stats().n_steps, 1);
}

// LoadParams::mmap = false reads the file into memory: no mapping of it while the model lives; the default
// maps it (the setting does not outlive its load).
TEST(PublicApi, LoadParamsChooseMmapPerLoad) {
  ASSERT_FALSE(mapped(kDraft));
  {
    const Model copied = Model::load(kDraft.string(), {.mmap = false});
    EXPECT_FALSE(mapped(kDraft));
    const Model m = Model::load(kDraft.string());
    EXPECT_TRUE(mapped(kDraft));
    Context a(copied, {.n_ctx = 32, .n_threads = 1}), b(m, {.n_ctx = 32, .n_threads = 1});
    Batch batch(4);
    batch.add_sequence(std::vector<int32_t>{1, 2, 3}, 0, 0, Output::logits);
    a.step(batch);
    b.step(batch);
    const std::span<const float> la = a.logits(2), lb = b.logits(2);
    EXPECT_TRUE(std::equal(la.begin(), la.end(), lb.begin(), lb.end()));
  }
  EXPECT_FALSE(mapped(kDraft));
}

// The chat encoding's tokenizer calls: a control token's text inside a literal span is ordinary text.
TEST(PublicApi, TokenizerEncodesLiteralSpansAsText) {
  const Model m = Model::load(kDraft.string());
  const Tokenizer& tok = *m.tokenizer();
  int32_t special = -1;
  for (int32_t id = 0; id < tok.n_vocab() && special < 0; ++id)
    if (tok.is_special(id) && !tok.token_to_piece(id).empty()) special = id;
  ASSERT_GE(special, 0);
  const std::string piece(tok.token_to_piece(special));
  const std::string text = "a" + piece + "b";
  size_t at = 99;
  EXPECT_EQ(tok.find_special(text, &at), special);
  EXPECT_EQ(at, 1u);
  EXPECT_EQ(tok.find_special("ab"), -1);
  const std::vector<int32_t> parsed = tok.encode(text, false, true);
  EXPECT_EQ(std::count(parsed.begin(), parsed.end(), special), 1);
  const Tokenizer::Span none[1] = {};
  EXPECT_EQ(tok.encode_with_literal(text, std::span<const Tokenizer::Span>(none, 0), false), parsed);
  const Tokenizer::Span lit[1] = {{1, 1 + piece.size()}};
  const std::vector<int32_t> kept = tok.encode_with_literal(text, lit, false);
  EXPECT_EQ(std::count(kept.begin(), kept.end(), special), 0);
  EXPECT_EQ(tok.decode(kept), text);
  const Tokenizer::Span bad[1] = {{2, 1}};
  EXPECT_THROW(tok.encode_with_literal(text, bad, false), Error);
}
