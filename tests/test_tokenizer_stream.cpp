// EncodeStream (src/tokenizer/encode_stream.h): a text fed in pieces gives exactly the ids of encoding it
// whole, for every tokenizer family (byte-level BPE with one or several split regexes, SentencePiece,
// HF tokenizer.json files, split behaviours, lookbehinds, stripping special tokens), for pieces and cut
// thresholds down to one byte, holding back little. (test_cli: `ultra tokenize -f` in bounded memory.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>

#include "core/error.h"
#include "tokenizer/encode_stream.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_vocabs.h"

using namespace ultra;
using namespace ultra::tok;
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The tokenizers to check: the fixtures in tests/fixtures/vocab and tests/fixtures/hf_tokenizer, and
// llama.cpp's vocabularies (llama-bpe, qwen2, qwen35, gemma-4, ...) from $ULTRA_LLAMA_CPP_SRC/models or the
// copy test_tokenizer extracts into the build directory, when there.
std::vector<fs::path> vocab_files() {
  std::vector<fs::path> out;
  std::error_code ec;
  const fs::path fixtures = fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures";
  for (const auto& e : fs::directory_iterator(fixtures / "vocab", ec))
    if (e.path().extension() == ".gguf") out.push_back(e.path());
  for (const auto& e : fs::directory_iterator(fixtures / "hf_tokenizer", ec))
    if (e.path().extension() == ".json" && e.path().filename() != "encodings.json") out.push_back(e.path());
  std::vector<fs::path> dirs;
  if (const char* src = std::getenv("ULTRA_LLAMA_CPP_SRC"); src && *src)
    dirs.push_back(fs::path(src) / "models");
  for (const auto& e :
       fs::directory_iterator(fs::path(ULTRA_ULTRA_BIN).parent_path() / "llama_cpp_vocab", ec))
    if (fs::exists(e.path() / "complete", ec)) dirs.push_back(e.path());
  std::set<std::string> seen;
  for (const auto& p : out) seen.insert(p.filename().string());
  for (const auto& d : dirs)
    for (const char* name : {"llama-bpe", "qwen2", "qwen35", "gemma-4", "deepseek-llm", "command-r", "mpt",
                             "refact", "gpt-2", "falcon"}) {
      const fs::path p = d / (std::string("ggml-vocab-") + name + ".gguf");
      if (fs::is_regular_file(p, ec) && seen.insert(p.filename().string()).second) out.push_back(p);
    }
  std::sort(out.begin(), out.end());
  return out;
}

// A text with what makes cutting hard: multi-byte UTF-8 (2, 3 and 4 bytes, combining marks), CRLF and
// bare CR, long runs of spaces, tabs and newlines, digit runs, contractions, invalid bytes, U+2581 written
// in the text, the vocabulary's special tokens (and prefixes of them) in and between words, and llama.cpp's
// tokenizer test inputs.
std::string hard_text(const Tokenizer& tok) {
  std::string t =
      "Hello world! I'LL do it, you're sure? 1234567890 12 3 4444444 3.14159 -42\r\n"
      "caf\xc3\xa9 na\xc3\xafve cafe\xcc\x81 \xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c "
      "\xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd emoji "
      "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82\n"
      "\n\n\n   \t\t  \n \r\n\r\n\r \r\r\n" +
      std::string(300, ' ') + "x" + std::string(257, '\n') + "y" + std::string(100, '\t') +
      " \xe2\x96\x81\xe2\x96\x81word \xe2\x96\x81\n"
      "bad \xff\xfe bytes \xc3 trunc \xe2\x82 ok \xed\xa0\x80 surrogate\n"
      "    def f(x):\n        return x**2  # comment\n\n"
      "<|endoftext|> <s></s> <|im_start|>user\n<|im_end|><|eot_id|><|begin_of_text|> <|endof <|im_\n";
  // Every special and added token of the vocabulary (a sample of them), glued to words and spaced out.
  int n = 0;
  for (int32_t id = 0; id < tok.n_vocab() && n < 24; ++id) {
    const TokenType ty = tok.token_type(id);
    if (ty != TokenType::Control && ty != TokenType::UserDefined) continue;
    const std::string& s = tok.token_text(id);
    if (s.empty()) continue;
    t += "a" + s + "b  " + s + s + "\n " + s.substr(0, s.size() / 2) + " ";
    ++n;
  }
  const fs::path inp =
      fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "vocab" / "ggml-vocab-gpt-2.gguf.inp";
  std::string tests = read_file(inp);
  for (size_t p; (p = tests.find("\n__ggml_vocab_test__\n")) != std::string::npos;) tests.erase(p, 21);
  return t + tests + t;
}

