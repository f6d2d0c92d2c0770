// matmul: scalar reference, run-time kernel choice, threading, and the AVX2+FMA+F16C kernels.
// The AVX-512 kernels are in matmul_avx512.cpp (same structure, wider registers, masked tails).
//
// Structure of every kernel: a tile of R weight rows x T tokens keeps R*T vector accumulators; each step
// loads one vector of each of the R rows once (converting F16/BF16/Q8_0 to f32) and FMAs it against the T
// token vectors. Decode (T = 1) reads one row at a time (one sequential stream per thread) with four
// independent accumulator chains to hide the FMA latency; prefill walks the tokens in tiles of T for every
// row tile, so the R rows (a few KiB) are read from DRAM once and then reused from L1 for all tokens of
// the chunk. Rows are handed to threads in chunks from a shared counter (see matmul()).
//
// Q8_0: the weights are dequantised in registers (int8 -> int32 -> f32, times the block's f16 scale d) and
// FMA'd against the f32 activations exactly like the float types. q * d (|q| <= 127, d with an 11-bit
// significand) is exact in f32, so the kernels compute the same f32 dot product as an F32 matrix holding the
// dequantised weights: the only error is f32 accumulation rounding (no activation quantisation). The
// conversion (4 vector ops per 8/16 weights) caps one core at ~27 G weights/s in cache (~29 GB/s of Q8_0;
// AVX-512 on Zen 5 at 3.2 GHz, AVX2 ~19 G/s), about one core's DRAM read bandwidth, so decode with 2+
// threads is memory-bound; prefill amortises it over the token tile.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/ops.h"

