#include "core/quantize_blocks.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace ultra {

namespace {

constexpr float kGroupMaxEps = 1e-15f;  // a (sub-)block whose absolute max is below this is all zero

// Round to nearest, ties to even, for |f| < 2^22: the bits of f + 1.5 * 2^23.
inline int nearest_int(float f) {
  const float v = f + 12582912.f;
  int i;
  std::memcpy(&i, &v, 4);
  return (i & 0x007fffff) - 0x00400000;
}

// Index of the level of the sorted values[16] nearest to x (the lower one when exactly between).
inline int best_index_int8(const int8_t* values, float x) {
  if (x <= values[0]) return 0;
  if (x >= values[15]) return 15;
  int lo = 0, hi = 15;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (x < values[mid])
      hi = mid;
    else
      lo = mid;
  }
  return x - values[hi - 1] < values[hi] - x ? hi - 1 : hi;
}

inline void store_f16(uint16_t* dst, float v) {
  *dst = fp32_to_fp16(v);
}

// The value of largest magnitude of x[n] (the first of equal magnitudes, 0 when all are 0); *amax gets
// its magnitude.
inline float max_by_magnitude(const float* x, int n, float* amax) {
  float max = 0;
  *amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > *amax) {
      *amax = ax;
      max = x[i];
    }
  }
  return max;
}

// ---- scale searches ----

// Signed codes L[n] in 0 .. 2 nmax - 1 (value l - nmax) with a scale: returns the scale. Weights: qw, or
// x^2 without them (rmse_type 1, the only one used here).
float make_qx_quants(int n, int nmax, const float* x, int8_t* L, const float* qw) {
  float amax;
  const float max = max_by_magnitude(x, n, &amax);
  if (amax < kGroupMaxEps) {
    std::memset(L, 0, n);
    return 0.f;
  }
  auto weight = [&](int i) { return qw ? qw[i] : x[i] * x[i]; };
  float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i])));
    L[i] = (int8_t)(l + nmax);
    const float w = weight(i);
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i])));
      const float w = weight(i);
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i)
        L[i] = (int8_t)(nmax + std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i]))));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Q3_K's search without importance weights: codes L[n] in 0 .. 2 nmax - 1 as make_qx_quants, refined by