// The ids of text fed in pieces (sizes from next_size) with the given cut threshold.
template <class NextSize>
std::vector<int32_t> streamed(const Tokenizer& tok, std::string_view text, bool add_special,
                              bool parse_special, size_t chunk, NextSize next_size) {
  EncodeStream s(tok, add_special, parse_special, chunk);
  std::vector<int32_t> out;
  for (size_t pos = 0; pos < text.size();) {
    const size_t k = std::min(text.size() - pos, next_size());
    s.feed(text.substr(pos, k), out);
    pos += k;
  }
  s.finish(out);
  return out;
}

// Checks streamed == whole for many ways of cutting text; label names the case in failures.
void check_all_cuts(const Tokenizer& tok, const std::string& text, const std::string& label) {
  struct Way {
    size_t piece;  // 0: random sizes in [1, 300]
    size_t chunk;
  };
  const Way ways[] = {{1, 1},  {2, 3}, {3, 1},   {7, 16},         {13, 64},
                      {64, 7}, {0, 1}, {0, 200}, {4096, 1 << 16}, {1 << 20, 1 << 16}};
  for (const bool parse_special : {true, false}) {
    const std::vector<int32_t> whole = tok.encode(text, true, parse_special);
    for (const Way& w : ways) {
      std::mt19937 rng(42);
      auto next = [&] { return w.piece ? w.piece : 1 + rng() % 300; };
      const auto ids = streamed(tok, text, true, parse_special, w.chunk, next);
      if (ids != whole) {
        size_t i = 0;
        while (i < ids.size() && i < whole.size() && ids[i] == whole[i]) ++i;
        auto around = [&](const std::vector<int32_t>& v) {
          std::string s;
          for (size_t k = i >= 3 ? i - 3 : 0; k < std::min(v.size(), i + 4); ++k)
            s += "[" + std::to_string(v[k]) + " '" + std::string(tok.token_to_piece(v[k])) + "'] ";
          return s;
        };
        ADD_FAILURE() << label << ": pieces of " << w.piece << " bytes, cut threshold " << w.chunk
                      << ", parse_special " << parse_special << ": " << ids.size() << " ids, whole text "
                      << whole.size() << "; first difference at id " << i << "\n  streamed: " << around(ids)
                      << "\n  whole:    " << around(whole);
        return;
      }
    }
  }
}

class StreamVocab : public ::testing::TestWithParam<fs::path> {};

}  // namespace

