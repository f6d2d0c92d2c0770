// The per-token grammar mask (src/grammar/token_mask.h) against the definition, on real vocabularies: at
// every step of real documents, token t is allowed exactly when the matcher accepts all of t's bytes (and
// an end-of-generation token exactly when the input is complete); control tokens never are; masks served
// from the cache equal fresh ones; the matcher's state is unchanged by compute(); nothing is allocated once
// warm.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "alloc_counter.h"
#include "cli/common.h"
#include "core/error.h"
#include "grammar/gbnf_parser.h"
#include "grammar/grammar_matcher.h"
#include "grammar/mask_tables.h"
#include "grammar/mask_vocab.h"
#include "grammar/token_mask.h"
#include "sanitized.h"
#include "tokenizer/tokenizer.h"

using namespace ultra;
using namespace ultra::grammar;
namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  return cli::read_text_file(p.string(), "grammar");
}

fs::path fixtures() {
  return fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures";
}

std::shared_ptr<const Grammar> load(const std::string& name) {
  return std::make_shared<const Grammar>(parse_gbnf(slurp(fixtures() / "grammars" / (name + ".gbnf"))));
}

// The mask by definition: every token tried from the state, one at a time.
std::vector<uint32_t> brute_mask(Matcher& m, const MaskVocab& v) {
  std::vector<uint32_t> out(v.n_words(), 0);
  const Matcher::Snapshot s = m.snapshot();
  for (int32_t t = 0; t < v.n_vocab; ++t) {
    if (v.bytes[t].empty()) continue;
    m.restore(s);
    if (m.accept_bytes(v.bytes[t]) == v.bytes[t].size()) out[t >> 5] |= 1u << (t & 31);
  }
  m.restore(s);
  if (m.is_complete())
    for (int32_t e : v.eog) out[e >> 5] |= 1u << (e & 31);
  return out;
}

// Drives a matcher through `doc` token by token (the tokenizer's own tokens), comparing the mask with the
// definition at every step (every `stride`-th step for speed) and checking each next token is allowed.
void check_document(Matcher& m, TokenMask& tm, const tok::Tokenizer& tk,
                    const std::shared_ptr<const MaskVocab>& v, const std::string& doc, int stride) {
  m.reset();
  std::vector<uint32_t> mask(tm.n_words());
  const std::vector<int32_t> ids = tk.encode(doc);
  for (size_t i = 0; i <= ids.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "token " << i << " of " << doc);
    const Matcher::Snapshot before = m.snapshot();
    const int n = tm.compute(mask.data());
    EXPECT_EQ(m.snapshot().heads, before.heads);
    EXPECT_EQ(n, count_allowed(mask.data(), mask.size()));
    // Under the sanitizers a quarter of the positions (tests/sanitized.h): the brute-force mask is the cost.
    const size_t every = (size_t)stride * (test::kSanitized ? 4 : 1);
    if (i % every == 0 || i == ids.size()) {
      const auto want = brute_mask(m, *v);
      ASSERT_EQ(mask, want);
      std::vector<uint32_t> again(tm.n_words());
      tm.compute(again.data());  // from the cache
      ASSERT_EQ(again, want);
    }
    if (i == ids.size()) {
      EXPECT_TRUE(mask_allows(mask.data(), tk.eos()));
      break;
    }
    EXPECT_EQ(mask_allows(mask.data(), tk.eos()), m.is_complete());
    ASSERT_TRUE(mask_allows(mask.data(), ids[i]))
        << "token " << ids[i] << " '" << tk.token_to_piece(ids[i]) << "'";
    const std::string_view piece = tk.token_to_piece(ids[i]);
    ASSERT_EQ(m.accept_bytes(piece), piece.size());
  }
  EXPECT_TRUE(m.is_complete());
  EXPECT_GT(tm.stats().cache_hits, 0);
}

