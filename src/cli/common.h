// Flags shared by the subcommands that load a model, and small printing helpers.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "engine/backend.h"

namespace ultra::cli {

struct ModelFlags {
  std::string model;
  int threads = 0;
  int ctx = 0;
  int batch = 512;
  std::string kv_type = "f32";

  void add(CLI::App& app, bool model_required = true);
  ContextParams context_params() const;
};

// "1,2,3" -> {1,2,3}; throws ultra::Error on anything else.
std::vector<int32_t> parse_id_list(const std::string& s);

std::string human_bytes(double bytes);

}  // namespace ultra::cli