TEST_P(StreamVocab, PiecesGiveTheWholeTextIds) {
  const Tokenizer tok = Tokenizer::from_file(GetParam().string());
  check_all_cuts(tok, hard_text(tok), GetParam().filename().string());
  // A longer ordinary text, cut with the default threshold and with small ones.
  const std::string corpus =
      read_file(fs::path(ULTRA_SOURCE_DIR) / ".." / "shared" / "data" / "corpus" / "tinyshakespeare.txt")
          .substr(0, 200000);
  if (corpus.empty()) return;
  for (size_t chunk : {size_t{100}, size_t{1} << 16}) {
    std::mt19937 rng(7);
    const auto ids = streamed(tok, corpus, false, true, chunk, [&] { return 1 + rng() % 5000; });
    EXPECT_EQ(ids, tok.encode(corpus, false, true)) << GetParam().filename() << " chunk " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabs, StreamVocab, ::testing::ValuesIn(vocab_files()),
                         [](const ::testing::TestParamInfo<fs::path>& info) {
                           std::string n = info.param.filename().string();
                           for (char& c : n)
                             if (!std::isalnum((unsigned char)c)) c = '_';
                           return n;
                         });

namespace {

// Byte-level BPE over all 256 bytes, a few merges, the given split rules, and tokens that strip the
// whitespace around them.
Tokenizer synthetic(std::vector<SplitRule> rules, bool escape = false) {
  Vocab v = test::byte_level_vocab(
      {{"t", "h"}, {"th", "e"}, {" ", "t"}, {" t", "h"}, {" th", "e"}, {"e", "r"}, {"1", "2"}, {"\n", "\n"}});
  v.types.assign(v.tokens.size(), TokenType::Normal);
  v.attrs.assign(v.tokens.size(), 0);
  test::add_token(v, "<ab>", TokenType::UserDefined, 0);
  test::add_token(v, "<ab>c", TokenType::UserDefined, 0);
  test::add_token(v, "<ctl>", TokenType::Control, kAttrLstrip | kAttrRstrip);
  test::add_token(v, "<l>", TokenType::Control, kAttrLstrip);
  test::add_token(v, "<r>", TokenType::UserDefined, kAttrRstrip);
  test::add_token(v, "<a long control token>", TokenType::Control, 0);
  v.splits = std::move(rules);
  if (escape) {
    v.escape_spaces = true;
    v.prepend = PrependScheme::First;
    v.prepend_always = false;
  }
  return Tokenizer(std::move(v));
}

std::string synthetic_text() {
  std::string t = "the  <ab>cd x  <ctl>   y <l>z  <r>   w the12 12 theer\n\n\n<a long control token>";
  t += "  <ctl>" + std::string(40, ' ') + "<l>" + std::string(33, '\t') + "<r>" + std::string(20, '\n') +
       "end";
  t += " <a long control tok <ab <ct  ab1234 x1y22z333 \xe2\x96\x81 a\xe2\x96\x81\xe2\x96\x81"
       "b ";
  return t + t + "  ";
}

}  // namespace

TEST(EncodeStream, SplitBehavioursLookbehindsAndStrippingTokens) {
  const std::vector<std::vector<SplitRule>> rule_sets = {
      {{kGpt2Pattern, SplitBehavior::Isolated, false}},
      {{R"(\p{N}+)", SplitBehavior::Isolated, false}, {kGpt2Pattern, SplitBehavior::Isolated, false}},
      {{" ", SplitBehavior::MergedWithNext, false}},
      {{"\xe2\x96\x81", SplitBehavior::MergedWithNext, false}},
      {{"-|\\s", SplitBehavior::MergedWithPrevious, false}},
      {{R"(\p{N})", SplitBehavior::Contiguous, false}},
      {{R"(\s+)", SplitBehavior::Removed, false}},
      {{R"(\w+|[^\w\s]+)", SplitBehavior::Removed, true}},
      {{"x*", SplitBehavior::Isolated, false}},
      // Context before the cut: lookbehinds, \b, ^ and $.
      {{R"((?<=\p{L})\p{N}+|(?<=  )\S|\b\w)", SplitBehavior::Isolated, false}},
      {{R"(^\s*\S+|\s+$|\S+)", SplitBehavior::Isolated, false}},
  };
  for (size_t i = 0; i < rule_sets.size(); ++i) {
    for (const bool escape : {false, true}) {
      const Tokenizer tok = synthetic(rule_sets[i], escape);
      check_all_cuts(tok, synthetic_text(), "rule set " + std::to_string(i) + (escape ? " (escaped)" : ""));
    }
  }
  // No pre-tokenizer: each raw fragment is one word, encoded when it ends.
  check_all_cuts(synthetic({}), synthetic_text(), "no pre-tokenizer");
}

TEST(EncodeStream, HoldsBackLittleOfAnOrdinaryText) {
  const fs::path vocab = fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "vocab";
  for (const char* name : {"ggml-vocab-gpt-2.gguf", "ggml-vocab-llama-spm.gguf"}) {
    const Tokenizer tok = Tokenizer::from_file((vocab / name).string());
    std::string line = "The quick brown fox jumps over the lazy dog; 12345 caf\xc3\xa9.\n";
    EncodeStream s(tok, false, true);
    std::vector<int32_t> out;
    size_t most = 0;
    for (int i = 0; i < 20000; ++i) {  // about 1.2 MB
      s.feed(line, out);
      most = std::max(most, s.held());
      out.clear();
    }
    s.finish(out);
    EXPECT_LE(most, 3u << 16) << name;
  }
}

TEST(EncodeStream, FeedAfterFinishThrows) {
  const Tokenizer tok = synthetic({});
  EncodeStream s(tok, false, false);
  std::vector<int32_t> out;
  s.finish(out);
  EXPECT_THROW(s.feed("x", out), Error);
  EXPECT_THROW(s.finish(out), Error);
}
