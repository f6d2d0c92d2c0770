// Q8_0 decode and prefill with int8 activations on AVX512-VNNI, the default there (cpu_internal.h's
// q8_int8_enabled()). Compiled with the AVX-512 flags plus -mavx512vnni (CMakeLists.txt: ULTRA_VNNI_ISA);
// called only where cpu_has_avx512_vnni() holds.
//
// x is quantised per 32-column block to int8 with an f32 scale (quantize_x_q8_vnni, the same bytes as
// quantize_x_q8_ref), as llama.cpp does for its quantised types. A weight block then costs one integer dot
// product of 32 int8 pairs: vpdpbusd multiplies unsigned by signed bytes, so the weights' magnitudes (|w| as
// u8: 128 for -128) meet x with the weights' signs (vpsignb; |x| <= 127, so negating never overflows). The
// block's sum (|sum| <= 32 * 128 * 127 < 2^24) converts to f32 exactly and takes d_w * d_x in one FMA,
// against the f32-exact kernels' two int8 -> int32 -> f32 conversions and two FMAs per 16 weights. Prefill
// takes the int8 GEMM below.

// GCC 12's avx512fintrin.h initialises its "undefined" vectors from themselves, which trips these
// (false-positive) warnings once the intrinsics are inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/matmul_int8_gemm.h"
#include "core/dtype.h"

namespace ultra::cpu::detail {

namespace {

constexpr int kDecodePrefetchBytes = 2048;  // as the other decode loops (matmul_avx512.cpp)

// The 8 int32 partial sums of one block's 32 products.
inline __m256i block_dot(const BlockQ8_0& b, const int8_t* x) {
  const __m256i w = _mm256_loadu_si256((const __m256i*)b.qs), xv = _mm256_loadu_si256((const __m256i*)x);
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(w), _mm256_sign_epi8(xv, w));
}

inline __m256 block_sum(const BlockQ8_0& b, const int8_t* x) {  // exact: |sum| < 2^24
  return _mm256_cvtepi32_ps(block_dot(b, x));
}

// One row: eight blocks a step, one sequential stream (as the f32-exact decode loop). The eight blocks'
// d_w * d_x are formed together (the f16 scales gathered with scalar loads, one conversion and one multiply)
// and each block's sum takes its product from memory in its FMA, instead of a conversion, a multiply and a
// broadcast per block: the scale was half of the loop's vector instructions, with the weights in cache.
inline float dot_row(const uint8_t* w, const int8_t* xq, const float* xd, int64_t cols) {
  const BlockQ8_0* b = (const BlockQ8_0*)w;
  const int64_t nb = cols / kQ8_0Block;
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  alignas(16) uint16_t dh[8];
  alignas(32) float s[8];
  int64_t i = 0;
  for (; i + 8 <= nb; i += 8) {
    const char* pf = (const char*)(b + i) + kDecodePrefetchBytes;  // 272 bytes a step: 5 lines cover it
    for (int l = 0; l < 5; ++l) _mm_prefetch(pf + 64 * l, _MM_HINT_T0);
    for (int k = 0; k < 8; ++k) dh[k] = b[i + k].d;
    _mm256_store_ps(
        s, _mm256_mul_ps(_mm256_cvtph_ps(_mm_load_si128((const __m128i*)dh)), _mm256_loadu_ps(xd + i)));
    const int8_t* x = xq + i * kQ8_0Block;
    a0 = _mm256_fmadd_ps(block_sum(b[i], x), _mm256_broadcast_ss(s), a0);
    a1 = _mm256_fmadd_ps(block_sum(b[i + 1], x + 32), _mm256_broadcast_ss(s + 1), a1);
    a2 = _mm256_fmadd_ps(block_sum(b[i + 2], x + 64), _mm256_broadcast_ss(s + 2), a2);
    a3 = _mm256_fmadd_ps(block_sum(b[i + 3], x + 96), _mm256_broadcast_ss(s + 3), a3);
    a0 = _mm256_fmadd_ps(block_sum(b[i + 4], x + 128), _mm256_broadcast_ss(s + 4), a0);
    a1 = _mm256_fmadd_ps(block_sum(b[i + 5], x + 160), _mm256_broadcast_ss(s + 5), a1);
    a2 = _mm256_fmadd_ps(block_sum(b[i + 6], x + 192), _mm256_broadcast_ss(s + 6), a2);
    a3 = _mm256_fmadd_ps(block_sum(b[i + 7], x + 224), _mm256_broadcast_ss(s + 7), a3);
  }
  for (; i < nb; ++i)
    a0 = _mm256_fmadd_ps(block_sum(b[i], xq + i * kQ8_0Block), _mm256_set1_ps(_cvtsh_ss(b[i].d) * xd[i]), a0);
  const __m256 t = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

// One 32-block of x -> 32 int8 (q = x * 127 / max|x| rounded to nearest even: vcvtps2dq in the default MXCSR
// mode, as the reference's nearbyint) and its scale max|x| / 127.
inline float quantize_block(const float* x, int8_t* q, int32_t* sum_lo = nullptr, int32_t* sum_hi = nullptr) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
  const float m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1)));
  const __m512 id = _mm512_set1_ps(m > 0 ? 127.0f / m : 0.0f);
  const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, id)),
                q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, id));
  _mm_storeu_si128((__m128i*)q, _mm512_cvtepi32_epi8(q0));
  _mm_storeu_si128((__m128i*)(q + 16), _mm512_cvtepi32_epi8(q1));
  if (sum_lo) {  // the sums of q over the first and the second 16 (|q| <= 127: the int32 values are q's)
    *sum_lo = _mm512_reduce_add_epi32(q0);
    *sum_hi = _mm512_reduce_add_epi32(q1);
  }
  return m / 127.0f;
}

