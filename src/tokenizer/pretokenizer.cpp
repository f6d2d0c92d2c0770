#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <mutex>
#include <string>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace ultra::tok {

// GPT-2 (HF ByteLevel, use_regex). llama.cpp leaves out the final "|\s+"; the gap a failed match leaves is
// the same single whitespace character, so the pieces agree.
const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

// llama-3 and qwen2 as in their tokenizer.json. PCRE2 has (?i:...), which llama.cpp had to spell out as
// [sS]...; caseless matching also folds U+017F (long s) to 's', as Oniguruma (HF) does.
const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen3.5: as qwen2, but letter runs take combining marks (\p{M}) too, and punctuation runs leave them out.
const char* const kQwen35Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kTekkenPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kGpt4oPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kSeedCoderPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kBailingPattern =
    R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";

// CJK ideographs (U+4E00..U+9FA5), U+0800..U+4E00 and Hangul (U+AC00..U+D7FF), as in DeepSeek's
// tokenizer.json.
const char* const kDeepseekCjk = R"([\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";
// DeepSeek LLM's letter class: the cased letters (Lu, Ll, Lt) of the Unicode version it was made with.
const char* const kDeepseekLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF})"
    R"(\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1})"
    R"(\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5})"
    R"(\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A})"
    R"(\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B})"
    R"(\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC})"
    R"(\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107})"
    R"(\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134})"
    R"(\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
    R"(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787})"
    R"(\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A})"
    R"(\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2})"
    R"(\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";
const char* const kDeepseekPunct =
    R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)";
const char* const kDeepseekV3Main =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kPoroPattern = R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{0964}\x{06D4}\x{060C})]+)";

std::vector<SplitRule> isolated(std::initializer_list<const char*> patterns) {
  std::vector<SplitRule> out;
  for (const char* p : patterns) out.push_back(SplitRule{p, SplitBehavior::Isolated, false});
  return out;
}

bool one_of(std::string_view s, std::initializer_list<std::string_view> names) {
  for (auto n : names)
    if (s == n) return true;
  return false;
}

}  // namespace