namespace ultra::cpu {

using detail::MatmulArgs;
using detail::MatmulKernels;

namespace {

[[noreturn]] void unsupported(const char* what, GgmlType t) {
  std::fprintf(stderr, "ultra: %s: unsupported weight type %s\n", what, std::string(type_name(t)).c_str());
  std::abort();
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Loaders: 8 weights -> 8 floats, plus a scalar for tails.
struct LoadF32 {
  using E = float;
  static __m256 load8(const E* p) { return _mm256_loadu_ps(p); }
  static float scalar(E v) { return v; }
};
struct LoadF16 {
  using E = uint16_t;
  static __m256 load8(const E* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
  static float scalar(E v) { return _cvtsh_ss(v); }
};
struct LoadBF16 {
  using E = uint16_t;
  static __m256 load8(const E* p) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
  }
  static float scalar(E v) { return bf16_to_fp32(v); }
};

// y[t * ldy + j] = W[j, :] . x[t, :] (+ bias[j]) for j < R, t < T.
template <class L, int R, int T>
inline void tile_f(const uint8_t* w, size_t rb, const float* x, int64_t cols, float* y, int64_t ldy,
                   const float* bias) {
  using E = typename L::E;
  __m256 acc[R][T];
  const E* wr[R];
  for (int j = 0; j < R; ++j) {
    wr[j] = (const E*)(w + j * rb);
    for (int t = 0; t < T; ++t) acc[j][t] = _mm256_setzero_ps();
  }
  int64_t c = 0;
  for (; c + 8 <= cols; c += 8) {
    __m256 wv[R];
    for (int j = 0; j < R; ++j) wv[j] = L::load8(wr[j] + c);
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_loadu_ps(x + t * cols + c);
      for (int j = 0; j < R; ++j) acc[j][t] = _mm256_fmadd_ps(wv[j], xv, acc[j][t]);
    }
  }
  for (int j = 0; j < R; ++j) {
    for (int t = 0; t < T; ++t) {
      float s = hsum8(acc[j][t]);
      for (int64_t k = c; k < cols; ++k) s += L::scalar(wr[j][k]) * x[t * cols + k];
      y[t * ldy + j] = bias ? s + bias[j] : s;
    }
  }
}

// Decode: one row at a time so each thread reads one sequential stream (interleaved row streams confuse
// the hardware prefetchers: 4-row tiles ran Q8_0 at a sixth of the bandwidth on Zen 5), four accumulators
// to cover the FMA latency.
template <class L>
inline float dot_row_f(const uint8_t* wb, const float* x, int64_t cols) {
  using E = typename L::E;
  const E* w = (const E*)wb;
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t c = 0;
  for (; c + 32 <= cols; c += 32) {
    a0 = _mm256_fmadd_ps(L::load8(w + c), _mm256_loadu_ps(x + c), a0);
    a1 = _mm256_fmadd_ps(L::load8(w + c + 8), _mm256_loadu_ps(x + c + 8), a1);
    a2 = _mm256_fmadd_ps(L::load8(w + c + 16), _mm256_loadu_ps(x + c + 16), a2);
    a3 = _mm256_fmadd_ps(L::load8(w + c + 24), _mm256_loadu_ps(x + c + 24), a3);
  }
  for (; c + 8 <= cols; c += 8) a0 = _mm256_fmadd_ps(L::load8(w + c), _mm256_loadu_ps(x + c), a0);
  float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; c < cols; ++c) s += L::scalar(w[c]) * x[c];
  return s;
}

// ---- Q8_0 (cols % 32 == 0) ----
// Block b of a row, weights 8k .. 8k+7: sign-extended to int32, converted, times the block's scale d (exact
// in f32). Own tile/row loops (rather than a loader for tile_f/dot_row_f) so that the scale is converted
// once per block and the block addresses are plain pointer steps.
struct LoadQ8 {};  // tag for range_f

inline __m256 q8_scale(const BlockQ8_0& b) {
  return _mm256_set1_ps(_cvtsh_ss(b.d));
}
inline __m256 q8_part(const BlockQ8_0& b, int k, __m256 d) {
  const __m128i q = _mm_loadl_epi64((const __m128i*)(b.qs + 8 * k));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
}

template <int R, int T>
inline void tile_q8(const uint8_t* w, size_t rb, const float* x, int64_t cols, float* y, int64_t ldy,
                    const float* bias) {
  __m256 acc[R][T];
  const BlockQ8_0* wr[R];
  for (int j = 0; j < R; ++j) {
    wr[j] = (const BlockQ8_0*)(w + j * rb);
    for (int t = 0; t < T; ++t) acc[j][t] = _mm256_setzero_ps();
  }
  const int64_t nb = cols / kQ8_0Block;
  for (int64_t b = 0; b < nb; ++b) {
    __m256 d[R];
    for (int j = 0; j < R; ++j) d[j] = q8_scale(wr[j][b]);
    for (int k = 0; k < 4; ++k) {
      __m256 wv[R];
      for (int j = 0; j < R; ++j) wv[j] = q8_part(wr[j][b], k, d[j]);
      for (int t = 0; t < T; ++t) {
        const __m256 xv = _mm256_loadu_ps(x + t * cols + b * kQ8_0Block + 8 * k);
        for (int j = 0; j < R; ++j) acc[j][t] = _mm256_fmadd_ps(wv[j], xv, acc[j][t]);
      }
    }
  }
  for (int j = 0; j < R; ++j) {
    for (int t = 0; t < T; ++t) {
      const float s = hsum8(acc[j][t]);
      y[t * ldy + j] = bias ? s + bias[j] : s;
    }
  }
}

// Decode: one block per step on four accumulators, one sequential stream (as dot_row_f).
inline float dot_row_q8(const uint8_t* w, const float* x, int64_t cols) {
  const BlockQ8_0* b = (const BlockQ8_0*)w;
  const int64_t nb = cols / kQ8_0Block;
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < nb; ++i) {
    const float* xi = x + i * kQ8_0Block;
    const __m256 d = q8_scale(b[i]);
    a0 = _mm256_fmadd_ps(q8_part(b[i], 0, d), _mm256_loadu_ps(xi), a0);
    a1 = _mm256_fmadd_ps(q8_part(b[i], 1, d), _mm256_loadu_ps(xi + 8), a1);
    a2 = _mm256_fmadd_ps(q8_part(b[i], 2, d), _mm256_loadu_ps(xi + 16), a2);
    a3 = _mm256_fmadd_ps(q8_part(b[i], 3, d), _mm256_loadu_ps(xi + 24), a3);
  }
  return hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

// Row tile kernels by weight type.
template <class L, int R, int T>
inline void tile(const uint8_t* w, size_t rb, const float* x, int64_t cols, float* y, int64_t ldy,
                 const float* bias) {
  if constexpr (std::is_same_v<L, LoadQ8>)
    tile_q8<R, T>(w, rb, x, cols, y, ldy, bias);
  else
    tile_f<L, R, T>(w, rb, x, cols, y, ldy, bias);
}

template <class L>
void decode_f(const MatmulArgs& a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    float s;
    if constexpr (std::is_same_v<L, LoadQ8>)
      s = dot_row_q8(a.w + r * a.row_bytes, a.x, a.cols);
    else
      s = dot_row_f<L>(a.w + r * a.row_bytes, a.x, a.cols);
    a.y[r] = a.bias ? s + a.bias[r] : s;
  }
}

// Tokens of a prefill chunk whose activations stay in L2 while the row tile is reused from L1.
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
    tile<L, R, T>(w, a.row_bytes, a.x + t * a.cols, a.cols, a.y + t * a.rows + r, a.rows, bias);
  switch (t1 - t) {
    case 3:
      tile<L, R, 3>(w, a.row_bytes, a.x + t * a.cols, a.cols, a.y + t * a.rows + r, a.rows, bias);
      break;
    case 2:
      tile<L, R, 2>(w, a.row_bytes, a.x + t * a.cols, a.cols, a.y + t * a.rows + r, a.rows, bias);
      break;
    case 1:
      tile<L, R, 1>(w, a.row_bytes, a.x + t * a.cols, a.cols, a.y + t * a.rows + r, a.rows, bias);
      break;
    default:
      break;
  }
}

