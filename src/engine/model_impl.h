// The state behind the public Model and Tokenizer handles (include/ultra/model.h); detail::impl(model) and
// detail::impl(tokenizer) (engine/access.h) reach it.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "engine/access.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "ultra/model.h"

namespace ultra {

struct Tokenizer::Impl {
  tok::Tokenizer t;
};

struct Model::Impl {
  ~Impl();  // rank 0 of a split model: tells the other ranks the model is gone (run_tp_follower returns)
  std::unique_ptr<ModelData> data;
  std::optional<Tokenizer> tokenizer;
  ModelInfo info;
  std::vector<int32_t> eog;  // ascending
};

}  // namespace ultra