// Each document twice at several context depths: first with one matcher (the tables built as met), then
// with a fresh matcher and mask sharing those tables (built with other stack ids), its cache empty.
void check_documents(const tok::Tokenizer& tk, const std::shared_ptr<const MaskVocab>& v,
                     const std::shared_ptr<const Grammar>& g, const std::vector<std::string>& docs,
                     int stride) {
  for (int depth : {1, 3}) {
    SCOPED_TRACE(::testing::Message() << "context depth " << depth);
    const auto tables = std::make_shared<MaskTables>(g, v, depth);
    for (int round = 0; round < 2; ++round) {
      Matcher m(g);
      TokenMask tm(tables, m);
      const int64_t built = tables->tables_built();
      for (const std::string& doc : docs) check_document(m, tm, tk, v, doc, stride);
      if (round == 1) EXPECT_EQ(tables->tables_built(), built) << "the second round builds no table";
    }
  }
}

const char* kDocs[] = {
    R"({"name": "ultra", "version": 3, "tags": ["c++", "llm"], "ok": true, "x": null, "pi": -3.25e2})",
    R"({"items": [{"id": 1, "text": "caf\u00e9 \"quoted\" \\ done"}, {"id": 22, "nested": {"a": [1, 2, [3]]}}]})",
    "{\"k\": \"\xc3\xa9t\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\", \"empty\": {}, \"arr\": []}",
};

}  // namespace

TEST(TokenMask, EqualsTheDefinitionOnGpt2Json) {
  const auto tk = tok::Tokenizer::from_file((fixtures() / "vocab" / "ggml-vocab-gpt-2.gguf").string());
  const auto v = MaskVocab::from_tokenizer(tk);
  const auto g = load("json");
  check_documents(tk, v, g, {std::begin(kDocs), std::end(kDocs)}, 5);
}

TEST(TokenMask, EqualsTheDefinitionOnSpmJson) {
  // SentencePiece: U+2581 is a space, <0xNN> byte tokens are their byte, a token may end inside a character.
  const auto tk = tok::Tokenizer::from_file((fixtures() / "vocab" / "ggml-vocab-llama-spm.gguf").string());
  const auto v = MaskVocab::from_tokenizer(tk);
  EXPECT_TRUE(v->bytes[tk.bos()].empty());
  // The encoder puts a space in front of the text: the grammar allows it.
  std::string text = slurp(fixtures() / "grammars" / "json.gbnf");
  text.replace(text.find("root   ::= object"), 17, "root ::= \" \" object");
  const auto g = std::make_shared<const Grammar>(parse_gbnf(text));
  check_documents(tk, v, g, {std::begin(kDocs), std::end(kDocs)}, 4);
}

TEST(TokenMask, OtherGrammars) {
  const auto tk = tok::Tokenizer::from_file((fixtures() / "vocab" / "ggml-vocab-gpt-2.gguf").string());
  const auto v = MaskVocab::from_tokenizer(tk);
  check_documents(tk, v, load("arithmetic"), {"(1+2)*3-4/5=x1 \n", "a=(b)\n"}, 1);
  check_documents(tk, v, load("list"), {"- milk\n- eggs\n- bread\n"}, 1);
  check_documents(tk, v, load("chess"), {"1. e4 e5\n2. Nf3 Nc6\n"}, 1);
}

TEST(TokenMask, DeadEndAllowsNothingAndEosOnlyWhenComplete) {
  std::vector<std::string> bytes = {"a", "b", "ab", "", "\xc3", "\xa9"};
  const auto v = std::make_shared<const MaskVocab>(bytes, std::vector<int32_t>{3});
  const auto g = std::make_shared<const Grammar>(parse_gbnf("root ::= \"a\" \"\xc3\xa9\"?"));
  Matcher m(g);
  TokenMask tm(v, m);
  std::vector<uint32_t> mask(tm.n_words());
  EXPECT_EQ(tm.compute(mask.data()), 1);  // "a" ("ab": b is refused after a)
  EXPECT_TRUE(mask_allows(mask.data(), 0));
  EXPECT_FALSE(mask_allows(mask.data(), 2));
  ASSERT_TRUE(m.accept_bytes("a"));
  EXPECT_EQ(tm.compute(mask.data()), 2);  // "\xc3" (starts é) and EOS
  EXPECT_TRUE(mask_allows(mask.data(), 4));
  EXPECT_TRUE(mask_allows(mask.data(), 3));
  ASSERT_TRUE(m.accept_bytes("\xc3"));  // pending UTF-8
  EXPECT_EQ(tm.compute(mask.data()), 1);
  EXPECT_TRUE(mask_allows(mask.data(), 5));
  ASSERT_TRUE(m.accept_bytes("\xa9"));
  EXPECT_EQ(tm.compute(mask.data()), 1);  // only EOS: complete, nothing can follow
  EXPECT_TRUE(mask_allows(mask.data(), 3));
}

