// Writes the seed corpora of the libFuzzer targets (fuzz/fuzz_*.cpp): small valid inputs of each format.
//   make_fuzz_seeds OUT_DIR [VOCAB_DIR]
// OUT_DIR/gguf, safetensors, tokenizer_json, hf_config and gguf_vocab get the seeds of the target of that
// name (see docs/FUZZING.md). VOCAB_DIR (default: ../shared/data/vocab beside the source tree) adds a real
// vocabulary's key/values, arrays cut to 200 entries, to the gguf seeds. A program, not a test: it checks
// nothing beyond "the seed loads" for the seeds that are meant to.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../fuzz/fuzz_harness.h"
#include "core/error.h"
#include "core/file.h"
#include "io/gguf.h"

using namespace ultra;
using namespace ultra::gguf;
namespace fs = std::filesystem;

namespace {

const fs::path kSource = ULTRA_SOURCE_DIR;

void write_bytes(const fs::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), (std::streamsize)bytes.size());
  if (!out) fail("{}: write failed", path.string());
  std::printf("  %s (%zu bytes)\n", path.c_str(), bytes.size());
}

// GGUF: tensors of each type at alignment 32 and 64, every scalar type as a key, and a real vocabulary's
// key/values with its arrays cut to 200 entries.
void gguf_seeds(const fs::path& out, const fs::path& vocab_dir) {
  std::vector<float> f32(12);
  for (size_t k = 0; k < f32.size(); ++k) f32[k] = 0.5f * (float)k - 1;
  std::vector<uint16_t> f16(8);
  for (size_t k = 0; k < f16.size(); ++k) f16[k] = fp32_to_fp16((float)k / 4);
  std::vector<BlockQ8_0> q8(4);
  for (size_t b = 0; b < q8.size(); ++b) {
    q8[b].d = fp32_to_fp16(0.01f * (float)(b + 1));
    for (int k = 0; k < kQ8_0Block; ++k) q8[b].qs[k] = (int8_t)(k - 16 + (int)b);
  }
  Writer w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 1);
  w.set_f32("llama.rope.freq_base", 10000.0f);
  w.set_bool("b", true);
  w.set_array_string("tokenizer.ggml.tokens", {"<s>", "a"});
  w.set_array_i32("tokenizer.ggml.token_type", {3, 1});
  w.set_value("nested",
              Value::of_array(ValueType::ARRAY,
                              {Value::of_array(ValueType::U16, {Value::of_uint(ValueType::U16, 9)})}));
  w.add_tensor("f32", GgmlType::F32, {4, 3}, f32.data(), f32.size() * 4);
  w.add_tensor("f16", GgmlType::F16, {8}, f16.data(), f16.size() * 2);
  w.add_tensor("blk.0.q8", GgmlType::Q8_0, {64, 2}, q8.data(), q8.size() * sizeof(BlockQ8_0));
  w.write((out / "seed_tensors_a32.gguf").string());
  w.write((out / "seed_tensors_a64.gguf").string(), 64);
  std::printf("  %s, seed_tensors_a64.gguf\n", (out / "seed_tensors_a32.gguf").c_str());
  Writer kv_only;
  kv_only.set_value("i64", Value::of_int(ValueType::I64, -1));
  kv_only.set_value("f64", Value::of_float(ValueType::F64, 2.5));
  kv_only.set_value("u8", Value::of_uint(ValueType::U8, 1));
  kv_only.set_value("i8", Value::of_int(ValueType::I8, -1));
  kv_only.set_value("i16", Value::of_int(ValueType::I16, -1));
  kv_only.set_value("u64", Value::of_uint(ValueType::U64, 5));
  kv_only.set_array_f32("scores", {0.5f, 1.0f});
  kv_only.write((out / "seed_kv_only.gguf").string());
  std::printf("  %s\n", (out / "seed_kv_only.gguf").c_str());
  std::vector<fs::path> vocabs;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(vocab_dir, ec))
    if (e.path().extension() == ".gguf") vocabs.push_back(e.path());
  if (vocabs.empty()) {
    std::printf("  (no vocabulary in %s: seed_vocab_mini.gguf not written)\n", vocab_dir.c_str());
    return;
  }
  std::sort(vocabs.begin(), vocabs.end());
  const Reader vocab = Reader::open(vocabs.front().string());
  Writer mini;
  for (const auto& [k, v] : vocab.metadata()) {
    if (v.type != ValueType::ARRAY) {
      mini.set_value(k, v);
      continue;
    }
    const Array& a = v.as_array();
    std::vector<Value> items;
    for (size_t i = 0; i < std::min<size_t>(a.size(), 200); ++i) items.push_back(a.at(i));
    mini.set_value(k, Value::of_array(a.elem_type, items));
  }
  mini.write((out / "seed_vocab_mini.gguf").string());
  std::printf("  %s (from %s)\n", (out / "seed_vocab_mini.gguf").c_str(), vocabs.front().c_str());
}

