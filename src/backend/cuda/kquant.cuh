// Device decoding of the GGUF block types (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) in their device layout
// (gemv_kquant.h), used by the GEMV, the BF16 dequantisation and the embedding lookup. A row is cut into
// units of 32 weights, each read from 16 bytes of 4-bit codes (plus the block's scales and high bits): unit k
// holds two groups of 16 consecutive columns (kq_col), the low and the high nibbles of its 16 code bytes.
// Every decoded weight is the f32 value of the CPU's dequant_block, with the same operations (a product of
// exact factors, then at most one rounding: the fma of Q4_K / Q5_K is the CPU's d * sc * q - dmin * m, whose
// product is exact).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/common.cuh"
#include "core/views.h"

namespace ultra::cuda::detail {

// The loads of one unit (which fields each type uses: kq_load).
struct KqUnit {
  uint4 a;     // Q4_K / Q5_K: block header (d, dmin, scales[12]); Q6_K: scales[16]
  uint4 b;     // the 16 bytes of 4-bit codes
  uint4 c;     // Q5_K: qh[16]; Q6_K: qh[16]
  uint32_t d;  // Q6_K and the 32-element types: the block's f16 d
  uint32_t m;  // Q4_1 / Q5_1: the block's f16 m
  uint32_t h;  // Q5_0 / Q5_1: the block's qh (bit j: fifth bit of element j)
};

// The 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1): the device row is qs[16] of every block, then (Q5_*)
// the 4-byte qh of every block, then the f16 d, then (Q4_1 / Q5_1) the f16 m.
__host__ __device__ constexpr bool kq_legacy(GgmlType t) {
  return t == GgmlType::Q4_0 || t == GgmlType::Q4_1 || t == GgmlType::Q5_0 || t == GgmlType::Q5_1;
}
__host__ __device__ constexpr bool kq_has_qh(GgmlType t) {
  return t == GgmlType::Q5_0 || t == GgmlType::Q5_1;
}
__host__ __device__ constexpr bool kq_has_m(GgmlType t) {
  return t == GgmlType::Q4_1 || t == GgmlType::Q5_1;
}

// Bits 0..3 of b moved to bit 4 of bytes 0..3 (the four products b << 0, 7, 14, 21 do not overlap).
__device__ __forceinline__ uint32_t kq_spread4(uint32_t b) {
  return ((b * 0x00204081u) & 0x01010101u) << 4;
}

__device__ __forceinline__ float f16_bits(uint32_t h) {
  return __half2float(__ushort_as_half((unsigned short)(h & 0xFFFFu)));
}

// Byte e (0..3, compile-time) of u as f32, minus bias - 2^23 (exact: the byte is placed in the mantissa of
// 2^23, then 2^23 + offset subtracted).
template <int E>
__device__ __forceinline__ float kq_byte(uint32_t u, float bias) {
  return __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7540u | E)) - bias;
}

// Byte i (0..15, run time) of a 16-byte vector.
__device__ __forceinline__ uint32_t kq_byte_of(const uint4& v, int i) {
  const uint32_t w = i < 4 ? v.x : i < 8 ? v.y : i < 12 ? v.z : v.w;
  return (w >> (8 * (i & 3))) & 0xFFu;
}

// Units per row.
__device__ __forceinline__ int kq_units(int64_t cols) {
  return (int)(cols / 32);
}

// First column of group g (0: low nibbles, 1: high nibbles) of unit k.
template <GgmlType T>
__device__ __forceinline__ int kq_col(int k, int g) {
  if constexpr (kq_legacy(T)) {
    return 32 * k + 16 * g;
  } else if constexpr (T == GgmlType::Q6_K) {  // ql bytes 16 i: half i / 4, 16 (i % 4) + 64 g of it
    return 256 * (k >> 3) + 128 * ((k & 7) >> 2) + 16 * (k & 3) + 64 * g;
  } else {  // Q4_K / Q5_K: qs bytes 16 i: 64-group i / 2, 16 (i % 2) + 32 g of it
    return 256 * (k >> 3) + 64 * ((k & 7) >> 1) + 16 * (k & 1) + 32 * g;
  }
}

// The unit, group and element of column c (the inverse of kq_col).
template <GgmlType T>
__device__ __forceinline__ void kq_locate(int c, int* k, int* g, int* e) {
  *e = c & 15;
  if constexpr (kq_legacy(T)) {
    *k = c >> 5, *g = (c >> 4) & 1;
  } else if constexpr (T == GgmlType::Q6_K) {
    const int cb = c & 255;
    *g = (cb >> 6) & 1, *k = 8 * (c >> 8) + 4 * (cb >> 7) + ((cb >> 4) & 3);
  } else {
    const int cb = c & 255;
    *g = (cb >> 5) & 1, *k = 8 * (c >> 8) + 2 * (cb >> 6) + ((cb >> 4) & 1);
  }
}