TEST(TokenMask, WarmMasksAllocateNothing) {
#if !ULTRA_COUNT_ALLOCS
  GTEST_SKIP() << "allocation counting is disabled under AddressSanitizer";
#else
  const auto tk = tok::Tokenizer::from_file((fixtures() / "vocab" / "ggml-vocab-gpt-2.gguf").string());
  const auto v = MaskVocab::from_tokenizer(tk);
  const auto g = load("json");
  const std::vector<int32_t> ids = tk.encode(kDocs[1]);
  Matcher m(g);
  TokenMask::Options opt;
  opt.cache_entries = 0;  // every mask computed, none served from the cache
  TokenMask tm(v, m, opt);
  EXPECT_THROW(TokenMask(std::make_shared<MaskTables>(load("list"), v), m), Error);  // another grammar
  std::vector<uint32_t> mask(tm.n_words());
  const Matcher::Snapshot start = m.snapshot();
  Matcher::Snapshot snap;
  snap.heads.reserve(256);
  auto run = [&] {
    m.restore(start);
    for (int32_t id : ids) {
      tm.compute(mask.data());
      m.accept_bytes(tk.token_to_piece(id));
    }
  };
  run();  // warm: the element tables and the matcher's stacks
  AllocCount c;
  run();
  c.stop();
  EXPECT_EQ(c.allocs(), 0);
#endif
}

// Random walks through every fixture grammar with a synthetic vocabulary (the grammars' own characters in
// strings of 1-6 bytes, some of them parts of a UTF-8 character): at every step the mask equals the
// definition, at several context depths, with tables shared between walks.
TEST(TokenMask, RandomWalksOverEveryFixtureGrammar) {
  const std::string alpha =
      "{}[]\":, \n0123456789-.eEtrufalsnbcdgh\\\xc3\xa9"
      "ab()+*/=xNKQR#O";
  std::vector<std::string> bytes = {""};  // id 0: the end-of-generation token
  for (char a : alpha) bytes.push_back(std::string(1, a));
  std::mt19937 rng(7);
  for (int i = 0; i < 1500; ++i) {
    std::string s;
    for (int k = 0, n = 2 + (int)(rng() % 5); k < n; ++k) s += alpha[rng() % alpha.size()];
    bytes.push_back(s);
  }
  const auto v = std::make_shared<const MaskVocab>(bytes, std::vector<int32_t>{0});
  std::vector<uint32_t> mask(v->n_words()), want(v->n_words());
  for (const auto& entry : fs::directory_iterator(fixtures() / "grammars")) {
    if (entry.path().extension() != ".gbnf") continue;
    const auto g = load(entry.path().stem().string());
    for (int depth : {1, 3}) {
      const auto tables = std::make_shared<MaskTables>(g, v, depth);
      for (int walk = 0; walk < 3; ++walk) {
        SCOPED_TRACE(::testing::Message()
                     << entry.path().filename() << " depth " << depth << " walk " << walk);
        Matcher m(g);
        TokenMask tm(tables, m);
        for (int step = 0; step < 30; ++step) {
          tm.compute(mask.data());
          want = brute_mask(m, *v);
          ASSERT_EQ(mask, want) << "step " << step;
          std::vector<int32_t> allowed;
          for (int32_t t = 1; t < v->n_vocab; ++t)
            if (mask_allows(want.data(), t)) allowed.push_back(t);
          if (allowed.empty()) break;
          m.accept_bytes(v->bytes[allowed[rng() % allowed.size()]]);
        }
      }
    }
  }
}
