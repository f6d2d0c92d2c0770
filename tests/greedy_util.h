// Test helper: greedy tokens from ultra for a model file and prompt (a fresh context of 256 tokens).
#pragma once

#include <string>
#include <vector>

#include "ultra/generate.h"

namespace ultra::testing_util {

inline std::vector<int32_t> greedy_tokens(const std::string& model_path, const std::vector<int32_t>& prompt,
                                          int n) {
  const Model model = Model::load(model_path);
  Context ctx(model, {.n_ctx = 256});
  ctx.set_sampling(0, SamplingParams::greedy());
  std::vector<int32_t> got;
  GenerateParams gp;
  gp.n_predict = n;
  gp.ignore_eos = true;
  generate(ctx, prompt, gp, [&](int32_t t, Context&, int) {
    got.push_back(t);
    return true;
  });
  return got;
}

}  // namespace ultra::testing_util
