// AVX-512 (F, BW, VL, DQ, VNNI) matmul kernels; only reached through matmul_kernels() after a run-time
// check of the CPU. Same structure as the AVX2 kernels in matmul.cpp: R rows x T tokens of accumulators,
// 16 floats per step, masked loads for the column tail; Q8_0 uses VNNI (vpdpbusd) on 32-byte blocks.
// GCC 12's avx512fintrin.h initialises its "undefined" vectors from themselves, which trips these
// (false-positive) warnings once the intrinsics are inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "backend/cpu/cpu_internal.h"
#include "core/dtype.h"

namespace ultra::cpu::detail {

namespace {

struct LoadF32 {
  static __m512 load(const void* p, int64_t c) { return _mm512_loadu_ps((const float*)p + c); }
  static __m512 load_mask(const void* p, int64_t c, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, (const float*)p + c);
  }
};
struct LoadF16 {
  static __m512 load(const void* p, int64_t c) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)((const uint16_t*)p + c)));
  }
  static __m512 load_mask(const void* p, int64_t c, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t*)p + c));
  }
};
struct LoadBF16 {
  static __m512 widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static __m512 load(const void* p, int64_t c) {
    return widen(_mm256_loadu_si256((const __m256i*)((const uint16_t*)p + c)));
  }
  static __m512 load_mask(const void* p, int64_t c, __mmask16 m) {
    return widen(_mm256_maskz_loadu_epi16(m, (const uint16_t*)p + c));
  }
};

template <class L, int R, int T>
inline void tile_f(const uint8_t* w, size_t rb, const float* x, int64_t cols, float* y, int64_t ldy,
                   const float* bias) {
  __m512 acc[R][T];
  for (int j = 0; j < R; ++j)
    for (int t = 0; t < T; ++t) acc[j][t] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= cols; c += 16) {
    __m512 wv[R];
    for (int j = 0; j < R; ++j) wv[j] = L::load(w + j * rb, c);
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_loadu_ps(x + t * cols + c);
      for (int j = 0; j < R; ++j) acc[j][t] = _mm512_fmadd_ps(wv[j], xv, acc[j][t]);
    }
  }
  if (c < cols) {
    const __mmask16 m = (__mmask16)((1u << (cols - c)) - 1);
    __m512 wv[R];
    for (int j = 0; j < R; ++j) wv[j] = L::load_mask(w + j * rb, c, m);
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + t * cols + c);
      for (int j = 0; j < R; ++j) acc[j][t] = _mm512_fmadd_ps(wv[j], xv, acc[j][t]);
    }
  }
  for (int j = 0; j < R; ++j) {
    for (int t = 0; t < T; ++t) {
      const float s = _mm512_reduce_add_ps(acc[j][t]);
      y[t * ldy + j] = bias ? s + bias[j] : s;
    }
  }
}

