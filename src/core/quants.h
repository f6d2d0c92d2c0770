// GGUF's block-quantized weight formats: the legacy 32-element blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_1), the
// 256-element k-quant super-blocks (Q2_K .. Q6_K, Q8_K), the non-linear IQ4_NL / IQ4_XS and MXFP4, laid out
// byte for byte as ggml's block_* structs (ggml-common.h), and their exact scalar dequantisation.
//
// Exactness: each dequantize_row_* computes every value with the same f32 operations in the same order as
// ggml's dequantize_row_* (tests/test_quants.cpp holds them bit for bit against values llama.cpp's own code
// produced: tests/fixtures/quants, made by tools/make_quant_fixtures.sh). Where ggml computes a*b - c, the
// product a*b is exact in f32 for every type here (at most 22 significant bits), so a compiler's FMA
// contraction on either side cannot change the result.
//
// Value formulas (q: the stored integer code, d / dmin: f16 super-block scales, sc / m: sub-block codes):
//   Q4_0  d * (q - 8)               Q4_1  d * q + m               (q in 0..15, 32 per block)
//   Q5_0  d * (q - 16)              Q5_1  d * q + m               (q in 0..31: 4 low bits + 1 from qh)
//   Q8_1  d * q                     (s = d * sum(q) is only used by dot products)
//   Q2_K  d * sc * q - dmin * m     (16 sub-blocks of 16; sc, m 4-bit; q 2-bit)
//   Q3_K  d * (sc - 32) * (q - 4 * !hbit)   (16 sub-blocks of 16; sc 6-bit; q 2 low bits + hmask bit)
//   Q4_K  d * sc * q - dmin * m     (8 sub-blocks of 32; sc, m 6-bit packed in 12 bytes; q 4-bit)
//   Q5_K  as Q4_K with a fifth bit of q from qh
//   Q6_K  d * sc * (q - 32)         (16 sub-blocks of 16; sc int8; q 4 low bits + 2 from qh)
//   Q8_K  d * q                     (f32 d; bsums: sums of q per 16; the activation type of k-quant dots)
//   IQ4_NL  d * kIq4nlValues[q]     (32 per block)
//   IQ4_XS  d * (ls - 32) * kIq4nlValues[q]   (8 sub-blocks of 32; ls 6-bit: 4 in scales_l, 2 in scales_h)
//   MXFP4  2^(e - 128) * kFp4Values[q]   (e: E8M0 exponent; kFp4Values are twice E2M1's values)
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace ultra {

constexpr int kQK4 = 32;  // elements per legacy block (Q4_0 .. Q8_1, IQ4_NL, MXFP4)

struct BlockQ4_0 {
  uint16_t d;      // f16 scale
  uint8_t qs[16];  // element j: low nibble of qs[j]; element j + 16: high nibble
};
struct BlockQ4_1 {
  uint16_t d, m;  // f16 scale and minimum
  uint8_t qs[16];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // bit j (little-endian u32): fifth bit of element j
  uint8_t qs[16];
};
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ8_1 {
  uint16_t d, s;  // f16 scale, f16 d * sum(qs)
  int8_t qs[32];
};
struct BlockQ2_K {
  uint8_t scales[16];  // sub-block j: low nibble scale, high nibble min
  uint8_t qs[64];  // 128-element halves: byte l holds elements l, l+32, l+64, l+96 (2 bits each, low first)
  uint16_t d, dmin;
};
struct BlockQ3_K {
  uint8_t hmask[32];   // bit k of hmask[l]: high bit of element 32 k + l
  uint8_t qs[64];      // low 2 bits, as Q2_K
  uint8_t scales[12];  // 16 6-bit scales
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];  // 8 6-bit scales and 8 6-bit mins (q4k_scale_min())
  uint8_t qs[128];     // 64-element groups g: byte 32 g + l holds elements 64 g + l (low) and 64 g + 32 + l
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];  // bit 2 g (+1 for the high half) of qh[l]: fifth bit of element 64 g + l (+32)
  uint8_t qs[128];
};
struct BlockQ6_K {
  uint8_t ql[128];  // low 4 bits
  uint8_t qh[64];   // high 2 bits
  int8_t scales[16];
  uint16_t d;
};
struct BlockQ8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];  // sum of qs per 16 elements
};
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[16];  // indices into kIq4nlValues, nibbles as Q4_0
};
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;    // 2 high bits of each of the 8 sub-block scales
  uint8_t scales_l[4];  // 4 low bits of each
  uint8_t qs[128];      // 16 bytes per sub-block, nibbles as Q4_0
};
struct BlockMXFP4 {
  uint8_t e;       // E8M0 shared exponent
  uint8_t qs[16];  // E2M1 codes, nibbles as Q4_0
};
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292);
static_assert(sizeof(BlockIQ4_NL) == 18 && sizeof(BlockIQ4_XS) == 136 && sizeof(BlockMXFP4) == 17);

