// Device decoding of the low-bit weight types in their device layout (gemv_lowbit.h): register decoders of
// one 32-bit word (4 Q8_0 / F8_E4M3 codes, 16 trits) used by the GEMV and the BF16 dequantisation, and a
// one-element accessor for the embedding lookup. All exact: every decoded value is the f32 the CPU decodes.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kquant.cuh"
#include "core/views.h"

namespace ultra::cuda::detail {

// a * b in f32, round to nearest, subnormal inputs and results kept (no .ftz, whatever the compile flags).
__device__ __forceinline__ float mul_keep_denormals(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// 4 Q8_0 codes (int8, byte k = element k) -> f32: the bytes offset to unsigned (x ^ 0x80) are placed in the
// mantissa of 2^23 (0x4B0000bb = 2^23 + b + 128), then 2^23 + 128 is subtracted (exact). One byte permute
// and one add per element (the int -> float conversion unit is 4x slower on Hopper).
__device__ __forceinline__ void decode4_q8(uint32_t w, float (&f)[4]) {
  const uint32_t u = w ^ 0x80808080u;
#pragma unroll
  for (int k = 0; k < 4; ++k) f[k] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7540u | k)) - 8388736.0f;
}

// 4 E4M3 codes -> f32. Code s.eeee.mmm placed as f32 bits s.0000eeee.mmm0...0 is the value times 2^-120 for
// normals (exponent e - 127 = (e - 7) - 120) and subnormals (f32 subnormal m * 2^-129 = m * 2^-9 * 2^-120)
// alike; one multiplication by 2^120 (exact, subnormal inputs kept) gives the value. NaN codes are refused at
// load.
__device__ __forceinline__ float fp8_bits_to_f32(uint32_t bits) {
  return mul_keep_denormals(__uint_as_float(bits), 0x1p120f);
}
__device__ __forceinline__ void decode4_fp8(uint32_t w, float (&f)[4]) {
  f[0] = fp8_bits_to_f32(((w << 24) & 0x80000000u) | ((w << 20) & 0x07f00000u));
  f[1] = fp8_bits_to_f32(((w << 16) & 0x80000000u) | ((w << 12) & 0x07f00000u));
  f[2] = fp8_bits_to_f32(((w << 8) & 0x80000000u) | ((w << 4) & 0x07f00000u));
  f[3] = fp8_bits_to_f32((w & 0x80000000u) | ((w >> 4) & 0x07f00000u));
}

// 16 trits (bits 2i, 2i + 1 of the word: 00 -> 0, 01 -> +1, 10 -> -1) -> f32. Per 2-bit lane, 1 + p - m is
// 0, 1 or 2 and is computed for all 16 lanes at once without carries or borrows; each lane is then placed
// in the mantissa of 1.5 * 2^23 (0x4B400000 | u) and 1.5 * 2^23 + 1 subtracted (exact): shift, and-or, add.
__device__ __forceinline__ void decode16_ternary(uint32_t w, float (&f)[16]) {
  const uint32_t u = (w & 0x55555555u) + 0x55555555u - ((w >> 1) & 0x55555555u);
#pragma unroll
  for (int i = 0; i < 16; ++i) f[i] = __uint_as_float(0x4B400000u | ((u >> (2 * i)) & 3u)) - 12582913.0f;
}

// One weight W[r, c] of a low-bit view in the device layout (the embedding lookup, the BF16 dequantisation
// of partial groups): the f32 product decode * scale, as the CPU's dequant_row.
__device__ __forceinline__ float lowbit_elem(const WeightView& w, int64_t r, int64_t c) {
  if (w.type != GgmlType::Q8_0 && w.type != GgmlType::F8_E4M3 && w.type != GgmlType::TERNARY)
    return kq_elem(w, r, c);  // the GGUF block types (gemv_kquant.h)
  const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * (int64_t)w.row_bytes;
  if (w.type == GgmlType::Q8_0) {
    const uint16_t d = *reinterpret_cast<const uint16_t*>(row + w.cols + 2 * (c / 32));
    return (float)(int8_t)row[c] * __half2float(__ushort_as_half(d));
  }
  const float s = w.scale[r * w.scale_row_stride + c / w.scale_group];
  if (w.type == GgmlType::F8_E4M3) {
    const uint32_t b = row[c];
    return fp8_bits_to_f32(((b & 0x80u) << 24) | ((b & 0x7fu) << 20)) * s;
  }
  const uint32_t word = reinterpret_cast<const uint32_t*>(row)[c / 16];
  const uint32_t code = (word >> (2 * (c % 16))) & 3u;
  return (code == 1u ? 1.0f : code == 2u ? -1.0f : 0.0f) * s;
}

}  // namespace ultra::cuda::detail