// Decode: one row at a time, streaming sequentially through memory (several interleaved row streams
// confuse the hardware prefetchers on this CPU: 4-row tiles ran Q8_0 at a sixth of the bandwidth), with four
// accumulators to cover the FMA latency.
template <class L>
inline float dot_row_f(const uint8_t* w, const float* x, int64_t cols) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t c = 0;
  for (; c + 64 <= cols; c += 64) {
    a0 = _mm512_fmadd_ps(L::load(w, c), _mm512_loadu_ps(x + c), a0);
    a1 = _mm512_fmadd_ps(L::load(w, c + 16), _mm512_loadu_ps(x + c + 16), a1);
    a2 = _mm512_fmadd_ps(L::load(w, c + 32), _mm512_loadu_ps(x + c + 32), a2);
    a3 = _mm512_fmadd_ps(L::load(w, c + 48), _mm512_loadu_ps(x + c + 48), a3);
  }
  for (; c + 16 <= cols; c += 16) a0 = _mm512_fmadd_ps(L::load(w, c), _mm512_loadu_ps(x + c), a0);
  if (c < cols) {
    const __mmask16 m = (__mmask16)((1u << (cols - c)) - 1);
    a1 = _mm512_fmadd_ps(L::load_mask(w, c, m), _mm512_maskz_loadu_ps(m, x + c), a1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

template <class L>
void decode_f(const MatmulArgs& a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float s = dot_row_f<L>(a.w + r * a.row_bytes, a.x, a.cols);
    a.y[r] = a.bias ? s + a.bias[r] : s;
  }
}

inline int token_chunk(int64_t x_bytes_per_token, int tile) {
  int64_t n = (256 * 1024) / (x_bytes_per_token > 0 ? x_bytes_per_token : 1);
  n = n / tile * tile;
  return (int)(n < tile ? tile : n);
}

template <class L, int R, int T>
inline void tokens_f(const MatmulArgs& a, const uint8_t* w, int64_t r, int t0, int t1) {
  const float* bias = a.bias ? a.bias + r : nullptr;
  int t = t0;
  for (; t + T <= t1; t += T)
    tile_f<L, R, T>(w, a.row_bytes, a.x + t * a.cols, a.cols, a.y + t * a.rows + r, a.rows, bias);
  switch (t1 - t) {
    case 3:
      tile_f<L, R, 3>(w, a.row_bytes, a.x + t * a.cols, a.cols, a.y + t * a.rows + r, a.rows, bias);
      break;
    case 2:
      tile_f<L, R, 2>(w, a.row_bytes, a.x + t * a.cols, a.cols, a.y + t * a.rows + r, a.rows, bias);
      break;
    case 1:
      tile_f<L, R, 1>(w, a.row_bytes, a.x + t * a.cols, a.cols, a.y + t * a.rows + r, a.rows, bias);
      break;
    default:
      break;
  }
}

template <class L>
void range_f(const MatmulArgs& a, int64_t r0, int64_t r1) {
  if (a.n_tokens == 1) return decode_f<L>(a, r0, r1);
  constexpr int kR = 4, kT = 4;  // 16 accumulators + 4 weight + 1 activation register of 32
  const int chunk = token_chunk(a.cols * 4, kT);
  for (int tc = 0; tc < a.n_tokens; tc += chunk) {
    const int tc1 = tc + chunk < a.n_tokens ? tc + chunk : a.n_tokens;
    int64_t r = r0;
    for (; r + kR <= r1; r += kR) tokens_f<L, kR, kT>(a, a.w + r * a.row_bytes, r, tc, tc1);
    for (; r < r1; ++r) tokens_f<L, 1, kT>(a, a.w + r * a.row_bytes, r, tc, tc1);
  }
}

// ---- Q8_0 ----

void quantize_act_avx512(const float* x, int64_t cols, float* out) {
  const int64_t nb = cols / kQ8_0Block;
  int8_t* qs = (int8_t*)out;
  float* ds = out + nb * 8;
  for (int64_t b = 0; b < nb; ++b) {
    const __m512 v0 = _mm512_loadu_ps(x + b * 32), v1 = _mm512_loadu_ps(x + b * 32 + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    ds[b] = d;
    const __m512 vid = _mm512_set1_ps(id);
    // cvtps_epi32 rounds to nearest even (MXCSR default); the values are within [-127, 127].
    const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
    const __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
    _mm_storeu_si128((__m128i*)(qs + b * 32), _mm512_cvtsepi32_epi8(i0));
    _mm_storeu_si128((__m128i*)(qs + b * 32 + 16), _mm512_cvtsepi32_epi8(i1));
  }
}

template <int R, int T>
inline void tile_q8(const uint8_t* w, size_t rb, const float* xq, size_t xq_stride, int64_t nb, float* y,
                    int64_t ldy, const float* bias) {
  __m256 acc[R][T];
  const BlockQ8_0* wr[R];
  const int8_t* xs[T];
  const float* xd[T];
  for (int j = 0; j < R; ++j) {
    wr[j] = (const BlockQ8_0*)(w + j * rb);
    for (int t = 0; t < T; ++t) acc[j][t] = _mm256_setzero_ps();
  }
  for (int t = 0; t < T; ++t) {
    xs[t] = (const int8_t*)(xq + t * xq_stride);
    xd[t] = xq + t * xq_stride + nb * 8;
  }
  for (int64_t b = 0; b < nb; ++b) {
    __m256i xv[T];
    for (int t = 0; t < T; ++t) xv[t] = _mm256_loadu_si256((const __m256i*)(xs[t] + b * 32));
    for (int j = 0; j < R; ++j) {
      const __m256i wv = _mm256_loadu_si256((const __m256i*)wr[j][b].qs);
      const __m256i aw = _mm256_abs_epi8(wv);
      const float dw = _cvtsh_ss(wr[j][b].d);
      for (int t = 0; t < T; ++t) {
        const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, _mm256_sign_epi8(xv[t], wv));
        acc[j][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * xd[t][b]), acc[j][t]);
      }
    }
  }
  for (int j = 0; j < R; ++j) {
    for (int t = 0; t < T; ++t) {
      __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[j][t]), _mm256_extractf128_ps(acc[j][t], 1));
      s = _mm_add_ps(s, _mm_movehl_ps(s, s));
      s = _mm_add_ss(s, _mm_movehdup_ps(s));
      const float v = _mm_cvtss_f32(s);
      y[t * ldy + j] = bias ? v + bias[j] : v;
    }
  }
}