std::string safetensors_file(const std::string& header, size_t data_bytes) {
  std::string b(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(b.data(), &n, 8);
  b += header;
  for (size_t k = 0; k < data_bytes; ++k) b += (char)(k * 7 + 1);
  return b;
}

void safetensors_seeds(const fs::path& out) {
  write_bytes(out / "seed_valid.safetensors", safetensors_file(R"({"__metadata__": {"format": "pt"},
  "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
  "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]},
  "step": {"dtype": "I64", "shape": [1], "data_offsets": [32, 40]},
  "empty": {"dtype": "F16", "shape": [0, 4], "data_offsets": [40, 40]}})",
                                                               40));
  write_bytes(out / "seed_empty.safetensors", safetensors_file("{}", 0));
  write_bytes(out / "seed_subbyte.safetensors",
              safetensors_file(R"({"a":{"dtype":"F4","shape":[2,3],"data_offsets":[0,3]},)"
                               R"("b":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[3,6]},)"
                               R"("c":{"dtype":"U8","shape":[4294967296,1,1],"data_offsets":[6,6]}})",
                               6));
  write_bytes(
      out / "seed_padded.safetensors",
      safetensors_file(
          R"({"__metadata__":{"a":"b"},"t":{"dtype":"F16","shape":[2,2],"data_offsets":[0,8]}}    )", 8));
}

std::string with_second(const std::string& first, const std::string& second) {
  return first + std::string(1, '\0') + second;
}

// tokenizer.json seeds: the HF tokenizers fixtures (byte-level, llama-3 split, Metaspace with byte
// fallback), alone and with a tokenizer_config.json.
void tokenizer_json_seeds(const fs::path& out) {
  const fs::path dir = kSource / "tests" / "fixtures" / "hf_tokenizer";
  for (const char* name : {"bytelevel", "split", "metaspace"}) {
    const std::string tj = read_file((dir / (std::string(name) + ".json")).string(), "tokenizer fixture");
    fuzz::require(fuzz::tokenizer_json_one((const uint8_t*)tj.data(), tj.size()), "tokenizer seed loads");
    write_bytes(out / (std::string("seed_") + name + ".json"), tj);
  }
  const std::string tj = read_file((dir / "bytelevel.json").string(), "tokenizer fixture");
  write_bytes(out / "seed_bytelevel_with_config.json",
              with_second(tj, R"({"bos_token": {"content": "<|im_start|>"}, "eos_token": "<|im_end|>",
                                  "add_bos_token": true, "add_eos_token": false})"));
}