// moving single codes while that improves (sum w x l)^2 / sum w l^2 (w = x^2).
float make_q3_quants(int n, int nmax, const float* x, int8_t* L) {
  float amax;
  const float max = max_by_magnitude(x, n, &amax);
  if (amax < kGroupMaxEps) {
    std::memset(L, 0, n);
    return 0.f;
  }
  const float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i])));
    L[i] = (int8_t)l;
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * L[i];
      if (slx > 0) {
        float sl2 = suml2 - w * L[i] * L[i];
        const int new_l = std::max(-nmax, std::min(nmax - 1, nearest_int(x[i] * sl2 / slx)));
        if (new_l != L[i]) {
          slx += w * x[i] * new_l;
          sl2 += w * new_l * new_l;
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = (int8_t)new_l;
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (!n_changed) break;
  }
  for (int i = 0; i < n; ++i) L[i] = (int8_t)(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Codes L[n] in 0 .. nmax with a scale and a min (value scale * l - *the_min): ggml's make_qkx2_quants
// (use_mad: absolute instead of squared error) and make_qkx3_quants (same search; the callers here always
// pass the weights). Trial k of 0 .. nstep uses the inverse scale (rmin + rdelta k + nmax) / (max - min).
float make_qkx_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min,
                      uint8_t* Laux, float rmin, float rdelta, int nstep, bool use_mad) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max <= min) {
    std::memset(L, 0, n);
    *the_min = -min;
    return 0.f;
  }
  auto err = [use_mad](float diff) { return use_mad ? std::fabs(diff) : diff * diff; };
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = (uint8_t)std::max(0, std::min(nmax, l));
    const float diff = scale * L[i] + min - x[i];
    best_error += weights[i] * err(diff);
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - min))));
      Laux[i] = (uint8_t)l;
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * Laux[i] + this_min - x[i];
        cur_error += weights[i] * err(diff);
      }
      if (cur_error < best_error) {
        std::memcpy(L, Laux, n);
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// Unsigned codes L[n] in 0 .. nmax of the non-negative x[n] (sub-block scales or mins) with weights qw:
// 9 trial scales by weighted squared error, then up to 5 passes moving single codes. Returns the scale.
float make_qp_quants(int n, int nmax, const float* x, uint8_t* L, const float* qw) {
  float max = 0;
  for (int i = 0; i < n; ++i) max = std::max(max, x[i]);
  if (max < kGroupMaxEps) {
    std::memset(L, 0, n);
    return 0.f;
  }
  float iscale = nmax / max;
  for (int i = 0; i < n; ++i) L[i] = (uint8_t)nearest_int(iscale * x[i]);
  const float scale = 1 / iscale;
  float best_mse = 0;
  for (int i = 0; i < n; ++i) {
    const float diff = x[i] - scale * L[i];
    best_mse += qw[i] * diff * diff;
  }
  for (int is = -4; is <= 4; ++is) {
    if (is == 0) continue;
    const float iscale_is = (0.1f * is + nmax) / max;
    const float scale_is = 1 / iscale_is;
    float mse = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::min(nmax, nearest_int(iscale_is * x[i]));
      const float diff = x[i] - scale_is * l;
      mse += qw[i] * diff * diff;
    }
    if (mse < best_mse) {
      best_mse = mse;
      iscale = iscale_is;
    }
  }
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::min(nmax, nearest_int(iscale * x[i]));
    L[i] = (uint8_t)l;
    const float w = qw[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = qw[i];
      float slx = sumlx - w * x[i] * L[i];
      float sl2 = suml2 - w * L[i] * L[i];
      if (slx > 0 && sl2 > 0) {
        const int new_l = std::min(nmax, nearest_int(x[i] * sl2 / slx));
        if (new_l != L[i]) {
          slx += w * x[i] * new_l;
          sl2 += w * new_l * new_l;
          if (slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = (uint8_t)new_l;
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (!n_changed) break;
  }
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// ---- bit packing shared by several types ----

// 32 codes (0..15) -> 16 bytes: element j in the low nibble of byte j, element j + 16 in its high nibble.
inline void pack_nibbles32(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
}
// 32 codes (0..31) -> Q5_0 / Q5_1's nibbles and the u32 of fifth bits.
inline void pack_q5(const uint8_t* L, uint8_t* qs, uint8_t* qh_bytes) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = (uint8_t)((L[j] & 0x0F) | ((L[j + 16] & 0x0F) << 4));
    qh |= ((L[j] & 0x10u) >> 4) << j;
    qh |= ((L[j + 16] & 0x10u) >> 4) << (j + 16);
  }
  std::memcpy(qh_bytes, &qh, 4);
}
// 256 2-bit codes -> Q2_K / Q3_K's 64 bytes (byte l of half h: elements 128 h + l + 32 s, s = 0..3).
inline void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < kQK_K; j += 128)
    for (int l = 0; l < 32; ++l)
      qs[j / 4 + l] =
          (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}
// Q4_K / Q5_K: the 6-bit scale and min codes of sub-block j into the 12 scale bytes.
inline void pack_scale_min_k4(int j, uint8_t ls, uint8_t lm, uint8_t* s) {
  if (j < 4) {
    s[j] = ls;
    s[j + 4] = lm;
  } else {
    s[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
    s[j - 4] |= (uint8_t)((ls >> 4) << 6);
    s[j - 0] |= (uint8_t)((lm >> 4) << 6);
  }
}
// Q3_K: the 6-bit code l (0..63) of sub-block j into the 12 scale bytes (zeroed before sub-block 0).
inline void pack_scale_q3k(int j, int l, uint8_t* s) {
  if (j < 8)
    s[j] = (uint8_t)(l & 0xF);
  else
    s[j - 8] |= (uint8_t)((l & 0xF) << 4);
  l >>= 4;
  s[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
}

// sum of x[n]^2 in order
inline float sum_sq(const float* x, int64_t n) {
  float s = 0;
  for (int64_t j = 0; j < n; ++j) s += x[j] * x[j];
  return s;
}

// ---- legacy 32-element types ----

// Q4_0 / Q5_0 without weights (nmax 8 / 16): d = max / -nmax (max: the value of largest magnitude), codes
// x / d + nmax rounded half up, at most 2 nmax - 1.
template <class B>
void qx_0_plain(const float* x, B& y, int nmax, uint8_t* L) {
  float amax;
  const float max = max_by_magnitude(x, 32, &amax);
  const float d = max / -nmax;
  const float id = d ? 1.0f / d : 0.0f;
  store_f16(&y.d, d);
  const float offset = nmax + 0.5f;  // 8.5f / 16.5f, exact
  for (int j = 0; j < 32; ++j) L[j] = (uint8_t)std::min(2 * nmax - 1, (int)(int8_t)(x[j] * id + offset));
}
// Q4_1 / Q5_1 without weights: d = (max - min) / nmax, m = min. (Q5_1's codes are not clamped: ggml's.)
template <class B>
void qx_1_plain(const float* x, B& y, int nmax, uint8_t* L) {
  float min = FLT_MAX, max = -FLT_MAX;
  for (int j = 0; j < 32; ++j) {
    if (x[j] < min) min = x[j];
    if (x[j] > max) max = x[j];
  }
  const float d = (max - min) / nmax;
  const float id = d ? 1.0f / d : 0.0f;
  store_f16(&y.d, d);
  store_f16(&y.m, min);
  for (int j = 0; j < 32; ++j) {
    const float v = (x[j] - min) * id;
    L[j] = nmax == 15 ? (uint8_t)std::min(15, (int)(int8_t)(v + 0.5f)) : (uint8_t)(v + 0.5f);
  }
}

// The legacy types with importance weights: per 32-block, weights qw * sqrt(sigma2 + x^2), sigma2 the
// row's mean square.
void legacy_weighted(GgmlType t, const float* x, int64_t n, void* dst, const float* imatrix) {
  const float sigma2 = sum_sq(x, n) / n;
  float weight[32];
  uint8_t L[32], Laux[32];
  int8_t Ls[32];
  for (int64_t ib = 0; ib < n / 32; ++ib) {
    const float* xb = x + 32 * ib;
    const float* qw = imatrix + 32 * ib;
    for (int j = 0; j < 32; ++j) weight[j] = qw[j] * std::sqrt(sigma2 + xb[j] * xb[j]);
    switch (t) {
      case GgmlType::Q4_0: {
        auto& y = static_cast<BlockQ4_0*>(dst)[ib];
        store_f16(&y.d, make_qx_quants(32, 8, xb, Ls, weight));
        pack_nibbles32(reinterpret_cast<uint8_t*>(Ls), y.qs);
        break;
      }
      case GgmlType::Q5_0: {
        auto& y = static_cast<BlockQ5_0*>(dst)[ib];
        store_f16(&y.d, make_qx_quants(32, 16, xb, Ls, weight));
        pack_q5(reinterpret_cast<uint8_t*>(Ls), y.qs, y.qh);
        break;
      }
      case GgmlType::Q4_1: {
        auto& y = static_cast<BlockQ4_1*>(dst)[ib];
        float min;
        store_f16(&y.d, make_qkx_quants(32, 15, xb, weight, L, &min, Laux, -0.9f, 0.05f, 36, false));
        store_f16(&y.m, -min);
        pack_nibbles32(L, y.qs);
        break;
      }
      default: {  // Q5_1
        auto& y = static_cast<BlockQ5_1*>(dst)[ib];
        float min;
        store_f16(&y.d, make_qkx_quants(32, 31, xb, weight, L, &min, Laux, -0.9f, 0.05f, 36, false));
        store_f16(&y.m, -min);
        pack_q5(L, y.qs, y.qh);
        break;
      }
    }
  }
}

// ---- k-quants: one 256-element super-block each ----

// Q2_K: 16 sub-blocks of 16, 2-bit codes with a 4-bit scale and min each.
void q2_k_block(const float* x, BlockQ2_K& y, const float* qw) {
  uint8_t L[kQK_K], Laux[16];
  float weight[16], mins[16], scales[16];
  if (!qw) {
    constexpr float q4scale = 15.f;
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) weight[l] = std::fabs(x[16 * j + l]);
      scales[j] =
          make_qkx_quants(16, 3, x + 16 * j, weight, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    if (max_scale > 0) {
      const float iscale = q4scale / max_scale;
      for (int j = 0; j < 16; ++j) y.scales[j] = (uint8_t)nearest_int(iscale * scales[j]);
      store_f16(&y.d, max_scale / q4scale);
    } else {
      std::memset(y.scales, 0, 16);
      store_f16(&y.d, 0.f);
    }
    if (max_min > 0) {
      const float iscale = q4scale / max_min;
      for (int j = 0; j < 16; ++j) y.scales[j] |= (uint8_t)(nearest_int(iscale * mins[j]) << 4);
      store_f16(&y.dmin, max_min / q4scale);
    } else {
      store_f16(&y.dmin, 0.f);
    }
  } else {
    float sw[16];
    uint8_t Ls[16], Lm[16];
    const float sigma2 = sum_sq(x, kQK_K) / kQK_K;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l)
        weight[l] = qw[16 * j + l] * std::sqrt(sigma2 + x[16 * j + l] * x[16 * j + l]);
      sw[j] = 0;
      for (int l = 0; l < 16; ++l) sw[j] += weight[l];
      scales[j] =
          make_qkx_quants(16, 3, x + 16 * j, weight, L + 16 * j, &mins[j], Laux, -0.9f, 0.05f, 36, false);
    }
    store_f16(&y.d, make_qp_quants(16, 15, scales, Ls, sw));
    store_f16(&y.dmin, make_qp_quants(16, 15, mins, Lm, sw));
    for (int j = 0; j < 16; ++j) y.scales[j] = (uint8_t)(Ls[j] | (Lm[j] << 4));
  }
  const float dm = fp16_to_fp32(y.d), mm = fp16_to_fp32(y.dmin);
  for (int j = 0; j < 16; ++j) {  // the codes again, for the stored scales
    const float d = dm * (y.scales[j] & 0xF);
    if (!d) continue;
    const float m = mm * (y.scales[j] >> 4);
    for (int ii = 0; ii < 16; ++ii)
      L[16 * j + ii] = (uint8_t)std::max(0, std::min(3, nearest_int((x[16 * j + ii] + m) / d)));
  }
  pack_2bit(L, y.qs);
}

// Q3_K: 16 sub-blocks of 16, 3-bit signed codes (2 bits in qs, 1 in hmask) with a 6-bit signed scale.
void q3_k_block(const float* x, BlockQ3_K& y, const float* qw) {
  int8_t L[kQK_K];
  float scales[16];
  std::memset(y.scales, 0, 12);
  if (!qw) {
    float max_scale = 0, amax = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
      const float scale = std::fabs(scales[j]);
      if (scale > amax) {
        amax = scale;
        max_scale = scales[j];
      }
    }
    if (max_scale) {
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < 16; ++j) {
        int8_t l = (int8_t)nearest_int(iscale * scales[j]);
        l = (int8_t)(std::max(-32, std::min(31, (int)l)) + 32);
        pack_scale_q3k(j, l, y.scales);
      }
      store_f16(&y.d, 1 / iscale);
    } else {
      store_f16(&y.d, 0.f);
    }
  } else {
    float weight[16], sw[16];
    int8_t Ls[16];
    const float sigma2 = 2 * sum_sq(x, kQK_K) / kQK_K;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l)
        weight[l] = qw[16 * j + l] * std::sqrt(sigma2 + x[16 * j + l] * x[16 * j + l]);
      float sumw = 0;
      for (int l = 0; l < 16; ++l) sumw += weight[l];
      sw[j] = sumw;
      scales[j] = make_qx_quants(16, 4, x + 16 * j, L + 16 * j, weight);
    }
    const float d_block = make_qx_quants(16, 32, scales, Ls, sw);
    for (int j = 0; j < 16; ++j) pack_scale_q3k(j, Ls[j], y.scales);
    store_f16(&y.d, d_block);
  }
  int8_t sc[16];
  q3k_scales(y.scales, sc);
  for (int j = 0; j < 16; ++j) {
    const float d = fp16_to_fp32(y.d) * sc[j];
    if (!d) continue;
    for (int ii = 0; ii < 16; ++ii)
      L[16 * j + ii] = (int8_t)(std::max(-4, std::min(3, nearest_int(x[16 * j + ii] / d))) + 4);
  }
  // high bit of element j: bit j / 32 of hmask[j % 32]
  std::memset(y.hmask, 0, 32);
  uint8_t low[kQK_K];
  for (int j = 0; j < kQK_K; ++j) {
    low[j] = (uint8_t)L[j];
    if (L[j] > 3) {
      y.hmask[j % 32] |= (uint8_t)(1u << (j / 32));
      low[j] = (uint8_t)(L[j] - 4);
    }
  }
  pack_2bit(low, y.qs);
}