template <int R, int T>
inline void tokens_q8(const MatmulArgs& a, const uint8_t* w, int64_t r, int t0, int t1) {
  const float* bias = a.bias ? a.bias + r : nullptr;
  const size_t xs = q8_act_token_floats(a.cols);
  const int64_t nb = a.cols / kQ8_0Block;
  int t = t0;
  for (; t + T <= t1; t += T)
    tile_q8<R, T>(w, a.row_bytes, a.xq + t * xs, xs, nb, a.y + t * a.rows + r, a.rows, bias);
  switch (t1 - t) {
    case 3:
      tile_q8<R, 3>(w, a.row_bytes, a.xq + t * xs, xs, nb, a.y + t * a.rows + r, a.rows, bias);
      break;
    case 2:
      tile_q8<R, 2>(w, a.row_bytes, a.xq + t * xs, xs, nb, a.y + t * a.rows + r, a.rows, bias);
      break;
    case 1:
      tile_q8<R, 1>(w, a.row_bytes, a.xq + t * xs, xs, nb, a.y + t * a.rows + r, a.rows, bias);
      break;
    default:
      break;
  }
}

// Decode: one row at a time (sequential stream), two blocks per step on two accumulators.
void decode_q8(const MatmulArgs& a, int64_t r0, int64_t r1) {
  const int64_t nb = a.cols / kQ8_0Block;
  const int8_t* xs = (const int8_t*)a.xq;
  const float* xd = a.xq + nb * 8;
  for (int64_t r = r0; r < r1; ++r) {
    const BlockQ8_0* wb = (const BlockQ8_0*)(a.w + r * a.row_bytes);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
      const __m256i w0 = _mm256_loadu_si256((const __m256i*)wb[b].qs);
      const __m256i w1 = _mm256_loadu_si256((const __m256i*)wb[b + 1].qs);
      const __m256i p0 =
          _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(w0),
                              _mm256_sign_epi8(_mm256_loadu_si256((const __m256i*)(xs + b * 32)), w0));
      const __m256i p1 =
          _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(w1),
                              _mm256_sign_epi8(_mm256_loadu_si256((const __m256i*)(xs + b * 32 + 32)), w1));
      acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(_cvtsh_ss(wb[b].d) * xd[b]), acc0);
      acc1 =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_set1_ps(_cvtsh_ss(wb[b + 1].d) * xd[b + 1]), acc1);
    }
    if (b < nb) {
      const __m256i w0 = _mm256_loadu_si256((const __m256i*)wb[b].qs);
      const __m256i p0 =
          _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(w0),
                              _mm256_sign_epi8(_mm256_loadu_si256((const __m256i*)(xs + b * 32)), w0));
      acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(_cvtsh_ss(wb[b].d) * xd[b]), acc0);
    }
    const __m256 acc = _mm256_add_ps(acc0, acc1);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    const float v = _mm_cvtss_f32(s);
    a.y[r] = a.bias ? v + a.bias[r] : v;
  }
}

void range_q8(const MatmulArgs& a, int64_t r0, int64_t r1) {
  if (a.n_tokens == 1) return decode_q8(a, r0, r1);
  constexpr int kR = 4, kT = 4;
  const int chunk = token_chunk(a.cols * 9 / 8, kT);
  for (int tc = 0; tc < a.n_tokens; tc += chunk) {
    const int tc1 = tc + chunk < a.n_tokens ? tc + chunk : a.n_tokens;
    int64_t r = r0;
    for (; r + kR <= r1; r += kR) tokens_q8<kR, kT>(a, a.w + r * a.row_bytes, r, tc, tc1);
    for (; r < r1; ++r) tokens_q8<1, kT>(a, a.w + r * a.row_bytes, r, tc, tc1);
  }
}

}  // namespace

const MatmulKernels& matmul_kernels_avx512() {
  static const MatmulKernels k{range_f<LoadF32>, range_f<LoadF16>,    range_f<LoadBF16>,
                               range_q8,         quantize_act_avx512, "avx512"};
  return k;
}

}  // namespace ultra::cpu::detail
