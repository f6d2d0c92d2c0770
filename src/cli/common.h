// Flags shared by the subcommands that load a model, and small printing helpers.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"

namespace ultra {
struct Model;
namespace tok {
class Tokenizer;
}
}  // namespace ultra

namespace ultra::cli {

// The model's own tokenizer (GGUF tokenizer.ggml.* keys, or tokenizer.json in an HF directory), or null.
std::unique_ptr<tok::Tokenizer> load_tokenizer_if_any(const Model& m);

struct ModelFlags {
  std::string model;
  int threads = 0;
  int ctx = 0;
  int batch = 512;
  std::string kv_type = "f32";

  // -m is optional: without it the bundled model (models/target.gguf) is used, see resolve_model().
  void add(CLI::App& app);
  // Fills `model` with the bundled default when -m was not given; throws ultra::Error if it is missing.
  void resolve_model();
  ContextParams context_params() const;
};

// The bundled default model: models/target.gguf next to the executable's parent directory (build/ultra ->
// models/target.gguf), else in the source tree this binary was built from; "" when neither exists.
std::string bundled_model_path();

// "1,2,3" -> {1,2,3}; throws ultra::Error on anything else.
std::vector<int32_t> parse_id_list(const std::string& s);

std::string human_bytes(double bytes);

}  // namespace ultra::cli