// Q4_K / Q5_K (nmax 15 / 31): 8 sub-blocks of 32 with 6-bit scale and min codes. L[256] gets the codes.
template <class B>
void q45_k_scales(const float* x, B& y, const float* qw, int nmax, uint8_t* L) {
  uint8_t Laux[32];
  float weights[32], mins[8], scales[8];
  std::memset(y.scales, 0, 12);
  if (!qw) {
    const float rmin = nmax == 15 ? -1.f : -0.5f;
    const int nstep = nmax == 15 ? 20 : 15;
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
      const float av_x = std::sqrt(sum_sq(x + 32 * j, 32) / 32);
      for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
      scales[j] = make_qkx_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f,
                                  nstep, false);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < 8; ++j) {
      const uint8_t ls = std::min<uint8_t>(63, (uint8_t)nearest_int(inv_scale * scales[j]));
      const uint8_t lm = std::min<uint8_t>(63, (uint8_t)nearest_int(inv_min * mins[j]));
      pack_scale_min_k4(j, ls, lm, y.scales);
    }
    store_f16(&y.d, max_scale / 63.f);
    store_f16(&y.dmin, max_min / 63.f);
  } else {
    float sw[8];
    uint8_t Ls[8], Lm[8];
    const float sigma2 = 2 * sum_sq(x, kQK_K) / kQK_K;
    for (int j = 0; j < 8; ++j) {
      for (int l = 0; l < 32; ++l)
        weights[l] = qw[32 * j + l] * std::sqrt(sigma2 + x[32 * j + l] * x[32 * j + l]);
      float sumw = 0;
      for (int l = 0; l < 32; ++l) sumw += weights[l];
      sw[j] = sumw;
      scales[j] =
          make_qkx_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -0.9f, 0.05f, 36, false);
    }
    const float d_block = make_qp_quants(8, 63, scales, Ls, sw);
    const float m_block = make_qp_quants(8, 63, mins, Lm, sw);
    for (int j = 0; j < 8; ++j) {
      // (ggml clamps the codes to 63 for Q5_K only; make_qp_quants keeps them <= 63 anyway)
      const uint8_t ls = nmax == 31 ? std::min<uint8_t>(63, Ls[j]) : Ls[j];
      const uint8_t lm = nmax == 31 ? std::min<uint8_t>(63, Lm[j]) : Lm[j];
      pack_scale_min_k4(j, ls, lm, y.scales);
    }
    store_f16(&y.d, d_block);
    store_f16(&y.dmin, m_block);
  }
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    q4k_scale_min(j, y.scales, &sc, &m);
    const float d = fp16_to_fp32(y.d) * sc;
    if (!d) continue;
    const float dm = fp16_to_fp32(y.dmin) * m;
    for (int ii = 0; ii < 32; ++ii)
      L[32 * j + ii] = (uint8_t)std::max(0, std::min(nmax, nearest_int((x[32 * j + ii] + dm) / d)));
  }
}

