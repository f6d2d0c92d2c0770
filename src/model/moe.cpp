#include "model/moe.h"

#include <cmath>

namespace ultra {

void moe_route(float* logits, int n, int n_expert, int k, bool norm, int32_t* ids, float* w) {
  for (int r = 0; r < n; ++r) {
    float* p = logits + (size_t)r * n_expert;
    float max = -INFINITY;
    for (int e = 0; e < n_expert; ++e) max = std::fmax(max, p[e]);
    double sum = 0;  // ggml sums the exponentials in double
    for (int e = 0; e < n_expert; ++e) sum += p[e] = std::exp(p[e] - max);
    const float inv = (float)(1.0 / sum);
    for (int e = 0; e < n_expert; ++e) p[e] *= inv;
    // k passes of a selection: the first maximum of the experts not yet taken (strict >: the lower index
    // wins a tie; a NaN loses to any number). A taken expert is marked -1 (probabilities are >= 0 or NaN),
    // so each pass takes a new one.
    int32_t* id = ids + (size_t)r * k;
    float* wr = w + (size_t)r * k;
    float total = 0;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < n_expert; ++e) {
        if (p[e] < 0) continue;
        if (best < 0 || p[e] > p[best] || (std::isnan(p[best]) && !std::isnan(p[e]))) best = e;
      }
      id[j] = best;
      wr[j] = p[best];
      p[best] = -1;
      total += wr[j];
    }
    for (int j = 0; j < k; ++j) p[id[j]] = wr[j];
    if (norm) {
      const float s = std::fmax(total, 6.103515625e-5f);
      for (int j = 0; j < k; ++j) wr[j] /= s;
    }
  }
}

}  // namespace ultra