// ---- prefill: the int8 GEMM (matmul_int8_gemm.h), Scales::Offset128 with c = w ^ 0x80 ----

// Rows [0, nr) (nr <= 32), blocks [b0, b0 + nbk) of Q8_0 w -> one packed panel (rows past nr: w = 0).
void pack_panel(const uint8_t* w, size_t rb, int nr, int64_t b0, int nbk, uint8_t* p) {
  constexpr int64_t kPB = kPanelBlockBytes<Scales::Offset128>;
  const __m512i bias = _mm512_set1_epi8((char)0x80);
  for (int b = 0; b < nbk; ++b) {
    uint8_t* pb = p + b * kPB;
    for (int v = 0; v < kNV; ++v) {
      const int n = std::clamp(nr - 16 * v, 0, 16);  // rows of this vector
      const uint8_t* qs = w + (size_t)(16 * v) * rb + (b0 + b) * sizeof(BlockQ8_0) + offsetof(BlockQ8_0, qs);
      transpose_codes(
          [&](int k) {
            return k < n ? _mm256_loadu_si256((const __m256i*)(qs + k * rb)) : _mm256_setzero_si256();
          },
          bias, v, pb);
    }
    alignas(64) uint16_t dh[kPanelRows];
    for (int i = 0; i < kPanelRows; ++i) dh[i] = i < nr ? ((const BlockQ8_0*)(w + i * rb))[b0 + b].d : 0;
    float* d = (float*)(pb + kPanelQuadBytes);
    for (int v = 0; v < kNV; ++v)
      _mm512_storeu_ps(d + 16 * v, _mm512_cvtph_ps(_mm256_load_si256((const __m256i*)(dh + 16 * v))));
  }
}

}  // namespace

void quantize_x_q8_vnni(const float* x, int64_t cols, int8_t* xq, float* xd) {
  for (int64_t b = 0; b < cols / kQ8_0Block; ++b)
    xd[b] = quantize_block(x + b * kQ8_0Block, xq + b * kQ8_0Block);
}

void matmul_q8_int8_vnni(const MatmulArgs& a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float s = dot_row(a.w + r * a.row_bytes, a.xq, a.xd, a.cols);
    a.y[r] = a.bias ? s + a.bias[r] : s;
  }
}

void pack_x_q8_vnni(const float* x, int n_tokens, int64_t cols, int j0, int j1, uint8_t* xp) {
  const int64_t nb = cols / kQ8_0Block;
  for (int j = j0; j < j1; ++j) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* o = xp + (j * nb + b) * kQ8TileBlockBytes;
      float* xd = (float*)(o + kXdOff);
      int32_t* corr = (int32_t*)(o + kXCorrOff);
      float* xm = (float*)(o + kXmOff);
      int32_t* corr_lo = (int32_t*)(o + kXCorrLoOff);
      for (int t = 0; t < kQ8NT; ++t) {
        const int tok = j * kQ8NT + t;
        alignas(32) int8_t q[kQ8_0Block] = {};
        int32_t lo = 0, hi = 0;
        xd[t] = tok < n_tokens ? quantize_block(x + tok * cols + b * kQ8_0Block, q, &lo, &hi) : 0.0f;
        const int32_t sum = lo + hi;
        corr[t] = -128 * sum;
        corr_lo[t] = -128 * lo;
        xm[t] = xd[t] * (float)sum;
        for (int q4 = 0; q4 < 8; ++q4) std::memcpy(o + (q4 * kQ8NT + t) * 4, q + 4 * q4, 4);
      }
    }
  }
}

void matmul_q8_int8_gemm_vnni(const MatmulArgs& a, int64_t r0, int64_t r1) {
  int8_gemm<Scales::Offset128>(a, r0, r1, pack_panel);
}

}  // namespace ultra::cpu::detail