void q4_k_block(const float* x, BlockQ4_K& y, const float* qw) {
  uint8_t L[kQK_K];
  q45_k_scales(x, y, qw, 15, L);
  for (int g = 0; g < 4; ++g)
    for (int l = 0; l < 32; ++l) y.qs[32 * g + l] = (uint8_t)(L[64 * g + l] | (L[64 * g + l + 32] << 4));
}

void q5_k_block(const float* x, BlockQ5_K& y, const float* qw) {
  uint8_t L[kQK_K];
  q45_k_scales(x, y, qw, 31, L);
  std::memset(y.qh, 0, 32);
  for (int g = 0; g < 4; ++g) {
    for (int j = 0; j < 32; ++j) {
      int l1 = L[64 * g + j], l2 = L[64 * g + j + 32];
      if (l1 > 15) {
        l1 -= 16;
        y.qh[j] |= (uint8_t)(1u << (2 * g));
      }
      if (l2 > 15) {
        l2 -= 16;
        y.qh[j] |= (uint8_t)(2u << (2 * g));
      }
      y.qs[32 * g + j] = (uint8_t)(l1 | (l2 << 4));
    }
  }
}

// Q6_K: 16 sub-blocks of 16, 6-bit signed codes with an 8-bit signed scale. With importance weights the
// sub-block search uses them as they are (ggml's choice).
void q6_k_block(const float* x, BlockQ6_K& y, const float* qw) {
  int8_t L[kQK_K];
  float scales[16];
  float max_scale = 0, max_abs_scale = 0;
  for (int ib = 0; ib < 16; ++ib) {
    scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, qw ? qw + 16 * ib : nullptr);
    const float abs_scale = std::fabs(scales[ib]);
    if (abs_scale > max_abs_scale) {
      max_abs_scale = abs_scale;
      max_scale = scales[ib];
    }
  }
  if (max_abs_scale < kGroupMaxEps) {
    std::memset(&y, 0, sizeof y);
    return;
  }
  const float iscale = -128.f / max_scale;
  store_f16(&y.d, 1 / iscale);
  for (int ib = 0; ib < 16; ++ib) y.scales[ib] = (int8_t)std::min(127, nearest_int(iscale * scales[ib]));
  for (int j = 0; j < 16; ++j) {
    const float d = fp16_to_fp32(y.d) * y.scales[j];
    if (!d) continue;
    for (int ii = 0; ii < 16; ++ii)
      L[16 * j + ii] = (int8_t)(std::max(-32, std::min(31, nearest_int(x[16 * j + ii] / d))) + 32);
  }
  for (int h = 0; h < 2; ++h) {
    const int8_t* Lh = L + 128 * h;
    uint8_t* ql = y.ql + 64 * h;
    uint8_t* qh = y.qh + 32 * h;
    for (int l = 0; l < 32; ++l) {
      ql[l] = (uint8_t)((Lh[l] & 0xF) | ((Lh[l + 64] & 0xF) << 4));
      ql[l + 32] = (uint8_t)((Lh[l + 32] & 0xF) | ((Lh[l + 96] & 0xF) << 4));
      qh[l] = (uint8_t)((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                        ((Lh[l + 96] >> 4) << 6));
    }
  }
}