// Elements per block of each block struct (the kernels' templates take the struct).
template <class B>
inline constexpr int kBlockElems = kQK_K;
template <>
inline constexpr int kBlockElems<BlockQ4_0> = kQK4;
template <>
inline constexpr int kBlockElems<BlockQ4_1> = kQK4;
template <>
inline constexpr int kBlockElems<BlockQ5_0> = kQK4;
template <>
inline constexpr int kBlockElems<BlockQ5_1> = kQK4;
template <>
inline constexpr int kBlockElems<BlockQ8_1> = kQK4;
template <>
inline constexpr int kBlockElems<BlockIQ4_NL> = kQK4;
template <>
inline constexpr int kBlockElems<BlockMXFP4> = kQK4;

// The 16 levels of IQ4_NL / IQ4_XS, and of MXFP4 (E2M1 values doubled).
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
inline constexpr int8_t kFp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Scale and min codes of sub-block j (0..7) of a Q4_K / Q5_K block's 12 scale bytes.
static inline void q4k_scale_min(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// The 16 signed scales (-32..31) of a Q3_K block's 12 scale bytes (4 low bits in bytes 0..7, 2 high bits
// in bytes 8..11).
static inline void q3k_scales(const uint8_t packed[12], int8_t out[16]) {
  for (int j = 0; j < 16; ++j) {
    const int lo = (packed[j % 8] >> (4 * (j / 8))) & 0xF;
    const int hi = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = (int8_t)((lo | (hi << 4)) - 32);
  }
}

// 0.5 * 2^(e - 127) as an f32 (E8M0 halved, as MXFP4's kFp4Values are doubled).
static inline float e8m0_to_fp32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// ---- one block -> its values (static inline: the SIMD files compile them with their own flags) ----

static inline void dequant_block(const BlockQ4_0& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  for (int j = 0; j < 16; ++j) {
    y[j] = ((b.qs[j] & 0xF) - 8) * d;
    y[j + 16] = ((b.qs[j] >> 4) - 8) * d;
  }
}
static inline void dequant_block(const BlockQ4_1& b, float* y) {
  const float d = fp16_to_fp32(b.d), m = fp16_to_fp32(b.m);
  for (int j = 0; j < 16; ++j) {
    y[j] = (b.qs[j] & 0xF) * d + m;
    y[j + 16] = (b.qs[j] >> 4) * d + m;
  }
}
static inline uint32_t q5_high_bits(const uint8_t qh[4]) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  return h;
}
static inline void dequant_block(const BlockQ5_0& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  const uint32_t qh = q5_high_bits(b.qh);
  for (int j = 0; j < 16; ++j) {
    y[j] = ((int)((b.qs[j] & 0xF) | (((qh >> j) << 4) & 0x10)) - 16) * d;
    y[j + 16] = ((int)((b.qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16) * d;
  }
}
static inline void dequant_block(const BlockQ5_1& b, float* y) {
  const float d = fp16_to_fp32(b.d), m = fp16_to_fp32(b.m);
  const uint32_t qh = q5_high_bits(b.qh);
  for (int j = 0; j < 16; ++j) {
    y[j] = (int)((b.qs[j] & 0xF) | (((qh >> j) << 4) & 0x10)) * d + m;
    y[j + 16] = (int)((b.qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) * d + m;
  }
}
static inline void dequant_block(const BlockQ8_1& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  for (int j = 0; j < 32; ++j) y[j] = b.qs[j] * d;
}
static inline void dequant_block(const BlockQ2_K& b, float* y) {
  const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
  for (int h = 0; h < 2; ++h) {  // 128-element halves
    const uint8_t* q = b.qs + 32 * h;
    for (int s = 0; s < 8; ++s) {  // sub-blocks of 16: shift 2 * (s / 2), bytes 16 * (s % 2) ..
      const uint8_t sc = b.scales[8 * h + s];
      const float dl = d * (sc & 0xF), ml = dmin * (sc >> 4);
      const int shift = 2 * (s / 2), off = 16 * (s % 2);
      for (int l = 0; l < 16; ++l) *y++ = dl * ((q[off + l] >> shift) & 3) - ml;
    }
  }
}
static inline void dequant_block(const BlockQ3_K& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  int8_t sc[16];
  q3k_scales(b.scales, sc);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* q = b.qs + 32 * h;
    for (int s = 0; s < 8; ++s) {
      const float dl = d * sc[8 * h + s];
      const int shift = 2 * (s / 2), off = 16 * (s % 2);
      const uint8_t m = (uint8_t)(1u << (4 * h + s / 2));
      for (int l = 0; l < 16; ++l)
        *y++ = dl * (((q[off + l] >> shift) & 3) - ((b.hmask[off + l] & m) ? 0 : 4));
    }
  }
}
// Q4_K, and Q5_K with its fifth bits qh (nullptr for Q4_K).
template <class B>
static inline void dequant_k45(const B& b, const uint8_t* qh, float* y) {
  const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
  for (int g = 0; g < 4; ++g) {
    uint8_t sc, m;
    q4k_scale_min(2 * g, b.scales, &sc, &m);
    const float d1 = d * sc, m1 = dmin * m;
    q4k_scale_min(2 * g + 1, b.scales, &sc, &m);
    const float d2 = d * sc, m2 = dmin * m;
    const uint8_t* q = b.qs + 32 * g;
    const uint8_t u1 = (uint8_t)(1u << (2 * g)), u2 = (uint8_t)(2u << (2 * g));
    for (int l = 0; l < 32; ++l) y[l] = d1 * ((q[l] & 0xF) + (qh && (qh[l] & u1) ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) y[32 + l] = d2 * ((q[l] >> 4) + (qh && (qh[l] & u2) ? 16 : 0)) - m2;
    y += 64;
  }
}
static inline void dequant_block(const BlockQ4_K& b, float* y) {
  dequant_k45(b, nullptr, y);
}
static inline void dequant_block(const BlockQ5_K& b, float* y) {
  dequant_k45(b, b.qh, y);
}
static inline void dequant_block(const BlockQ6_K& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b.ql + 64 * h;
    const uint8_t* qh = b.qh + 32 * h;
    const int8_t* sc = b.scales + 8 * h;
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * sc[is] * q1;
      y[l + 32] = d * sc[is + 2] * q2;
      y[l + 64] = d * sc[is + 4] * q3;
      y[l + 96] = d * sc[is + 6] * q4;
    }
    y += 128;
  }
}
static inline void dequant_block(const BlockQ8_K& b, float* y) {
  for (int j = 0; j < 256; ++j) y[j] = b.d * b.qs[j];
}
static inline void dequant_block(const BlockIQ4_NL& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * kIq4nlValues[b.qs[j] & 0xF];
    y[j + 16] = d * kIq4nlValues[b.qs[j] >> 4];
  }
}
// The 6-bit scale code (0..63; the scale is d * (code - 32)) of sub-block s (0..7) of an IQ4_XS block.
static inline int iq4xs_scale(const BlockIQ4_XS& b, int s) {
  return ((b.scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | (((b.scales_h >> (2 * s)) & 3) << 4);
}
static inline void dequant_block(const BlockIQ4_XS& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  for (int s = 0; s < 8; ++s) {
    const float dl = d * (iq4xs_scale(b, s) - 32);
    const uint8_t* q = b.qs + 16 * s;
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * kIq4nlValues[q[j] & 0xF];
      y[j + 16] = dl * kIq4nlValues[q[j] >> 4];
    }
    y += 32;
  }
}
static inline void dequant_block(const BlockMXFP4& b, float* y) {
  const float d = e8m0_to_fp32_half(b.e);
  for (int j = 0; j < 16; ++j) {
    y[j] = kFp4Values[b.qs[j] & 0xF] * d;
    y[j + 16] = kFp4Values[b.qs[j] >> 4] * d;
  }
}

// Whether t is a weight type the CPU matmul runs from this header and core/quants_iq.h: Q4_0, Q4_1, Q5_0,
// Q5_1, Q2_K .. Q6_K, IQ4_NL, IQ4_XS, MXFP4, the grid i-quants IQ2_XXS .. IQ1_M (not the activation types
// Q8_1 / Q8_K, nor Q8_0, which has kernels of its own).
bool is_block_weight_type(GgmlType t);

// Whether t is one of the block types of this header and quants_iq.h (or Q8_0); dequantize() handles exactly
// these.
bool is_block_quant(GgmlType t);
// n values (a multiple of the type's block size) of blocks of type t at src -> out. False for a type that
// is not a block type here (plain types: to_f32()).
bool dequantize(GgmlType t, const void* src, int64_t n, float* out);

// Blocks whose f16 / E8M0 scales are not finite: the index of the first such block in [0, n_blocks), or
// -1 when every scale is finite (or t has none to check).
int64_t first_nonfinite_block(GgmlType t, const void* src, int64_t n_blocks);

}  // namespace ultra