// config.json seeds: the model fixtures' configs (Llama, Llama-3 rope scaling, Qwen2, Mistral), each with
// its generation_config.json, and one with eos id lists.
void hf_config_seeds(const fs::path& out) {
  const fs::path dir = kSource / "tests" / "fixtures" / "hf";
  for (const char* name : {"llama_gqa", "llama_tied_rope3", "qwen2_bias", "mistral"}) {
    const std::string cfg = read_file((dir / name / "config.json").string(), "config fixture");
    const std::string gen = read_file((dir / name / "generation_config.json").string(), "config fixture");
    const std::string both = with_second(cfg, gen);
    fuzz::require(fuzz::hf_config_one((const uint8_t*)both.data(), both.size()), "config seed loads");
    write_bytes(out / (std::string("seed_") + name + ".json"), both);
  }
  const std::string t4 = R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 300, "hidden_size": 64,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
  "rms_norm_eps": 1e-6, "rope_theta": 500000.0, "tie_word_embeddings": true, "bos_token_id": 1,
  "eos_token_id": [2, 3], "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
  "high_freq_factor": 4.0, "original_max_position_embeddings": 64}})";
  const std::string t4_both = with_second(t4, R"({"eos_token_id": [3, 7]})");
  fuzz::require(fuzz::hf_config_one((const uint8_t*)t4_both.data(), t4_both.size()), "config seed loads");
  write_bytes(out / "seed_transformers4_eos_lists.json", t4_both);
}

// GGUF vocabulary seeds: each fixture vocabulary (tests/fixtures/vocab) cut to its first tokens (the
// merges kept are those whose parts and result survive), written only if it still loads.
void gguf_vocab_seeds(const fs::path& out) {
  const fs::path dir = kSource / "tests" / "fixtures" / "vocab";
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".gguf") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& path : files) {
    const Reader r = Reader::open(path.string());
    const Array& tokens = r.find("tokenizer.ggml.tokens")->as_array();
    const size_t n = std::min<size_t>(tokens.size(), 600);
    std::set<std::string_view> kept;
    for (size_t i = 0; i < n; ++i) kept.insert(tokens.string_at(i));
    Writer w;
    for (const auto& [k, v] : r.metadata()) {
      if (k.rfind("tokenizer.ggml.", 0) != 0 && k != "general.architecture" && k != "general.name") continue;
      if (k.size() > 9 && k.compare(k.size() - 9, 9, "_token_id") == 0 && v.as_uint() >= n) continue;
      if (v.type != ValueType::ARRAY) {
        w.set_value(k, v);
        continue;
      }
      const Array& a = v.as_array();
      std::vector<Value> items;
      if (k == "tokenizer.ggml.merges") {
        for (size_t i = 0; i < a.size(); ++i) {
          const std::string_view m = a.string_at(i);
          const size_t sp = m.find(' ', 1);
          if (sp == std::string_view::npos) continue;
          const std::string joined = std::string(m.substr(0, sp)) + std::string(m.substr(sp + 1));
          if (kept.count(m.substr(0, sp)) && kept.count(m.substr(sp + 1)) && kept.count(joined))
            items.push_back(a.at(i));
        }
      } else if (a.size() == tokens.size()) {
        for (size_t i = 0; i < n; ++i) items.push_back(a.at(i));
      } else {
        for (size_t i = 0; i < a.size(); ++i) items.push_back(a.at(i));
      }
      w.set_value(k, Value::of_array(a.elem_type, items));
    }
    const fs::path seed = out / ("seed_" + path.stem().string() + ".gguf");
    w.write(seed.string());
    try {
      fuzz::exercise(tok::Tokenizer(tok::load_gguf(Reader::open(seed.string()))));
    } catch (const Error& e) {
      std::printf("  (%s does not load once cut, removed: %s)\n", seed.c_str(), e.what());
      fs::remove(seed);
      continue;
    }
    std::printf("  %s (%ju bytes)\n", seed.c_str(), (uintmax_t)fs::file_size(seed));
  }

  // tokenizer.ggml.model "gemma4" (SentencePiece-style BPE: U+2581, <0xNN> byte fallback, newline runs):
  // llama.cpp's vector file is 16 MB and not in the fixtures, so a small one made here.
  const std::string m = "\xe2\x96\x81";
  std::vector<std::string> toks = {"<pad>", "<eos>", "<bos>", "<unk>", "\n", "\n\n",
                                   m,       "a",     "b",     m + "a", "ab"};
  std::vector<int32_t> types = {3, 3, 3, 2, 1, 1, 1, 1, 1, 1, 1};
  for (int b = 0; b < 256; ++b) {
    toks.push_back(fmt::format("<0x{:02X}>", b));
    types.push_back(6);
  }
  Writer w;
  w.set_string("tokenizer.ggml.model", "gemma4");
  w.set_array_string("tokenizer.ggml.tokens", toks);
  w.set_array_i32("tokenizer.ggml.token_type", types);
  w.set_array_string("tokenizer.ggml.merges", {"\n \n", "a b", m + " a"});
  w.set_u32("tokenizer.ggml.bos_token_id", 2);
  w.set_u32("tokenizer.ggml.eos_token_id", 1);
  w.set_u32("tokenizer.ggml.unknown_token_id", 3);
  const fs::path seed = out / "seed_gemma4_mini.gguf";
  w.write(seed.string());
  fuzz::exercise(tok::Tokenizer(tok::load_gguf(Reader::open(seed.string()))));
  std::printf("  %s (%ju bytes)\n", seed.c_str(), (uintmax_t)fs::file_size(seed));
}