// ---- IQ4_NL (one 32-element block) / IQ4_XS (a 256-element super-block of 8) ----

// x[sbs] (sbs = 32 or 256) -> codes into kIq4nlValues, the f16 scale *dh and, for IQ4_XS, the 6-bit
// sub-block scales. Per 32-block, the trial inverse scales (k + values[0]) / max for k = -7 .. 7.
void iq4_block(int sbs, const float* x, uint16_t* dh, uint8_t* q4, uint16_t* scales_h, uint8_t* scales_l,
               const float* qw) {
  constexpr int ntry = 7;
  const int8_t* values = kIq4nlValues;
  uint8_t L[kQK_K];
  float weight[32], scales[8];
  float sigma2 = sum_sq(x, sbs);
  sigma2 *= 2.f / sbs;
  store_f16(dh, 0.f);
  float max_scale = 0, amax_scale = 0;
  for (int ib = 0; ib < sbs / 32; ++ib) {
    const float* xb = x + 32 * ib;
    uint8_t* Lb = L + 32 * ib;
    if (qw)
      for (int j = 0; j < 32; ++j) weight[j] = qw[32 * ib + j] * std::sqrt(sigma2 + xb[j] * xb[j]);
    else
      for (int j = 0; j < 32; ++j) weight[j] = xb[j] * xb[j];
    float amax;
    const float max = max_by_magnitude(xb, 32, &amax);
    if (amax < kGroupMaxEps) {
      scales[ib] = 0;
      continue;
    }
    float d = -max / values[0];
    float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < 32; ++j) {
      const int l = best_index_int8(values, id * xb[j]);
      Lb[j] = (uint8_t)l;
      const float q = values[l];
      const float w = weight[j];
      sumqx += w * q * xb[j];
      sumq2 += w * q * q;
    }
    d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
    float best = d * sumqx;
    for (int itry = -ntry; itry <= ntry; ++itry) {
      id = (itry + values[0]) / max;
      sumqx = sumq2 = 0;
      for (int j = 0; j < 32; ++j) {
        const float q = values[best_index_int8(values, id * xb[j])];
        const float w = weight[j];
        sumqx += w * q * xb[j];
        sumq2 += w * q * q;
      }
      if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
        d = sumqx / sumq2;
        best = d * sumqx;
      }
    }
    scales[ib] = d;
    const float abs_d = std::fabs(d);
    if (abs_d > amax_scale) {
      amax_scale = abs_d;
      max_scale = d;
    }
  }
  if (sbs > 32) {
    *scales_h = 0;
    const float d = -max_scale / 32;
    store_f16(dh, d);
    const float id = d ? 1 / d : 0.f;
    for (int ib = 0; ib < sbs / 32; ++ib) {
      int l = std::max(-32, std::min(31, nearest_int(id * scales[ib])));
      const float dl = d * l;
      const float idl = dl ? 1 / dl : 0.f;
      for (int j = 0; j < 32; ++j) L[32 * ib + j] = (uint8_t)best_index_int8(values, idl * x[32 * ib + j]);
      l += 32;
      if (ib % 2 == 0)
        scales_l[ib / 2] = (uint8_t)(l & 0xf);
      else
        scales_l[ib / 2] |= (uint8_t)((l & 0xf) << 4);
      *scales_h |= (uint16_t)((l >> 4) << 2 * (ib % 8));
    }
  } else {
    store_f16(dh, scales[0]);
    const float id = scales[0] ? 1 / scales[0] : 0;
    for (int j = 0; j < 32; ++j) L[j] = (uint8_t)best_index_int8(values, id * x[j]);
  }
  for (int i = 0; i < sbs / 32; ++i) pack_nibbles32(L + 32 * i, q4 + 16 * i);
}

}  // namespace