PreTokenizerInfo pre_tokenizer_for(std::string_view pre) {
  PreTokenizerInfo info;
  if (pre.empty() || pre == "default") {
    info.splits = isolated({R"([\p{P}\$\+<=>\^~\|]+)", kGpt2Pattern, R"(\p{N}+)", "[0-9][0-9][0-9]"});
  } else if (one_of(pre, {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                          "lfm2"})) {
    info.splits = isolated({kLlama3Pattern});
    info.ignore_merges = true;
    info.add_bos = true;
  } else if (one_of(pre, {"dbrx", "smaug-bpe", "chatglm-bpe", "glm4"})) {
    info.splits = isolated({kLlama3Pattern});
  } else if (pre == "deepseek-llm") {
    info.splits =
        isolated({R"([\r\n])", kDeepseekLetters, kDeepseekPunct, R"(\s+$)", kDeepseekCjk, R"(\p{N}+)"});
  } else if (pre == "deepseek-coder") {
    info.splits = isolated({R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, R"(\p{N})"});
  } else if (pre == "deepseek-v3") {
    info.splits = isolated(
        {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)", kDeepseekV3Main});
  } else if (pre == "falcon") {
    info.splits = isolated({R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2Pattern, "[0-9][0-9][0-9]"});
  } else if (one_of(pre,
                    {"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"})) {
    info.splits = isolated({R"(\p{N})", kGpt2Pattern});
  } else if (one_of(pre, {"gpt-2", "mpt", "olmo", "jais", "phi-2", "jina-es", "jina-de", "gigachat",
                          "jina-v2-es", "jina-v2-de", "jina-v1-en", "jina-v2-code", "roberta-bpe", "a.x-4.0",
                          "mellum", "exaone4", "trillion", "granite-docling"})) {
    info.splits = isolated({kGpt2Pattern});
  } else if (one_of(pre, {"qwen2", "deepseek-r1-qwen", "megrez", "stablelm2", "hunyuan"})) {
    info.splits = isolated({kQwen2Pattern});
  } else if (pre == "qwen35") {
    info.splits = isolated({kQwen35Pattern});
  } else if (one_of(pre, {"gemma4", "granite-embed-multi-311m"})) {
    // BPE over the whole escaped text; only runs of newlines are cut out (llama.cpp's "[^\n]+|[\n]+").
    info.splits = isolated({R"([^\n]+|\n+)"});
    info.spm_style = true;
    info.add_bos = true;
    info.force_add_bos = true;
  } else if (one_of(pre, {"poro-chat", "bloom", "gpt3-finnish"})) {
    info.splits = isolated({kPoroPattern});
  } else if (pre == "viking") {
    info.splits = isolated({kPoroPattern, R"(\p{N})"});
  } else if (pre == "tekken") {
    info.splits = isolated({kTekkenPattern});
    info.ignore_merges = true;
    info.add_bos = true;
  } else if (one_of(pre, {"gpt-4o", "llama4"})) {
    info.splits = isolated({kGpt4oPattern});
  } else if (pre == "seed-coder") {
    info.splits = isolated({kSeedCoderPattern});
  } else if (one_of(pre, {"bailingmoe", "bailingmoe2", "llada-moe"})) {
    info.splits = isolated({kBailingPattern});
  } else {
    fail(
        "unknown pre-tokenizer '{}' (tokenizer.ggml.pre); supported: default, llama-bpe, qwen2, qwen35, "
        "gemma4, deepseek-llm, deepseek-coder, deepseek-v3, falcon, starcoder, refact, mpt, gpt-2, tekken, "
        "gpt-4o and their aliases",
        pre);
  }
  return info;
}

struct PreTokenizer::Rule {
  pcre2_code* code = nullptr;
  bool jit = false;
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
  // A copy of code JIT-compiled for hard partial matching, made at the first streaming split (most
  // tokenizers never stream; pcre2_jit_compile must not run on a code that other threads match with).
  mutable std::once_flag partial_once;
  mutable pcre2_code* partial = nullptr;
  mutable bool partial_jit = false;
  ~Rule() {
    if (code) pcre2_code_free(code);
    if (partial) pcre2_code_free(partial);
  }
  // The code for hard partial matching (JIT-compiled when possible).
  const pcre2_code* partial_code() const {
    std::call_once(partial_once, [this] {
      partial = pcre2_code_copy(code);
      if (!partial) throw Error("pre-tokenizer: out of memory copying a regex");
      partial_jit = pcre2_jit_compile(partial, PCRE2_JIT_PARTIAL_HARD) == 0;
    });
    return partial;
  }
};

PreTokenizer::PreTokenizer(const std::vector<SplitRule>& rules) {
  for (const auto& r : rules) {
    auto rule = std::make_unique<Rule>();
    int err = 0;
    PCRE2_SIZE err_off = 0;
    rule->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(r.pattern.data()), r.pattern.size(),
                               PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_off, nullptr);
    if (!rule->code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail("pre-tokenizer regex '{}' does not compile at offset {}: {}", r.pattern, (size_t)err_off,
           reinterpret_cast<const char*>(msg));
    }
    rule->jit = pcre2_jit_compile(rule->code, PCRE2_JIT_COMPLETE) == 0;
    rule->behavior = r.behavior;
    rule->invert = r.invert;
    if (rules_.empty()) {
      uint32_t chars = 0;  // the longest lookbehind in characters
      pcre2_pattern_info(rule->code, PCRE2_INFO_MAXLOOKBEHIND, &chars);
      lookbehind_bytes_ = 4 * ((size_t)chars + 1);
    }
    rules_.push_back(std::move(rule));
  }
}

PreTokenizer::~PreTokenizer() = default;

namespace {

// Per-thread match data and JIT stack, made once per thread and reused (no allocation per call).
struct MatchScratch {
  pcre2_match_data* md = nullptr;
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_context* mctx = nullptr;
  std::vector<std::string_view> a, b;
  MatchScratch() {
    md = pcre2_match_data_create(16, nullptr);
    mctx = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    if (stack && mctx) pcre2_jit_stack_assign(mctx, nullptr, stack);
  }
  ~MatchScratch() {
    if (md) pcre2_match_data_free(md);
    if (mctx) pcre2_match_context_free(mctx);
    if (stack) pcre2_jit_stack_free(stack);
  }
};

MatchScratch& match_scratch() {
  thread_local MatchScratch s;
  if (!s.md || !s.mctx) throw Error("pre-tokenizer: out of memory for PCRE2 match data");
  return s;
}

}  // namespace