template <GgmlType T>
__device__ __forceinline__ KqUnit kq_load(const uint8_t* row, int64_t cols, int k) {
  KqUnit u;
  const int b = kq_legacy(T) ? k : k >> 3, i = k & 7;
  if constexpr (T == GgmlType::Q4_K) {
    const uint8_t* blk = row + 144 * (int64_t)b;
    u.a = ld_stream16(blk);
    u.b = ld_stream16(blk + 16 + 16 * i);
  } else if constexpr (T == GgmlType::Q5_K) {
    const uint8_t* blk = row + 176 * (int64_t)b;
    u.a = ld_stream16(blk);
    u.c = ld_stream16(blk + 16 + 16 * (i & 1));
    u.b = ld_stream16(blk + 48 + 16 * i);
  } else if constexpr (T == GgmlType::Q6_K) {
    const uint8_t* blk = row + 208 * (int64_t)b;
    u.b = ld_stream16(blk + 16 * i);
    u.c = ld_stream16(blk + 128 + 32 * (i >> 2) + 16 * (i & 1));
    u.a = ld_stream16(blk + 192);
    u.d = __ldg(reinterpret_cast<const unsigned short*>(row + 208 * (cols >> 8)) + b);
  } else {  // 32-element blocks
    const int64_t nb = cols >> 5;
    u.b = ld_stream16(row + 16 * (int64_t)b);
    const uint8_t* tail = row + 16 * nb;
    if constexpr (kq_has_qh(T)) {
      u.h = __ldg(reinterpret_cast<const unsigned int*>(tail) + b);
      tail += 4 * nb;
    }
    u.d = __ldg(reinterpret_cast<const unsigned short*>(tail) + b);
    if constexpr (kq_has_m(T)) u.m = __ldg(reinterpret_cast<const unsigned short*>(tail + 2 * nb) + b);
  }
  return u;
}

// Q4_K / Q5_K scale and min codes of sub-block j (0..7) from the 12 scale bytes (header bytes 4..15).
__device__ __forceinline__ void kq_scale_min(const uint4& h, int j, uint32_t* sc, uint32_t* m) {
  const uint4 s = make_uint4(h.y, h.z, h.w, 0u);  // scales[0..11]
  if (j < 4) {
    *sc = kq_byte_of(s, j) & 63u;
    *m = kq_byte_of(s, j + 4) & 63u;
  } else {
    *sc = (kq_byte_of(s, j + 4) & 0xFu) | ((kq_byte_of(s, j - 4) >> 6) << 4);
    *m = (kq_byte_of(s, j + 4) >> 4) | ((kq_byte_of(s, j) >> 6) << 4);
  }
}

// Types whose weights are A * q + B with a minimum B (Q4_1, Q5_1, Q4_K, Q5_K); the others are A * q with
// the code's offset already in q.
__host__ __device__ constexpr bool kq_has_min(GgmlType t) {
  return t == GgmlType::Q4_1 || t == GgmlType::Q5_1 || t == GgmlType::Q4_K || t == GgmlType::Q5_K;
}

// The codes of unit k as bytes: lo[p] / hi[p] hold the codes of columns kq_col(k, 0) + 4 p .. + 3 and
// kq_col(k, 1) + 4 p .. + 3 (byte e of a word: column + e; codes 0..63, so also valid signed bytes), and
// each group's scale a[g] and minimum b[g] (0 where kq_has_min is false): the weight is a * (q - K) + b with
// K = kq_offset(T), as the CPU's dequant_block computes it.
template <GgmlType T>
__host__ __device__ constexpr int kq_offset() {
  return T == GgmlType::Q4_0 ? 8 : T == GgmlType::Q5_0 ? 16 : T == GgmlType::Q6_K ? 32 : 0;
}