// HTTP requests as clients send them: each route, keep-alive and pipelined, chunked, 100-continue, streamed.
void http_seeds(const fs::path& out) {
  const auto post = [](const std::string& path, const std::string& body, const std::string& extra = "") {
    return "POST " + path + " HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n" + extra +
           "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  };
  const std::pair<const char*, std::string> seeds[] = {
      {"health", "GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"},
      {"models_metrics", "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics HTTP/1.0\r\n\r\n"},
      {"completion", post("/v1/completions", R"({"prompt": "ROMEO:", "max_tokens": 4, "temperature": 0})")},
      {"completion_ids_stream",
       post("/v1/completions", R"({"prompt": [1, 2, 3], "max_tokens": 3, "stream": true, "logprobs": 2})")},
      {"chat",
       post("/v1/chat/completions",
            R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": )"
            R"("Hi <|im_end|>"}], "max_tokens": 3, "stop": ["
"], "top_logprobs": 1, "logprobs": true})")},
      {"chat_template",
       post("/v1/chat/completions",
            R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, )"
            R"("chat_template": "{% for m in messages %}{{ m.content | upper }}{% endfor %}", )"
            R"("chat_template_kwargs": {"a": [1, {"b": null}]}})")},
      {"tokenize_pipelined",
       post("/tokenize", R"({"content": "JULIET:"})") + post("/detokenize", R"({"tokens": [1, 2, 3]})") +
           post("/apply-template", R"({"messages": [{"role": "user", "content": "x"}]})")},
      {"chunked",
       "POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
       "5\r\n{\"con\r\nf\r\ntent\": \"ROMEO\"}\r\n0\r\n\r\n"},
      {"expect", post("/tokenize", R"({"content": "a"})", "Expect: 100-continue\r\n")},
  };
  for (const auto& [name, bytes] : seeds) {
    const fs::path seed = out / (std::string(name) + ".http");
    FILE* f = std::fopen(seed.c_str(), "wb");
    if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0)
      throw std::runtime_error("cannot write " + seed.string());
    std::printf("  %s (%zu bytes)\n", seed.c_str(), bytes.size());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s OUT_DIR [VOCAB_DIR]\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  const fs::path vocab_dir =
      argc > 2 ? fs::path(argv[2]) : kSource.parent_path() / "shared" / "data" / "vocab";
  try {
    for (const char* t : {"gguf", "safetensors", "tokenizer_json", "hf_config", "gguf_vocab", "http"})
      fs::create_directories(out / t);
    std::printf("gguf:\n");
    gguf_seeds(out / "gguf", vocab_dir);
    std::printf("safetensors:\n");
    safetensors_seeds(out / "safetensors");
    std::printf("tokenizer_json:\n");
    tokenizer_json_seeds(out / "tokenizer_json");
    std::printf("hf_config:\n");
    hf_config_seeds(out / "hf_config");
    std::printf("gguf_vocab:\n");
    gguf_vocab_seeds(out / "gguf_vocab");
    std::printf("http:\n");
    http_seeds(out / "http");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