size_t PreTokenizer::apply(const Rule& r, std::string_view piece, size_t start, bool final,
                           std::vector<std::string_view>& out) const {
  MatchScratch& s = match_scratch();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  size_t n = piece.size();
  const pcre2_code* code = r.code;
  bool jit = r.jit;
  uint32_t options = 0;
  if (!final) {
    code = r.partial_code();
    jit = r.partial_jit;
    options = PCRE2_PARTIAL_HARD;
    // An incomplete UTF-8 character at the end would count as invalid (no match) rather than as the end
    // of the subject: leave it out; it is matched once its last bytes have come.
    for (size_t k = 1; k <= 3 && k <= n; ++k) {
      const auto c = static_cast<unsigned char>(piece[n - k]);
      if ((c & 0xC0) == 0x80) continue;
      if (c >= 0xC0 && utf8::classify(reinterpret_cast<const unsigned char*>(piece.data()) + n - k, k) == 0)
        n -= k;
      break;
    }
  }

  // Segments covering the piece: (begin, end, is_match), built on the fly and folded by the behaviour.
  // Folding state as in HF tokenizers' NormalizedString::split.
  struct Seg {
    size_t b, e;
  };
  bool prev_match = false;
  bool have_last = false;
  Seg last{0, 0};
  // MergedWithNext works right to left in HF; equivalently, a delimiter (match) starts a new piece that
  // absorbs the following non-delimiter, and a delimiter after a delimiter stands alone.
  auto emit = [&](size_t b, size_t e) {
    if (e > b) out.emplace_back(piece.data() + b, e - b);
  };
  auto push = [&](size_t b, size_t e, bool is_match) {
    if (r.invert) is_match = !is_match;
    switch (r.behavior) {
      case SplitBehavior::Isolated:
        emit(b, e);
        break;
      case SplitBehavior::Removed:
        if (!is_match) emit(b, e);
        break;
      case SplitBehavior::MergedWithPrevious:
        if (is_match && !prev_match && have_last) {
          last.e = e;
        } else {
          if (have_last) emit(last.b, last.e);
          last = {b, e};
          have_last = true;
        }
        break;
      case SplitBehavior::MergedWithNext:
        // Right-to-left rule: a non-match following a match (that is not itself preceded...) is folded into
        // the match before it. Left to right: a match opens a piece; the next segment joins it when it is a
        // non-match.
        if (!is_match && prev_match && have_last) {
          last.e = e;
        } else {
          if (have_last) emit(last.b, last.e);
          last = {b, e};
          have_last = true;
        }
        break;
      case SplitBehavior::Contiguous:
        if (is_match == prev_match && have_last) {
          last.e = e;
        } else {
          if (have_last) emit(last.b, last.e);
          last = {b, e};
          have_last = true;
        }
        break;
    }
    prev_match = is_match;
  };

  size_t pos = start, prev_end = start;
  while (pos <= n) {
    int rc = jit ? pcre2_jit_match(code, subject, n, pos, options, s.md, s.mctx)
                 : pcre2_match(code, subject, n, pos, options, s.md, s.mctx);
    if (rc == PCRE2_ERROR_NOMATCH || rc == PCRE2_ERROR_PARTIAL) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail("pre-tokenizer: regex match failed: {}", reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.md);
    const size_t mb = ov[0], me = ov[1];
    if (me == mb) {
      // Empty match: a split point only; search again one unit further on.
      if (mb >= n) break;
      pos = mb + 1;
      while (pos < n && (static_cast<unsigned char>(piece[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (mb > prev_end) push(prev_end, mb, false);
    push(mb, me, true);
    prev_end = pos = me;
  }
  if (!final) return have_last ? last.b : prev_end;  // the rest may change with more text
  if (prev_end < n) push(prev_end, n, false);
  if (have_last) emit(last.b, last.e);
  return n;
}

size_t PreTokenizer::split_from(std::string_view text, size_t start, bool final,
                                std::vector<std::string_view>& out) const {
  if (start >= text.size()) return text.size();
  if (rules_.empty()) {
    if (!final) return start;  // one piece: the whole text
    out.push_back(text.substr(start));
    return text.size();
  }
  if (rules_.size() == 1) return apply(*rules_[0], text, start, final, out);
  // The first rule's pieces that are certain are final pieces of split(T): the later rules split each of
  // them whole.
  MatchScratch& s = match_scratch();
  std::vector<std::string_view> cur = std::move(s.a), next = std::move(s.b);
  cur.clear();
  const size_t end = apply(*rules_[0], text, start, final, cur);
  for (size_t i = 1; i < rules_.size(); ++i) {
    next.clear();
    std::vector<std::string_view>& dst = i + 1 == rules_.size() ? out : next;
    for (auto piece : cur) apply(*rules_[i], piece, 0, /*final=*/true, dst);
    std::swap(cur, next);
  }
  s.a = std::move(cur);
  s.b = std::move(next);
  return end;
}

}  // namespace ultra::tok