template <class L>
void range_f(const MatmulArgs& a, int64_t r0, int64_t r1) {
  if (a.n_tokens == 1) return decode_f<L>(a, r0, r1);
  constexpr int kR = 2, kT = 4;  // 8 accumulators + 2 weight + 1 activation register of 16
  const int chunk = token_chunk(a.cols * 4, kT);
  for (int tc = 0; tc < a.n_tokens; tc += chunk) {
    const int tc1 = tc + chunk < a.n_tokens ? tc + chunk : a.n_tokens;
    int64_t r = r0;
    for (; r + kR <= r1; r += kR) tokens_f<L, kR, kT>(a, a.w + r * a.row_bytes, r, tc, tc1);
    for (; r < r1; ++r) tokens_f<L, 1, kT>(a, a.w + r * a.row_bytes, r, tc, tc1);
  }
}

// ---- reference helpers ----

inline double weight_at(const WeightView& w, int64_t r, int64_t c) {
  const uint8_t* row = (const uint8_t*)w.data + r * w.row_bytes;
  switch (w.type) {
    case GgmlType::F32:
      return ((const float*)row)[c];
    case GgmlType::F16:
      return fp16_to_fp32(((const uint16_t*)row)[c]);
    case GgmlType::BF16:
      return bf16_to_fp32(((const uint16_t*)row)[c]);
    case GgmlType::Q8_0: {
      const BlockQ8_0& b = ((const BlockQ8_0*)row)[c / kQ8_0Block];
      return (double)fp16_to_fp32(b.d) * b.qs[c % kQ8_0Block];
    }
    default:
      unsupported("matmul_ref", w.type);
  }
}

const MatmulKernels* g_override = nullptr;

bool has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni");
}

}  // namespace

namespace detail {

const MatmulKernels& matmul_kernels_avx2() {
  static const MatmulKernels k{range_f<LoadF32>, range_f<LoadF16>, range_f<LoadBF16>, range_f<LoadQ8>,
                               "avx2"};
  return k;
}

const MatmulKernels& matmul_kernels() {
  static const MatmulKernels& k = []() -> const MatmulKernels& {
    if (const char* e = std::getenv("ULTRA_NO_AVX512"); e && *e && *e != '0') return matmul_kernels_avx2();
    return has_avx512() ? matmul_kernels_avx512() : matmul_kernels_avx2();
  }();
  return k;
}

bool cpu_has_avx512() {
  static const bool b = has_avx512();
  return b;
}

void set_matmul_kernels_override(const MatmulKernels* k) {
  g_override = k;
}

}  // namespace detail

// No kernel needs scratch (Q8_0 reads f32 activations directly).
size_t matmul_scratch_floats(const WeightView&, int, int) {
  return 0;
}

namespace {

struct MatmulCtx {
  MatmulArgs a;
  detail::MatmulRangeFn fn;
  int64_t chunk;
  alignas(64) std::atomic<int64_t> next{0};  // first row of the next unclaimed chunk
};

// Rows are handed out in chunks from a shared counter (about 8 per thread, multiples of 16 rows so that
// threads never share a cache line of y): a thread that gets descheduled on a busy machine only delays
// its current chunk instead of a fixed 1/nth of the matrix, and each chunk is one sequential stream.
inline int64_t chunk_rows(int64_t rows, int nth) {
  if (nth == 1) return rows;
  int64_t c = rows / (8 * nth);
  c = (c + 15) / 16 * 16;
  return std::clamp<int64_t>(c, 16, 512);
}

}  // namespace

void matmul(ThreadPool& pool, const WeightView& w, const float* x, int n_tokens, float* y, const float* bias,
            float* /*scratch: unused, matmul_scratch_floats() is 0*/) {
  if (n_tokens <= 0 || w.rows <= 0) return;
  const MatmulKernels& k = g_override ? *g_override : detail::matmul_kernels();
  MatmulCtx ctx;
  ctx.a = MatmulArgs{(const uint8_t*)w.data, w.row_bytes, w.rows, w.cols, x, n_tokens, y, bias};
  ctx.chunk = chunk_rows(w.rows, pool.size());
  switch (w.type) {
    case GgmlType::F32:
      ctx.fn = k.f32;
      break;
    case GgmlType::F16:
      ctx.fn = k.f16;
      break;
    case GgmlType::BF16:
      ctx.fn = k.bf16;
      break;
    case GgmlType::Q8_0:
      ctx.fn = k.q8_0;
      break;
    default:
      unsupported("matmul", w.type);
  }
  pool.run(
      [](void* c, int ith, int nth) {
        auto& m = *(MatmulCtx*)c;
        for (;;) {
          const int64_t r0 = m.next.fetch_add(m.chunk, std::memory_order_relaxed);
          if (r0 >= m.a.rows) break;
          m.fn(m.a, r0, std::min(r0 + m.chunk, m.a.rows));
        }
      },
      &ctx);
}

void matmul_ref(const WeightView& w, const float* x, int n_tokens, float* y, const float* bias) {
  for (int t = 0; t < n_tokens; ++t) {
    for (int64_t r = 0; r < w.rows; ++r) {
      double s = 0;
      for (int64_t c = 0; c < w.cols; ++c) s += weight_at(w, r, c) * (double)x[t * w.cols + c];
      if (bias) s += bias[r];
      y[t * w.rows + r] = (float)s;
    }
  }
}

}  // namespace ultra::cpu
