// Test helpers: greedy tokens from ultra, in a given context (sequence 0) or in a fresh context of 256
// tokens for a model file.
#pragma once

#include <string>
#include <vector>

#include "ultra/generate.h"

namespace ultra::testing_util {

inline std::vector<int32_t> greedy_tokens(Context& ctx, const std::vector<int32_t>& prompt, int n) {
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

inline std::vector<int32_t> greedy_tokens(const std::string& model_path, const std::vector<int32_t>& prompt,
                                          int n) {
  const Model model = Model::load(model_path);
  Context ctx(model, {.n_ctx = 256});
  return greedy_tokens(ctx, prompt, n);
}

}  // namespace ultra::testing_util
