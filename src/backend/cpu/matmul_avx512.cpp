// AVX-512 (F, BW, VL, DQ, on top of AVX2+FMA+F16C) matmul kernels, compiled with ULTRA_AVX512_ISA; only
// reached through matmul_kernels() after the run-time check of exactly those features (isa.cpp). The driver
// (matmul_driver.h) is the AVX2 kernels' one; the tiles are wider: R rows x T tokens of accumulators, 16
// floats per step, masked loads for the column tail; Q8_0 weights are dequantised in registers (16 int8
// -> int32 -> f32, times the block's f16 scale: exact in f32) and FMA'd against the f32 activations, like
// the float types (see matmul.cpp).
// GCC 12's avx512fintrin.h initialises its "undefined" vectors from themselves, which trips these
// (false-positive) warnings once the intrinsics are inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/matmul_driver.h"
#include "backend/cpu/matmul_panel_avx512.h"
#include "backend/cpu/matmul_tile.h"
#include "backend/cpu/simd_traits.h"
#include "core/dtype.h"

namespace ultra::cpu::detail {

namespace {

// Decode: one sequential stream (as dot_row_f), four blocks per step. Each block's 32 products are summed
// unscaled (16 lanes, one multiply and one FMA) and the sum takes the block's scale in one more FMA: per
// block 2 conversions x 2 + 3 arithmetic instructions and a scale broadcast straight from memory, where
// scaling the weights first (as the tiles do, which reuse them for several tokens) costs 2 multiplies more.
// The rounding differs from the tiles' (each block sum is rounded once more), within the same bound.
inline __m512 q8_raw(const BlockQ8_0& b, int h) {
  return simd::Avx512::q8_widen(b.qs + 16 * h);
}
inline __m512 q8_block_sum(const BlockQ8_0& b, const float* x) {  // sum_i q_i x_i over the block, unscaled
  return _mm512_fmadd_ps(q8_raw(b, 1), _mm512_loadu_ps(x + 16),
                         _mm512_mul_ps(q8_raw(b, 0), _mm512_loadu_ps(x)));
}
inline __m512 q8_scale_bcast(const BlockQ8_0& b) {  // vpbroadcastw from memory + vcvtph2ps
  return _mm512_cvtph_ps(_mm256_set1_epi16((short)b.d));
}
inline float dot_row_q8(const uint8_t* w, const float* x, int64_t cols) {
  const BlockQ8_0* b = (const BlockQ8_0*)w;
  const int64_t nb = cols / kQ8_0Block;
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 4 <= nb; i += 4) {
    const float* xi = x + i * kQ8_0Block;
    const char* pf = (const char*)(b + i) + kDecodePrefetchBytes;  // 136 bytes a step: 3 lines cover it
    _mm_prefetch(pf, _MM_HINT_T0);
    _mm_prefetch(pf + 64, _MM_HINT_T0);
    _mm_prefetch(pf + 128, _MM_HINT_T0);
    const __m512 s0 = q8_block_sum(b[i], xi), s1 = q8_block_sum(b[i + 1], xi + 32);
    const __m512 s2 = q8_block_sum(b[i + 2], xi + 64), s3 = q8_block_sum(b[i + 3], xi + 96);
    a0 = _mm512_fmadd_ps(s0, q8_scale_bcast(b[i]), a0);
    a1 = _mm512_fmadd_ps(s1, q8_scale_bcast(b[i + 1]), a1);
    a2 = _mm512_fmadd_ps(s2, q8_scale_bcast(b[i + 2]), a2);
    a3 = _mm512_fmadd_ps(s3, q8_scale_bcast(b[i + 3]), a3);
  }
  for (; i < nb; ++i) a0 = _mm512_fmadd_ps(q8_block_sum(b[i], x + i * kQ8_0Block), q8_scale_bcast(b[i]), a0);
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

// The driver's Isa (matmul_driver.h): the shared tiles and panel GEMM of matmul_tile.h on 16-float vectors,
// this file's decode row of Q8_0. kR = 4: 16 accumulators + 4 weight + 1 activation register of 32.
struct Avx512 : TileIsa<simd::Avx512, 4, panel::KernelAvx512> {
  static float dot_row_q8(const uint8_t* w, const float* x, int64_t cols) {
    return detail::dot_row_q8(w, x, cols);
  }
};

}  // namespace

const MatmulKernels& matmul_kernels_avx512() {
  static constexpr MatmulKernels k =
      driver::kernels<Avx512>("avx512", matmul_fp8_avx512, matmul_ternary_avx512);
  return k;
}

}  // namespace ultra::cpu::detail
