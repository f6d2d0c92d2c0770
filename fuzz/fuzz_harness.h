// The bodies of the libFuzzer targets for the text formats beyond GGUF and safetensors: tokenizer.json,
// config.json, and a vocabulary in GGUF. Shared by the targets (fuzz/fuzz_*.cpp) and by the tests that
// replay their regression inputs (tests/fixtures/fuzz/<target>/), so both run exactly the same code.
//
// Each function takes arbitrary bytes and returns true when they loaded, false when loading threw
// ultra::Error (a clean rejection). Anything else is a finding: another exception (including the
// std::logic_error thrown here when a loaded object breaks an invariant), a crash, a sanitizer report, a
// leak, a timeout or running out of memory.
//
// Two files in one input: the bytes up to the first NUL are the first file, the rest the second (JSON
// text cannot hold a raw NUL).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"
#include "io/gguf.h"
#include "model/hparams.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"

namespace ultra::fuzz {

inline void require(bool ok, const char* what) {
  if (!ok) throw std::logic_error(std::string("fuzz invariant failed: ") + what);
}

inline std::pair<std::string_view, std::string_view> split_at_nul(const uint8_t* data, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const size_t nul = all.find('\0');
  if (nul == std::string_view::npos) return {all, {}};
  return {all.substr(0, nul), all.substr(nul + 1)};
}

// Encodes and decodes a few fixed texts with a tokenizer that loaded: ids in range, decode of them works,
// a second encode (word cache) gives the same ids.
inline void exercise(const tok::Tokenizer& tok) {
  static const char* const kTexts[] = {"", "Hello world! 123 héllo\n\t  x", "<|endoftext|><s> </s>[PAD3]",
                                       "\xff\xfe\xc3 \xe2\x96\x81 ab"};
  for (const char* text : kTexts) {
    for (int flags = 0; flags < 4; ++flags) {
      const std::vector<int32_t> ids = tok.encode(text, flags & 1, flags & 2);
      for (int32_t id : ids) require(id >= 0 && id < tok.n_vocab(), "encoded id in range");
      require(tok.encode(text, flags & 1, flags & 2) == ids, "second encode gives the same ids");
      (void)tok.decode(ids);
      (void)tok.decode(ids, true);
    }
  }
}

// tokenizer.json [NUL tokenizer_config.json]: tok::load_hf_json, a Tokenizer, exercise().
inline bool tokenizer_json_one(const uint8_t* data, size_t size) {
  const auto [tj, cfg] = split_at_nul(data, size);
  try {
    const tok::Tokenizer t(tok::load_hf_json(tj, cfg, "tokenizer.json", "tokenizer_config.json"));
    exercise(t);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// config.json [NUL generation_config.json]: parse_hf_config_json; on success the values validate() let
// through are used as the loaders use them.
inline bool hf_config_one(const uint8_t* data, size_t size) {
  const auto [cfg, gen] = split_at_nul(data, size);
  try {
    const HParams hp = parse_hf_config_json(cfg, "config.json", gen, "generation_config.json");
    require(hp.n_vocab > 0 && hp.dim > 0 && hp.n_layers > 0 && hp.head_dim > 0, "validated sizes");
    require(hp.n_heads % hp.n_kv_heads == 0, "GQA grouping");
    for (int32_t id : hp.eos_ids) require(id >= 0 && id < hp.n_vocab, "eos id in range");
    require(hp.bos_id >= -1 && hp.bos_id < hp.n_vocab, "bos id in range");
    const std::vector<float> inv = hp.rope_inv_freq();
    require(inv.size() == (size_t)hp.head_dim / 2, "rope frequencies");
    return true;
  } catch (const Error&) {
    return false;
  }
}

// A GGUF file holding a vocabulary: gguf::Reader::parse, tok::load_gguf, a Tokenizer, exercise().
inline bool gguf_vocab_one(const uint8_t* data, size_t size) {
  try {
    const gguf::Reader r = gguf::Reader::parse(data, size, "vocab.gguf");
    const tok::Tokenizer t(tok::load_gguf(r));
    exercise(t);
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace ultra::fuzz
