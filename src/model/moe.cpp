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

void moe_route_topk_softmax(const float* logits, int n, int n_expert, int k, int32_t* ids, float* w) {
  for (int r = 0; r < n; ++r) {
    const float* l = logits + (size_t)r * n_expert;
    int32_t* id = ids + (size_t)r * k;
    float* wr = w + (size_t)r * k;
    // k passes of a selection (k is small): the first maximum of the experts not taken yet
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < n_expert; ++e) {
        bool taken = false;
        for (int i = 0; i < j; ++i) taken = taken || id[i] == e;
        if (taken) continue;
        if (best < 0 || l[e] > l[best] || (std::isnan(l[best]) && !std::isnan(l[e]))) best = e;
      }
      id[j] = best;
    }
    const float mx = l[id[0]];
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += wr[j] = std::exp(l[id[j]] - mx);
    for (int j = 0; j < k; ++j) wr[j] /= sum;
  }
}

}  // namespace ultra
