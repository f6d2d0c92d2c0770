// The state behind the public Model and Tokenizer handles (include/ultra/model.h).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "ultra/model.h"

namespace ultra {

struct Tokenizer::Impl {
  tok::Tokenizer t;
};

struct Model::Impl {
  std::unique_ptr<ModelData> data;
  std::optional<Tokenizer> tokenizer;
  ModelInfo info;
  std::vector<int32_t> eog;  // ascending
};

}  // namespace ultra