bool can_quantize_blocks(GgmlType t) {
  return is_block_quant(t) && t != GgmlType::Q8_0 && t != GgmlType::Q8_1 && t != GgmlType::MXFP4;
}

void quantize_row_q8_K(const float* x, int64_t n, BlockQ8_K* y) {
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    float amax;
    const float max = max_by_magnitude(x, kQK_K, &amax);
    if (!amax) {
      y[i].d = 0;
      std::memset(y[i].qs, 0, kQK_K);
      std::memset(y[i].bsums, 0, sizeof y[i].bsums);  // (ggml leaves them as they were)
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < kQK_K; ++j) y[i].qs[j] = (int8_t)std::min(127, nearest_int(iscale * x[j]));
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int ii = 0; ii < 16; ++ii) sum += y[i].qs[16 * j + ii];
      y[i].bsums[j] = (int16_t)sum;
    }
    y[i].d = 1 / iscale;
  }
}

void quantize_row(GgmlType t, const float* x, int64_t n, void* dst, const float* imatrix) {
  if (!can_quantize_blocks(t)) fail("quantize_row: cannot write type {}", type_name(t));
  const int block = type_traits(t)->block_elems;
  if (n <= 0 || n % block != 0)
    fail("quantize_row: a row of {} values is not a whole number of {} blocks of {}", n, type_name(t), block);
  const int64_t nb = n / block;
  switch (t) {
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
      if (imatrix) return legacy_weighted(t, x, n, dst, imatrix);
      for (int64_t i = 0; i < nb; ++i) {
        const float* xb = x + 32 * i;
        uint8_t L[32];
        if (t == GgmlType::Q4_0) {
          auto& y = static_cast<BlockQ4_0*>(dst)[i];
          qx_0_plain(xb, y, 8, L);
          pack_nibbles32(L, y.qs);
        } else if (t == GgmlType::Q5_0) {
          auto& y = static_cast<BlockQ5_0*>(dst)[i];
          qx_0_plain(xb, y, 16, L);
          pack_q5(L, y.qs, y.qh);
        } else if (t == GgmlType::Q4_1) {
          auto& y = static_cast<BlockQ4_1*>(dst)[i];
          qx_1_plain(xb, y, 15, L);
          pack_nibbles32(L, y.qs);
        } else {
          auto& y = static_cast<BlockQ5_1*>(dst)[i];
          qx_1_plain(xb, y, 31, L);
          pack_q5(L, y.qs, y.qh);
        }
      }
      return;
    case GgmlType::Q8_K:
      return quantize_row_q8_K(x, n, static_cast<BlockQ8_K*>(dst));
    case GgmlType::IQ4_NL:
      for (int64_t i = 0; i < nb; ++i) {
        auto& y = static_cast<BlockIQ4_NL*>(dst)[i];
        iq4_block(32, x + 32 * i, &y.d, y.qs, nullptr, nullptr, imatrix ? imatrix + 32 * i : nullptr);
      }
      return;
    case GgmlType::IQ4_XS:
      for (int64_t i = 0; i < nb; ++i) {
        auto& y = static_cast<BlockIQ4_XS*>(dst)[i];
        iq4_block(kQK_K, x + kQK_K * i, &y.d, y.qs, &y.scales_h, y.scales_l,
                  imatrix ? imatrix + kQK_K * i : nullptr);
      }
      return;
    default:
      break;
  }
  for (int64_t i = 0; i < nb; ++i) {  // the k-quants
    const float* xb = x + kQK_K * i;
    const float* qw = imatrix ? imatrix + kQK_K * i : nullptr;
    switch (t) {
      case GgmlType::Q2_K:
        q2_k_block(xb, static_cast<BlockQ2_K*>(dst)[i], qw);
        break;
      case GgmlType::Q3_K:
        q3_k_block(xb, static_cast<BlockQ3_K*>(dst)[i], qw);
        break;
      case GgmlType::Q4_K:
        q4_k_block(xb, static_cast<BlockQ4_K*>(dst)[i], qw);
        break;
      case GgmlType::Q5_K:
        q5_k_block(xb, static_cast<BlockQ5_K*>(dst)[i], qw);
        break;
      default:
        q6_k_block(xb, static_cast<BlockQ6_K*>(dst)[i], qw);
        break;
    }
  }
}

}  // namespace ultra
