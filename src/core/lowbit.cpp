#include "core/lowbit.h"

#include <algorithm>
#include <cmath>

#include "core/fp8.h"
#include "core/ternary.h"

namespace ultra {

float fp8_row_scale(const float* x, int64_t n) {
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax / kFp8E4M3Max;
}

void quantize_row_fp8(const float* x, int64_t n, float scale, uint8_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = scale > 0 ? fp32_to_fp8_e4m3(x[i] / scale) : 0;
}

float ternary_scale(double sum_abs, int64_t n) {
  return (float)std::max(n > 0 ? sum_abs / (double)n : 0.0, 1e-5);
}

void quantize_row_ternary(const float* x, int64_t n, float scale, uint32_t* out) {
  for (int64_t w = 0; w < n / kTernaryPerWord; ++w) {
    uint32_t v = 0;
    for (int i = 0; i < kTernaryPerWord; ++i) {
      // nearbyint: round half to even (the default rounding mode), as torch.round in BitNet's quantiser
      const float q = std::nearbyint(x[w * kTernaryPerWord + i] / scale);
      v |= ternary_code(q > 0 ? 1 : q < 0 ? -1 : 0) << (2 * i);
    }
    out[w] = v;
  }
}

// ---- TQ1_0 / TQ2_0: transcriptions of ggml-quants.c (quantize_row_tq*_0_ref, dequantize_row_tq*_0) ----

void quantize_row_tq1_0(const float* x, int64_t k, BlockTQ1_0* y) {
  const int64_t nb = k / kQK_K;
  for (int64_t i = 0; i < nb; i++) {
    float amax = 0.0f;
    for (int j = 0; j < kQK_K; j++) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    // 5 elements per byte, along 32 bytes
    for (size_t j = 0; j < sizeof(y->qs) - sizeof(y->qs) % 32; j += 32) {
      for (size_t m = 0; m < 32; ++m) {
        uint8_t q = 0;
        for (size_t n = 0; n < 5; ++n) {
          const int xi = (int)std::lroundf(x[m + n * 32] * id) + 1;  // -1, 0, 1 -> 0, 1, 2
          q *= 3;
          q += xi;
        }
        q = ((uint16_t)q * 256 + (243 - 1)) / 243;  // ceiling division (243 == pow(3, 5))
        y[i].qs[j + m] = q;
      }
      x += 5 * 32;
    }
    // along 16 bytes
    for (size_t j = sizeof(y->qs) - sizeof(y->qs) % 32; j < sizeof(y->qs); j += 16) {
      for (size_t m = 0; m < 16; ++m) {
        uint8_t q = 0;
        for (size_t n = 0; n < 5; ++n) {
          const int xi = (int)std::lroundf(x[m + n * 16] * id) + 1;
          q *= 3;
          q += xi;
        }
        q = ((uint16_t)q * 256 + (243 - 1)) / 243;
        y[i].qs[j + m] = q;
      }
      x += 5 * 16;
    }
    // 4 elements per byte
    for (size_t j = 0; j < sizeof(y->qh); ++j) {
      uint8_t q = 0;
      for (size_t m = 0; m < 4; ++m) {
        const int xi = (int)std::lroundf(x[j + m * sizeof(y->qh)] * id) + 1;
        q *= 3;
        q += xi;
      }
      q *= 3;  // shift the first value to the most significant trit
      q = ((uint16_t)q * 256 + (243 - 1)) / 243;
      y[i].qh[j] = q;
    }
    x += 4 * sizeof(y->qh);
  }
}

void quantize_row_tq2_0(const float* x, int64_t k, BlockTQ2_0* y) {
  const int64_t nb = k / kQK_K;
  for (int64_t i = 0; i < nb; i++) {
    float amax = 0.0f;
    for (int j = 0; j < kQK_K; j++) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax;
    const float id = d ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    for (size_t j = 0; j < sizeof(y->qs); j += 32) {
      for (size_t m = 0; m < 32; ++m) {
        uint8_t q = 0;
        for (size_t n = 0; n < 4; ++n) {
          const int xi = (int)std::lroundf(x[m + n * 32] * id) + 1;  // -1, 0, 1 -> 0, 1, 2
          q += (xi & 3) << (2 * n);
        }
        y[i].qs[j + m] = q;
      }
      x += 4 * 32;
    }
  }
}

namespace {

// Trit n (0 = most significant) of a TQ1_0 byte, as 0, 1, 2.
inline int tq1_digit(uint8_t q, int n) {
  static constexpr uint8_t pow3[6] = {1, 3, 9, 27, 81, 243};
  const uint8_t v = (uint8_t)(q * pow3[n]);
  return ((uint16_t)v * 3) >> 8;
}

}  // namespace

void tq1_0_trits(const BlockTQ1_0& b, int8_t out[kQK_K]) {
  int8_t* y = out;
  for (size_t j = 0; j < sizeof(b.qs) - sizeof(b.qs) % 32; j += 32)
    for (int n = 0; n < 5; ++n)
      for (size_t m = 0; m < 32; ++m) *y++ = (int8_t)(tq1_digit(b.qs[j + m], n) - 1);
  for (size_t j = sizeof(b.qs) - sizeof(b.qs) % 32; j < sizeof(b.qs); j += 16)
    for (int n = 0; n < 5; ++n)
      for (size_t m = 0; m < 16; ++m) *y++ = (int8_t)(tq1_digit(b.qs[j + m], n) - 1);
  for (int n = 0; n < 4; ++n)
    for (size_t j = 0; j < sizeof(b.qh); ++j) *y++ = (int8_t)(tq1_digit(b.qh[j], n) - 1);
}

bool tq2_0_trits(const BlockTQ2_0& b, int8_t out[kQK_K]) {
  int8_t* y = out;
  for (size_t j = 0; j < sizeof(b.qs); j += 32)
    for (int l = 0; l < 4; ++l)
      for (size_t m = 0; m < 32; ++m) {
        const int q = (b.qs[j + m] >> (l * 2)) & 3;
        if (q == 3) return false;
        *y++ = (int8_t)(q - 1);
      }
  return true;
}

void dequantize_row_tq1_0(const BlockTQ1_0* b, int64_t n, float* out) {
  int8_t t[kQK_K];
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    tq1_0_trits(b[i], t);
    for (int j = 0; j < kQK_K; ++j) out[i * kQK_K + j] = (float)t[j] * d;
  }
}

void dequantize_row_tq2_0(const BlockTQ2_0* b, int64_t n, float* out) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    float* y = out + i * kQK_K;
    for (size_t j = 0; j < sizeof(b->qs); j += 32)
      for (int l = 0; l < 4; ++l)
        for (size_t m = 0; m < 32; ++m) *y++ = (float)(((b[i].qs[j + m] >> (l * 2)) & 3) - 1) * d;
  }
}

}  // namespace ultra
