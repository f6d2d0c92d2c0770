// Element types of weights and activations, and scalar conversions between them.
// The numeric ids of GgmlType are those of the GGUF format (ggml_type) so they can be read and written as is.
// F8_E4M3 and TERNARY are ultra's own GGUF tensor types (docs/QUANTIZATION.md): their ids lie far outside
// ggml_type's range (0..42 in the llama.cpp release we build against) so they can never mean a ggml type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace ultra {

enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,  // llama.cpp ternary, 256 per block: 5 trits per byte + f16 scale (54 bytes)
  TQ2_0 = 35,  // llama.cpp ternary, 256 per block: 2 bits per trit + f16 scale (66 bytes)
  MXFP4 = 39,  // 32 per block: E8M0 exponent + 16 bytes of E2M1 codes (gpt-oss)
  NVFP4 = 40,  // 64 per block: 4 UE4M3 scales + 32 bytes of E2M1 codes
  Q1_0 = 41,   // 128 per block: f16 scale + 1 bit per weight
  Q2_0 = 42,   // 64 per block: f16 scale + 2 bits per weight
  // ultra's own ids ("UT" 0x5554 in the high half): one byte per element (core/fp8.h), and 16 trits per u32
  // (core/ternary.h); both with a separate F32 tensor "<name>.scale" (docs/QUANTIZATION.md).
  F8_E4M3 = 0x55540001u,
  TERNARY = 0x55540002u,
};

// TQ1_0 / TQ2_0 blocks, exactly as ggml-common.h's block_tq1_0 / block_tq2_0.
constexpr int kQK_K = 256;
struct BlockTQ1_0 {
  uint8_t qs[(kQK_K - 4 * kQK_K / 64) / 5];  // 48 bytes, 5 trits each (base 3, fixed point)
  uint8_t qh[kQK_K / 64];                    // 4 bytes, 4 trits each
  uint16_t d;                                // f16 scale
};
static_assert(sizeof(BlockTQ1_0) == 54);
struct BlockTQ2_0 {
  uint8_t qs[kQK_K / 4];  // 2 bits per trit (0, 1, 2 -> -1, 0, +1)
  uint16_t d;             // f16 scale
};
static_assert(sizeof(BlockTQ2_0) == 66);

// Q8_0: blocks of 32 weights, one f16 scale then 32 int8: w[i] = d * q[i].
constexpr int kQ8_0Block = 32;
struct BlockQ8_0 {
  uint16_t d;  // f16 scale
  int8_t qs[kQ8_0Block];
};
static_assert(sizeof(BlockQ8_0) == 34);

struct TypeTraits {
  std::string_view name;
  uint32_t block_elems;  // elements per block (1 for plain types)
  uint32_t block_bytes;  // bytes per block
};

// Traits of every type the GGUF reader knows the size of (every ggml_type of the llama.cpp release we build
// against); nullopt for ids it does not know. Knowing a type's size does not mean ultra computes with it:
// core/quants.h and the loaders say which types run.
std::optional<TypeTraits> type_traits(GgmlType t);
std::string_view type_name(GgmlType t);

// Bytes of a row of n elements; n must be a multiple of block_elems (checked by the callers).
static inline uint64_t row_bytes(const TypeTraits& tt, uint64_t n) {
  return n / tt.block_elems * tt.block_bytes;
}

// IEEE half <-> float, exact (round to nearest even), no hardware needed. The SIMD kernels use F16C.
// The inline functions of this header are static: files compiled with SIMD flags (*_avx2.cpp,
// *_avx512.cpp) use them too, and a shared (external) inline copy could be the one the linker keeps for
// every caller, executing AVX instructions on a CPU without them.
static inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

static inline uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));  // inf/nan
  if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);  // rounds to >= 65520: overflow to inf
  if (absx < 0x38800000u) {                                   // below the smallest normal half: subnormal
    if (absx < 0x33000000u) return (uint16_t)sign;            // < 2^-25 rounds to 0
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7fffff) | 0x800000;
    // value = m * 2^(e-150); in units of 2^-24 (the half subnormal step): m * 2^(e-126)
    const uint32_t s = 126 - e;  // right shift amount, 14..24
    uint32_t q = m >> s;
    const uint32_t rem = m & ((1u << s) - 1);
    const uint32_t half = 1u << (s - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;
    return (uint16_t)(sign | q);
  }
  // normal: rebias exponent, round mantissa to 10 bits (nearest even); a carry correctly bumps the exponent
  uint32_t r = absx - 0x38000000u;  // exponent rebias (127-15) << 23
  const uint32_t lsb = (r >> 13) & 1;
  r += 0xfff + lsb;
  return (uint16_t)(sign | (r >> 13));
}

static inline float bf16_to_fp32(uint16_t h) {
  const uint32_t bits = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

static inline uint16_t fp32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);  // quiet nan
  x += 0x7fff + ((x >> 16) & 1);                                             // round to nearest even
  return (uint16_t)(x >> 16);
}

// Converts n elements of F32 / F16 / BF16 data (any alignment) to f32; false for any other type.
bool to_f32(GgmlType t, const void* src, int64_t n, float* out);

}  // namespace ultra
