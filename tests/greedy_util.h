// Test helper: greedy tokens from ultra for a model file and prompt (a fresh context of 256 tokens).
#pragma once

#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "engine/generate.h"

namespace ultra::testing_util {

inline std::vector<int32_t> greedy_tokens(const std::string& model_path, const std::vector<int32_t>& prompt,
                                          int n) {
  auto m = load_model(model_path);
  ContextParams cp;
  cp.n_ctx = 256;
  CpuBackend be(*m, cp);
  Session s(be, 0);
  SamplingParams sp;
  sp.temperature = 0;
  Sampler greedy(sp, m->hp.n_vocab);
  std::vector<int32_t> got;
  generate(s, greedy, prompt.data(), (int)prompt.size(), n, -1, [&](int32_t t, const float*) {
    got.push_back(t);
    return true;
  });
  return got;
}

}  // namespace ultra::testing_util
