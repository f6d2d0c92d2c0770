// libFuzzer target: encodes arbitrary bytes with the fixture vocabularies (tests/fixtures/vocab) and checks
// the invariants: no crash or sanitizer report, ids in range, the same ids on a second (cached) encode,
// decode(encode(x)) == x where the vocabulary is lossless for x, the streaming detokenizer writes only
// valid UTF-8 that equals the lossy (U+FFFD) form of decode(), and EncodeStream fed the text in pieces
// (sizes 1-16 and a cut threshold of 1-64 bytes, drawn from the text's own bytes) gives the ids of encode().
//
// Input: byte 0 picks the vocabulary (low bits) and the flags (0x40 add_special, 0x80 parse_special); the
// rest is the text.
//
// The tokenizer sources are compiled into this file so that they get the fuzzer's coverage instrumentation
// and sanitizers (the ultra_lib archive is built without them); their symbols then take precedence over
// the archive's copies.
//
//   CC=clang CXX=clang++ cmake -S . -B build-fuzz-tok -G Ninja -DULTRA_FUZZ=ON -DULTRA_TESTS=OFF
//   ninja -C build-fuzz-tok fuzz_tokenizer
//   ./build-fuzz-tok/fuzz_tokenizer -max_total_time=300 -max_len=4096 corpus_dir
#include "../src/tokenizer/bpe.cpp"
#include "../src/tokenizer/encode_stream.cpp"
#include "../src/tokenizer/pretokenizer.cpp"
#include "../src/tokenizer/spm.cpp"
#include "../src/tokenizer/tokenizer.cpp"
#include "../src/tokenizer/utf8.cpp"
#include "../src/tokenizer/vocab.cpp"

#include <cstdio>
#include <cstdlib>

namespace {

using ultra::tok::Detokenizer;
using ultra::tok::Tokenizer;
using ultra::tok::TokenType;
namespace utf8 = ultra::tok::utf8;

std::vector<Tokenizer>* g_toks = nullptr;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_tokenizer: invariant failed: %s\n", what);
    std::abort();
  }
}

std::string lossy(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const int k = utf8::classify(reinterpret_cast<const unsigned char*>(s.data()) + i, s.size() - i);
    if (k > 0) {
      out.append(s.data() + i, (size_t)k);
      i += (size_t)k;
    } else {
      out += utf8::kReplacement;
      i += k == 0 ? s.size() - i : (size_t)-k;
    }
  }
  return out;
}

bool lossless_bytes(const Tokenizer& tok, std::string_view s) {
  if (tok.kind() == ultra::tok::ModelKind::Spm) return true;
  for (unsigned char c : s) {
    const int32_t id = tok.find_token(utf8::byte_to_unicode(c));
    if (id < 0 || tok.token_type(id) != TokenType::Normal) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "vocab";
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".gguf") names.push_back(e.path().string());
  std::sort(names.begin(), names.end());
  g_toks = new std::vector<Tokenizer>();
  for (const auto& n : names) g_toks->push_back(Tokenizer::from_file(n));
  if (g_toks->empty()) {
    std::fprintf(stderr, "fuzz_tokenizer: no vocabularies in %s\n", dir.c_str());
    std::abort();
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const Tokenizer& tok = (*g_toks)[(data[0] & 0x3F) % g_toks->size()];
  const bool add_special = data[0] & 0x40, parse_special = data[0] & 0x80;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);

  const std::vector<int32_t> ids = tok.encode(text, add_special, parse_special);
  bool has_added = false;
  for (int32_t id : ids) {
    check(id >= 0 && id < tok.n_vocab(), "id in range");
    const TokenType t = tok.token_type(id);
    has_added =
        has_added || t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown;
  }
  check(tok.encode(text, add_special, parse_special) == ids, "second encode (word cache) gives the same ids");

  uint32_t x = 2166136261u;  // FNV-1a of the text: the piece sizes and cut threshold
  for (const uint8_t c : text) x = (x ^ c) * 16777619u;
  ultra::tok::EncodeStream es(tok, add_special, parse_special, 1 + x % 64);
  std::vector<int32_t> pieces_ids;
  for (size_t pos = 0; pos < text.size();) {
    x = x * 1664525u + 1013904223u;
    const size_t k = std::min(text.size() - pos, (size_t)(1 + (x >> 28)));
    es.feed(text.substr(pos, k), pieces_ids);
    pos += k;
  }
  es.finish(pieces_ids);
  check(pieces_ids == ids, "EncodeStream in pieces == encode");

  const std::string back = tok.decode(ids);
  if (!has_added && lossless_bytes(tok, text)) check(back == text, "decode(encode(x)) == x");

  Detokenizer d(tok);
  std::vector<char> buf(d.max_bytes_per_push());
  std::string streamed;
  for (int32_t id : ids) {
    const size_t n = d.push(id, buf.data(), buf.size());
    check(lossy(std::string_view(buf.data(), n)) == std::string_view(buf.data(), n), "chunk is valid UTF-8");
    streamed.append(buf.data(), n);
  }
  streamed.append(buf.data(), d.flush(buf.data(), buf.size()));
  check(d.pending() == 0, "nothing left after flush");
  check(streamed == lossy(back), "stream == lossy(decode)");
  return 0;
}
