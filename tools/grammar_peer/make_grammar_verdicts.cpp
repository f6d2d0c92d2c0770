// Writes tests/fixtures/grammars/llamacpp_verdicts.json: for each grammar of tests/fixtures/grammars, inputs
// with llama.cpp's verdict (a whole sentence of the grammar or not), which tests/test_grammar.cpp compares
// with ultra's matcher. Inputs: sentences drawn at random from the grammar (ultra's parse of it), and
// mutations of them (a code point deleted, inserted, replaced; a slice repeated; a cut). The verdict comes
// from llama.cpp's own matcher (llama_grammar_accept over the code points, as its test-gbnf-validator does).
// Disagreements are printed on stderr.
//
// Not part of the build (it links llama.cpp's internal grammar API). With L = llama.cpp's checkout and
// build (e.g. ~/.cache/ultra/llama.cpp-native), from the repository root:
//   g++ -std=c++20 -O1 -Iinclude -Isrc -I$L/src/include -I$L/src/ggml/include -I$L/src/src \
//     tools/grammar_peer/make_grammar_verdicts.cpp src/grammar/*.cpp -L$L/build/bin -lllama -lfmt \
//     -Wl,-rpath,$L/build/bin -o /tmp/make_grammar_verdicts
//   /tmp/make_grammar_verdicts tests/fixtures/grammars > tests/fixtures/grammars/llamacpp_verdicts.json
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "grammar/gbnf_parser.h"
#include "grammar/grammar_matcher.h"
#include "llama-grammar.h"
#include "tokenizer/utf8.h"

namespace fs = std::filesystem;
using namespace ultra::grammar;

namespace {

std::mt19937 rng(1234);

size_t pick(size_t n) {
  return std::uniform_int_distribution<size_t>(0, n - 1)(rng);
}

bool llama_accepts(const llama_grammar* initial, const std::vector<uint32_t>& cps) {
  llama_grammar* g = llama_grammar_clone_impl(*initial);
  bool ok = true;
  for (uint32_t c : cps) {
    llama_grammar_accept(g, c);
    if (llama_grammar_get_stacks(g).empty()) {
      ok = false;
      break;
    }
  }
  if (ok) {
    ok = false;
    for (const auto& stack : llama_grammar_get_stacks(g)) ok = ok || stack.empty();
  }
  llama_grammar_free_impl(g);
  return ok;
}

// Random sentences of a grammar: random alternatives, the shortest one once deep or long.
struct Generator {
  const Grammar& g;
  std::vector<size_t> min_len;  // [n_rules] fewest code points a rule can match

  explicit Generator(const Grammar& grammar) : g(grammar), min_len(grammar.n_rules(), SIZE_MAX / 4) {
    for (bool changed = true; changed;) {
      changed = false;
      for (uint32_t r = 0; r < g.n_rules(); ++r) {
        for (uint32_t k = g.rule_alts[r]; k < g.rule_alts[r + 1]; ++k) {
          const size_t len = alt_min(g.alt_start[k]);
          if (len < min_len[r]) min_len[r] = len, changed = true;
        }
      }
    }
  }

  size_t alt_min(uint32_t at) const {
    size_t len = 0;
    for (; !g.ends_alternative(at); ++at)
      len += g.elements[at].op == Op::Chars ? 1 : min_len[g.elements[at].a];
    return std::min(len, SIZE_MAX / 4);
  }

  uint32_t any_char(uint32_t at) {
    const Element& e = g.elements[at];
    for (;;) {
      const CharRange r = g.ranges[e.a + pick(e.b)];
      uint32_t c = r.lo + (uint32_t)pick(std::min<size_t>(r.hi - r.lo + 1, pick(4) == 0 ? SIZE_MAX : 96));
      if (c < 0xD800 || c > 0xDFFF) return c;
    }
  }

  void rule(uint32_t r, int depth, std::vector<uint32_t>& out) {
    uint32_t k = g.rule_alts[r] + (uint32_t)pick(g.rule_alts[r + 1] - g.rule_alts[r]);
    if (depth > 12 || out.size() > 60) {  // steer to an end
      for (uint32_t j = g.rule_alts[r]; j < g.rule_alts[r + 1]; ++j) {
        if (alt_min(g.alt_start[j]) < alt_min(g.alt_start[k])) k = j;
      }
    }
    for (uint32_t at = g.alt_start[k]; !g.ends_alternative(at); ++at) {
      if (g.elements[at].op == Op::Chars) {
        if (g.elements[at].b == 0) return;  // matches nothing
        out.push_back(any_char(at));
      } else {
        rule(g.elements[at].a, depth + 1, out);
      }
    }
  }
};

std::string utf8(const std::vector<uint32_t>& cps) {
  std::string s;
  for (uint32_t c : cps) ultra::tok::utf8::append(s, c);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s GRAMMAR_DIR\n", argv[0]);
    return 2;
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(argv[1])) {
    if (e.path().extension() == ".gbnf") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  int disagreements = 0;
  for (const fs::path& file : files) {
    std::ifstream f(file, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    const auto g = std::make_shared<const Grammar>(parse_gbnf(text));
    llama_grammar* lg = llama_grammar_init_impl(nullptr, text.c_str(), "root", false, nullptr, 0, nullptr, 0);
    if (!lg) return 1;
    Generator gen(*g);
    std::vector<std::vector<uint32_t>> inputs;
    for (int i = 0; i < 40; ++i) {
      std::vector<uint32_t> s;
      gen.rule(g->root, 0, s);
      if (s.size() > 200) continue;
      inputs.push_back(s);
      for (int m = 0; m < 2; ++m) {
        std::vector<uint32_t> t = s;
        const size_t at = pick(t.size() + 1);
        uint32_t c = pick(3) == 0 ? (uint32_t)(0x20 + pick(95)) : s.empty() ? 'a' : s[pick(s.size())];
        switch (pick(5)) {
          case 0:
            if (at < t.size()) t.erase(t.begin() + at);
            break;
          case 1:
            t.insert(t.begin() + at, c);
            break;
          case 2:
            if (at < t.size()) t[at] = c;
            break;
          case 3:
            t.insert(t.begin() + at, s.begin() + at / 2, s.begin() + at);
            break;
          default:
            t.resize(at);
        }
        inputs.push_back(t);
      }
    }
    nlohmann::ordered_json cases = nlohmann::ordered_json::array();
    int n_yes = 0;
    for (const auto& cps : inputs) {
      const bool verdict = llama_accepts(lg, cps);
      const std::string s = utf8(cps);
      n_yes += verdict;
      if (grammar_accepts(g, s) != verdict) {
        ++disagreements;
        std::fprintf(stderr, "%s: llama.cpp says %d for %s\n", file.filename().c_str(), verdict,
                     nlohmann::json(s).dump().c_str());
      }
      cases.push_back({s, verdict});
    }
    std::fprintf(stderr, "%s: %zu inputs, %d accepted by llama.cpp\n", file.filename().c_str(), inputs.size(),
                 n_yes);
    out[file.filename().string()] = cases;
    llama_grammar_free_impl(lg);
  }
  std::printf("%s\n", out.dump(0).c_str());
  std::fprintf(stderr, "%d disagreements\n", disagreements);
  return disagreements == 0 ? 0 : 1;
}
