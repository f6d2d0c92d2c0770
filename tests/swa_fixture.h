// Models with a whole-model sliding window for the tests of windowed attention shorter than the context:
// the Mistral fixture (tests/fixtures/hf/mistral: 2 layers, GQA, head_dim 32) with sliding_window set in its
// config.json, and a GGUF of arch llama with llama.attention.sliding_window set.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "io/gguf.h"
#include "tmp_dir.h"

namespace ultra::test {

// Writes dir.path()/name: the fixture's weights with config.json's sliding_window = window; returns its path.
inline std::string windowed_mistral(const TmpDir& dir, int window, const std::string& name = "mistral_swa") {
  const std::filesystem::path src =
      std::filesystem::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "hf" / "mistral";
  const std::filesystem::path d = dir.path() / name;
  std::filesystem::create_directories(d);
  std::filesystem::copy_file(src / "model.safetensors", d / "model.safetensors");
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src / "config.json"));
  cfg["sliding_window"] = window;
  std::ofstream(d / "config.json") << cfg.dump();
  return d.string();
}

// src (a GGUF of arch llama) with llama.attention.sliding_window = window, written to dst.
inline void windowed_gguf(const std::string& src, const std::string& dst, int window) {
  const gguf::Reader r = gguf::Reader::open(src);
  gguf::Writer w;
  for (const auto& [k, v] : r.metadata()) w.set_value(k, v);
  w.set_u32("llama.attention.sliding_window", (uint32_t)window);
  for (const auto& t : r.tensors()) w.add_tensor(t.name, t.type, t.ne, t.data, t.n_bytes);
  w.write(dst);
}

}  // namespace ultra::test
