// matmul: scalar reference, run-time kernel choice, threading, and the AVX2+FMA+F16C kernels.
// The AVX-512 kernels are in matmul_avx512.cpp (same structure, wider registers, masked tails, VNNI).
//
// Structure of every kernel: a tile of R weight rows x T tokens keeps R*T vector accumulators; each step
// loads one vector of each of the R rows once (converting F16/BF16 to f32) and FMAs it against the T token
// vectors. Decode (T = 1) uses R = 4 rows so four independent accumulator chains hide the FMA latency and
// four adjacent row streams keep the prefetchers busy; prefill walks the tokens in tiles of T for every
// row tile, so the R rows (a few KiB) are read from DRAM once and then reused from L1 for all tokens of
// the chunk. Rows are split over threads in contiguous ranges.
//
// Q8_0: the activation row is quantised per block of 32 to int8 with an f32 scale (d = amax/127, like
// llama.cpp's q8_0 activation but without rounding d to f16), then each block's dot product is exact in
// int32 (maddubs/madd here, VNNI in the AVX-512 file) and scaled by d_w * d_x in f32. The only error beyond
// f32 accumulation is the activation rounding: |x_i - d q_i| <= d/2 = amax_block/254 per element, so
// |err| <= sum_blocks amax_b/254 * sum_{i in b} |w_i| (relative error ~0.2-0.4% of sum|w x| worst case,
// typically ~1e-3 of |y| or less since the rounding errors are independent and cancel).
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>

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

template <class L>
void decode_f(const MatmulArgs& a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float s = dot_row_f<L>(a.w + r * a.row_bytes, a.x, a.cols);
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
  constexpr int kR = 2, kT = 4;  // 8 accumulators + 2 weight + 1 activation register of 16
  const int chunk = token_chunk(a.cols * 4, kT);
  for (int tc = 0; tc < a.n_tokens; tc += chunk) {
    const int tc1 = tc + chunk < a.n_tokens ? tc + chunk : a.n_tokens;
    int64_t r = r0;
    for (; r + kR <= r1; r += kR) tokens_f<L, kR, kT>(a, a.w + r * a.row_bytes, r, tc, tc1);
    for (; r < r1; ++r) tokens_f<L, 1, kT>(a, a.w + r * a.row_bytes, r, tc, tc1);
  }
}

// ---- Q8_0 ----

void quantize_act_avx2(const float* x, int64_t cols, float* out) {
  const int64_t nb = cols / kQ8_0Block;
  int8_t* qs = (int8_t*)out;
  float* ds = out + nb * 8;
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * 32;
    __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8), v2 = _mm256_loadu_ps(xb + 16),
           v3 = _mm256_loadu_ps(xb + 24);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign_mask, v0), _mm256_andnot_ps(sign_mask, v1)),
                             _mm256_max_ps(_mm256_andnot_ps(sign_mask, v2), _mm256_andnot_ps(sign_mask, v3)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    ds[b] = d;
    const __m256 vid = _mm256_set1_ps(id);
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, vid), kRound));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, vid), kRound));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, vid), kRound));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, vid), kRound));
    // packs work per 128-bit lane: fix the order with a final dword permutation.
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i*)(qs + b * 32), p);
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
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    __m256i xv[T];
    for (int t = 0; t < T; ++t) xv[t] = _mm256_loadu_si256((const __m256i*)(xs[t] + b * 32));
    for (int j = 0; j < R; ++j) {
      const __m256i wv = _mm256_loadu_si256((const __m256i*)wr[j][b].qs);
      const __m256i aw = _mm256_sign_epi8(wv, wv);
      const float dw = _cvtsh_ss(wr[j][b].d);
      for (int t = 0; t < T; ++t) {
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv[t], wv)), ones);
        acc[j][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * xd[t][b]), acc[j][t]);
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

