// RoPE, interleaved (llama.cpp "norm") and rotate-half (HF / "neox") pairings.
// The angle is computed in f32 exactly as HF does ((float)pos * inv_freq[i]); cos/sin are computed once per
// (token, pair) and reused for every head.
#include <cmath>

#include "backend/cpu/ops.h"

namespace ultra::cpu {

namespace {

// pairs (xh[2i], xh[2i+1]) for i < n
inline void rotate_interleaved(float* xh, int n, const float* c, const float* s) {
  for (int i = 0; i < n; ++i) {
    const float x0 = xh[2 * i], x1 = xh[2 * i + 1];
    xh[2 * i] = x0 * c[i] - x1 * s[i];
    xh[2 * i + 1] = x0 * s[i] + x1 * c[i];
  }
}

}  // namespace

void rope(float* x, int n_tokens, int n_heads, int head_dim, const int32_t* pos, const float* inv_freq,
          bool interleaved, float mscale) {
  const int half = head_dim / 2;
  constexpr int kMaxHalf = 512;
  float c[kMaxHalf], s[kMaxHalf];
  for (int t = 0; t < n_tokens; ++t) {
    const float p = (float)pos[t];
    float* xt = x + (int64_t)t * n_heads * head_dim;
    for (int i0 = 0; i0 < half; i0 += kMaxHalf) {  // one pass unless head_dim > 1024
      const int n = half - i0 < kMaxHalf ? half - i0 : kMaxHalf;
      for (int i = 0; i < n; ++i) {
        const float theta = p * inv_freq[i0 + i];
        c[i] = std::cos(theta) * mscale;  // HF: emb.cos() * attention_scaling, in f32
        s[i] = std::sin(theta) * mscale;
      }
      for (int h = 0; h < n_heads; ++h) {
        float* xh = xt + (int64_t)h * head_dim;
        if (interleaved) {
          rotate_interleaved(xh + 2 * i0, n, c, s);
        } else {
          // pairs (i, i + half) for i in [i0, i0 + n)
          for (int i = 0; i < n; ++i) {
            const float x0 = xh[i0 + i], x1 = xh[i0 + i + half];
            xh[i0 + i] = x0 * c[i] - x1 * s[i];
            xh[i0 + i + half] = x0 * s[i] + x1 * c[i];
          }
        }
      }
    }
  }
}

void rope_ref(float* x, int n_tokens, int n_heads, int head_dim, const int32_t* pos, const float* inv_freq,
              bool interleaved, float mscale) {
  const int half = head_dim / 2;
  for (int t = 0; t < n_tokens; ++t) {
    for (int h = 0; h < n_heads; ++h) {
      float* xh = x + ((int64_t)t * n_heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const float theta = (float)pos[t] * inv_freq[i];  // f32, as HF
        const double c = std::cos((double)theta) * mscale, s = std::sin((double)theta) * mscale;
        const int i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
        const double x0 = xh[i0], x1 = xh[i1];
        xh[i0] = (float)(x0 * c - x1 * s);
        xh[i1] = (float)(x0 * s + x1 * c);
      }
    }
  }
}

}  // namespace ultra::cpu
