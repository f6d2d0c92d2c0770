// The Mistral fixture (tests/fixtures/hf/mistral: 2 layers, GQA, head_dim 32) with a whole-model
// sliding_window set in its config.json, for the tests of windowed attention shorter than the context.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

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

}  // namespace ultra::test
