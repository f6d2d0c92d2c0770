// FP8 E4M3 (float8_e4m3fn, the OCP / NVIDIA "E4M3" format): 1 sign bit, 4 exponent bits (bias 7), 3 mantissa
// bits; no infinities; S.1111.111 is NaN (the only NaN pattern), so the largest finite value is
// S.1111.110 = ±448. Subnormals: exponent 0, value = m/8 * 2^-6 (smallest 2^-9).
//
// Weights are stored as one E4M3 code per element with one f32 scale per output row (absmax / 448): the
// weight is decode(code) * scale. Encoding rounds to nearest, ties to even, and saturates: anything of
// magnitude >= 448 after rounding (infinities included) becomes ±448; NaN becomes the NaN code of its sign.
//
// Static inline (not inline): the SIMD files use these too (see core/dtype.h).
#pragma once

#include <cstdint>
#include <cstring>

namespace ultra {

constexpr float kFp8E4M3Max = 448.0f;

static inline bool fp8_e4m3_is_nan(uint8_t b) {
  return (b & 0x7f) == 0x7f;
}

static inline float fp8_e4m3_to_fp32(uint8_t b) {
  const uint32_t sign = (uint32_t)(b & 0x80) << 24;
  const uint32_t e = (b >> 3) & 0xf, m = b & 0x7;
  uint32_t bits;
  if (e == 0xf && m == 0x7) {
    bits = sign | 0x7fc00000u;  // NaN
  } else if (e == 0) {
    // m/8 * 2^-6 = m * 2^-9: exact in f32 as a normal number (or zero)
    float f = (float)m * (1.0f / 512.0f);
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  } else {
    bits = sign | ((e + 127 - 7) << 23) | (m << 20);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

static inline uint8_t fp32_to_fp8_e4m3(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint8_t sign = (uint8_t)((x >> 24) & 0x80);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return sign | 0x7f;   // NaN
  if (absx >= 0x43e00000u) return sign | 0x7e;  // >= 448 (and inf): saturate
  if (absx < 0x3c800000u) {                     // below 2^-6, the smallest normal: subnormal steps of 2^-9
    // absx * 2^9 is exact; round to the nearest integer, ties to even (0..8; 8 is the code of 2^-6)
    float a;
    std::memcpy(&a, &absx, 4);
    const float s = a * 512.0f;
    uint32_t q = (uint32_t)s;
    const float rem = s - (float)q;
    if (rem > 0.5f || (rem == 0.5f && (q & 1))) ++q;
    return sign | (uint8_t)q;
  }
  // normal: round the 23-bit mantissa to 3 bits (nearest even); a carry bumps the exponent, and the result
  // stays <= 448 (0x7e) because absx < 448
  const uint32_t lsb = (absx >> 20) & 1;
  const uint32_t r = absx + 0x7ffff + lsb;
  return sign | (uint8_t)((r >> 20) - ((127 - 7) << 3));
}

}  // namespace ultra