template <int R, int T>
inline void tokens_q8(const MatmulArgs& a, const uint8_t* w, int64_t r, int t0, int t1) {
  const float* bias = a.bias ? a.bias + r : nullptr;
  const size_t xs = detail::q8_act_token_floats(a.cols);
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

// Block dot product |w| . sign(x, w) with maddubs (no saturation: |w| <= 128, |x| <= 127, so a pair sums to
// at most 32512) then madd to int32.
inline __m256 q8_block(const BlockQ8_0& wb, const int8_t* xs, float dx) {
  const __m256i w = _mm256_loadu_si256((const __m256i*)wb.qs);
  const __m256i x = _mm256_loadu_si256((const __m256i*)xs);
  const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)),
                                      _mm256_set1_epi16(1));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(_cvtsh_ss(wb.d) * dx));
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
      acc0 = _mm256_add_ps(acc0, q8_block(wb[b], xs + b * 32, xd[b]));
      acc1 = _mm256_add_ps(acc1, q8_block(wb[b + 1], xs + b * 32 + 32, xd[b + 1]));
    }
    if (b < nb) acc0 = _mm256_add_ps(acc0, q8_block(wb[b], xs + b * 32, xd[b]));
    const float v = hsum8(_mm256_add_ps(acc0, acc1));
    a.y[r] = a.bias ? v + a.bias[r] : v;
  }
}

void range_q8(const MatmulArgs& a, int64_t r0, int64_t r1) {
  if (a.n_tokens == 1) return decode_q8(a, r0, r1);
  constexpr int kR = 2, kT = 4;
  const int chunk = token_chunk(a.cols * 9 / 8, kT);
  for (int tc = 0; tc < a.n_tokens; tc += chunk) {
    const int tc1 = tc + chunk < a.n_tokens ? tc + chunk : a.n_tokens;
    int64_t r = r0;
    for (; r + kR <= r1; r += kR) tokens_q8<kR, kT>(a, a.w + r * a.row_bytes, r, tc, tc1);
    for (; r < r1; ++r) tokens_q8<1, kT>(a, a.w + r * a.row_bytes, r, tc, tc1);
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
  static const MatmulKernels k{range_f<LoadF32>, range_f<LoadF16>,  range_f<LoadBF16>,
                               range_q8,         quantize_act_avx2, "avx2"};
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

size_t matmul_scratch_floats(const WeightView& w, int n_tokens, int n_threads) {
  if (w.type != GgmlType::Q8_0) return 0;
  return (size_t)n_tokens * detail::q8_act_token_floats(w.cols);
}

namespace {

struct MatmulCtx {
  MatmulArgs a;
  detail::MatmulRangeFn fn;
  void (*quantize_act)(const float*, int64_t, float*);
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
            float* scratch) {
  if (n_tokens <= 0 || w.rows <= 0) return;
  const MatmulKernels& k = g_override ? *g_override : detail::matmul_kernels();
  MatmulCtx ctx;
  ctx.a = MatmulArgs{(const uint8_t*)w.data, w.row_bytes, w.rows, w.cols, x, nullptr, n_tokens, y, bias};
  ctx.quantize_act = k.quantize_act;
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
  if (w.type == GgmlType::Q8_0) {
    ctx.a.xq = scratch;
    const size_t xs = detail::q8_act_token_floats(w.cols);
    if (n_tokens >= 4 && pool.size() > 1) {
      pool.run(
          [](void* c, int ith, int nth) {
            auto& m = *(MatmulCtx*)c;
            int64_t t0, t1;
            ThreadPool::split(m.a.n_tokens, ith, nth, t0, t1);
            const size_t xs = detail::q8_act_token_floats(m.a.cols);
            for (int64_t t = t0; t < t1; ++t)
              m.quantize_act(m.a.x + t * m.a.cols, m.a.cols, (float*)m.a.xq + t * xs);
          },
          &ctx);
    } else {
      for (int t = 0; t < n_tokens; ++t) k.quantize_act(x + (int64_t)t * w.cols, w.cols, scratch + t * xs);
    }
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