template <GgmlType T>
__device__ __forceinline__ void kq_words(const KqUnit& u, int k, uint32_t (&lo)[4], uint32_t (&hi)[4],
                                         float (&a)[2], float (&b)[2]) {
  const uint32_t c[4] = {u.b.x, u.b.y, u.b.z, u.b.w};
  if constexpr (kq_legacy(T)) {
    a[0] = a[1] = f16_bits(u.d);
    b[0] = b[1] = kq_has_m(T) ? f16_bits(u.m) : 0.0f;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      lo[p] = c[p] & 0x0F0F0F0Fu, hi[p] = (c[p] >> 4) & 0x0F0F0F0Fu;
      if constexpr (kq_has_qh(T)) {
        lo[p] |= kq_spread4((u.h >> (4 * p)) & 0xFu);
        hi[p] |= kq_spread4((u.h >> (16 + 4 * p)) & 0xFu);
      }
    }
  } else if constexpr (T == GgmlType::Q6_K) {
    const int i = k & 7, half = i >> 2, r = i & 3, sh = 2 * (r >> 1);
    const float d = f16_bits(u.d);
    a[0] = d * (float)(int8_t)kq_byte_of(u.a, 8 * half + r);
    a[1] = d * (float)(int8_t)kq_byte_of(u.a, 8 * half + r + 4);
    b[0] = b[1] = 0.0f;
    const uint32_t h[4] = {u.c.x, u.c.y, u.c.z, u.c.w};
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      lo[p] = (c[p] & 0x0F0F0F0Fu) | (((h[p] >> sh) & 0x03030303u) << 4);
      hi[p] = ((c[p] >> 4) & 0x0F0F0F0Fu) | (((h[p] >> (sh + 4)) & 0x03030303u) << 4);
    }
  } else {  // Q4_K / Q5_K
    const int j = (k & 7) >> 1;
    const float d = f16_bits(u.a.x), dmin = f16_bits(u.a.x >> 16);
    uint32_t sc, m;
    kq_scale_min(u.a, 2 * j, &sc, &m);
    a[0] = d * (float)sc, b[0] = -(dmin * (float)m);
    kq_scale_min(u.a, 2 * j + 1, &sc, &m);
    a[1] = d * (float)sc, b[1] = -(dmin * (float)m);
    const uint32_t h[4] = {u.c.x, u.c.y, u.c.z, u.c.w};
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      lo[p] = c[p] & 0x0F0F0F0Fu, hi[p] = (c[p] >> 4) & 0x0F0F0F0Fu;
      if constexpr (T == GgmlType::Q5_K) {
        lo[p] |= ((h[p] >> (2 * j)) & 0x01010101u) << 4;
        hi[p] |= ((h[p] >> (2 * j + 1)) & 0x01010101u) << 4;
      }
    }
  }
}

// The codes of unit k as exact f32 (q[g][e] for column kq_col(k, g) + e, the offset K subtracted) and each
// group's scale a[g] and minimum b[g] (kq_words): the weight is a * q + b (the product a * q exact).
template <GgmlType T>
__device__ __forceinline__ void kq_codes(const KqUnit& u, int k, float (&q)[2][16], float (&a)[2],
                                         float (&b)[2]) {
  uint32_t lo[4], hi[4];
  kq_words<T>(u, k, lo, hi, a, b);
  const float bias = 8388608.0f + (float)kq_offset<T>();  // 2^23 + the code offset
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    q[0][4 * p + 0] = kq_byte<0>(lo[p], bias), q[1][4 * p + 0] = kq_byte<0>(hi[p], bias);
    q[0][4 * p + 1] = kq_byte<1>(lo[p], bias), q[1][4 * p + 1] = kq_byte<1>(hi[p], bias);
    q[0][4 * p + 2] = kq_byte<2>(lo[p], bias), q[1][4 * p + 2] = kq_byte<2>(hi[p], bias);
    q[0][4 * p + 3] = kq_byte<3>(lo[p], bias), q[1][4 * p + 3] = kq_byte<3>(hi[p], bias);
  }
}

// The 32 weights of unit k: w[g][e] = W[row, kq_col(k, g) + e] (fma(a, q, b): one rounding of an exact
// product plus b, as the CPU's d * q + m / d * sc * q - dmin * m).
template <GgmlType T>
__device__ __forceinline__ void kq_decode(const KqUnit& u, int k, float (&w)[2][16]) {
  float a[2], b[2];
  kq_codes<T>(u, k, w, a, b);
#pragma unroll
  for (int g = 0; g < 2; ++g)
#pragma unroll
    for (int e = 0; e < 16; ++e) w[g][e] = kq_has_min(T) ? fmaf(a[g], w[g][e], b[g]) : a[g] * w[g][e];
}

template <GgmlType T>
__device__ __forceinline__ float kq_elem_t(const uint8_t* row, int64_t cols, int c) {
  int k, g, e;
  kq_locate<T>(c, &k, &g, &e);
  float w[2][16];
  kq_decode<T>(kq_load<T>(row, cols, k), k, w);
  float v = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) v = i == e ? (g ? w[1][i] : w[0][i]) : v;  // no run-time register index
  return v;
}

// One weight W[r, c] of a device-layout view of a kquant type (the embedding lookup).
__device__ __forceinline__ float kq_elem(const WeightView& w, int64_t r, int64_t c) {
  const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * (int64_t)w.row_bytes;
  switch (w.type) {
    case GgmlType::Q4_0:
      return kq_elem_t<GgmlType::Q4_0>(row, w.cols, (int)c);
    case GgmlType::Q4_1:
      return kq_elem_t<GgmlType::Q4_1>(row, w.cols, (int)c);
    case GgmlType::Q5_0:
      return kq_elem_t<GgmlType::Q5_0>(row, w.cols, (int)c);
    case GgmlType::Q5_1:
      return kq_elem_t<GgmlType::Q5_1>(row, w.cols, (int)c);
    case GgmlType::Q4_K:
      return kq_elem_t<GgmlType::Q4_K>(row, w.cols, (int)c);
    case GgmlType::Q5_K:
      return kq_elem_t<GgmlType::Q5_K>(row, w.cols, (int)c);
    default:
      return kq_elem_t<GgmlType::Q6_K>(row, w.cols, (int)c);
  }
}

}  // namespace ultra::cuda::detail
