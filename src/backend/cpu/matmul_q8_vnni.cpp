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
#include "core/dtype.h"

namespace ultra::cpu::detail {

namespace {

constexpr int kDecodePrefetchBytes = 2048;  // as the other decode loops (matmul_avx512.cpp)
constexpr int kNV = 2;                      // the GEMM's panel: 2 vectors of 16 rows

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
inline float quantize_block(const float* x, int8_t* q) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
  const float m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1)));
  const __m512 id = _mm512_set1_ps(m > 0 ? 127.0f / m : 0.0f);
  _mm_storeu_si128((__m128i*)q, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, id))));
  _mm_storeu_si128((__m128i*)(q + 16), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, id))));
  return m / 127.0f;
}

// ---- prefill: the int8 GEMM ----
// Rows are vector lanes (16 per zmm, kNV = 2 zmm: a 32-row panel), tokens are broadcast (kNT = 6 per tile),
// and each 32-column block is 8 vpdpbusd steps of 4 columns: int32 accumulators for the 32 rows x 6 tokens,
// which then take the block's scales d_w (a vector of the panel's rows) * d_x (the token's) in one
// conversion, multiply and FMA per accumulator into f32 ones. vpdpbusd multiplies unsigned by signed
// bytes: the panel holds the weights plus 128 (w ^ 0x80), and each accumulator starts at -128 * sum(x_q)
// over the block (the token's correction, packed with x), so that it ends at sum(w * x_q) exactly.
//
// Packed x (MatmulArgs::xq, pack_x_q8_vnni): token tile j (kNT tokens, zero past n_tokens), block b at
// byte (j * nb + b) * kQ8TileBlockBytes: for column quad q < 8 and token t < kNT, 4 int8 at (q * kNT + t) *
// 4; then the tokens' d_x (f32 [kNT]) and corrections (int32 [kNT]). Packed panel (per row block and column
// block, on the stack): block b at b * kPanelBlockBytes: for quad q and vector v, 16 rows x 4 bytes (w ^
// 0x80) at (q * kNV + v) * 64; then d_w (f32 [32]) at 1024.
constexpr int kXQuadBytes = 8 * kQ8NT * 4;     // 192
constexpr int kPanelQuadBytes = 8 * kNV * 64;  // 1024
constexpr int64_t kPanelBlockBytes = kPanelQuadBytes + kNV * 16 * 4;
constexpr int kKB = 32;   // blocks per column block (1024 columns)
constexpr int kMC = 128;  // rows per row block (4 panels, 144 KiB packed)

// Rows [r, r + nr) (nr <= 32), blocks [b0, b0 + nbk) of Q8_0 w -> one packed panel (rows past nr: w = 0).
// Per block and vector, a transpose of 16 rows x 8 column quads (dwords) in registers: row k and row k + 8
// in the two halves of one zmm, then the 8 x 8 dword transpose of both halves at once (unpack 32, unpack 64,
// and one two-source permute per output quad), instead of 8 four-byte stores per row.
void pack_panel(const uint8_t* w, size_t rb, int nr, int64_t b0, int nbk, uint8_t* p) {
  const __m512i bias = _mm512_set1_epi8((char)0x80);
  const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13),
                hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
  for (int b = 0; b < nbk; ++b) {
    uint8_t* pb = p + b * kPanelBlockBytes;
    for (int v = 0; v < kNV; ++v) {
      const int n = std::clamp(nr - 16 * v, 0, 16);  // rows of this vector
      const uint8_t* qs = w + (size_t)(16 * v) * rb + (b0 + b) * sizeof(BlockQ8_0) + offsetof(BlockQ8_0, qs);
      auto row = [&](int k) {
        return k < n ? _mm256_loadu_si256((const __m256i*)(qs + k * rb)) : _mm256_setzero_si256();
      };
      __m512i z[8];  // lanes 0-7: row k's 8 quads, lanes 8-15: row k + 8's
      for (int k = 0; k < 8; ++k) z[k] = _mm512_inserti64x4(_mm512_castsi256_si512(row(k)), row(k + 8), 1);
      __m512i t[8], u[8];
      for (int k = 0; k < 8; k += 4) {
        t[k] = _mm512_unpacklo_epi32(z[k], z[k + 1]);
        t[k + 1] = _mm512_unpackhi_epi32(z[k], z[k + 1]);
        t[k + 2] = _mm512_unpacklo_epi32(z[k + 2], z[k + 3]);
        t[k + 3] = _mm512_unpackhi_epi32(z[k + 2], z[k + 3]);
        // u[k + j], per 128-bit lane (rows k..k+3, or k+8..k+11): quad j (lanes 0, 2), j + 4 (lanes 1, 3)
        u[k] = _mm512_unpacklo_epi64(t[k], t[k + 2]);
        u[k + 1] = _mm512_unpackhi_epi64(t[k], t[k + 2]);
        u[k + 2] = _mm512_unpacklo_epi64(t[k + 1], t[k + 3]);
        u[k + 3] = _mm512_unpackhi_epi64(t[k + 1], t[k + 3]);
      }
      for (int j = 0; j < 4; ++j) {
        const __m512i q_lo = _mm512_permutex2var_epi64(u[j], lo, u[j + 4]);  // quad j of rows 0..15
        const __m512i q_hi = _mm512_permutex2var_epi64(u[j], hi, u[j + 4]);  // quad j + 4
        _mm512_store_si512((void*)(pb + (j * kNV + v) * 64), _mm512_xor_si512(q_lo, bias));
        _mm512_store_si512((void*)(pb + ((j + 4) * kNV + v) * 64), _mm512_xor_si512(q_hi, bias));
      }
    }
    alignas(64) uint16_t dh[kNV * 16];
    for (int i = 0; i < kNV * 16; ++i) dh[i] = i < nr ? ((const BlockQ8_0*)(w + i * rb))[b0 + b].d : 0;
    float* d = (float*)(pb + kPanelQuadBytes);
    for (int v = 0; v < kNV; ++v)
      _mm512_storeu_ps(d + 16 * v, _mm512_cvtph_ps(_mm256_load_si256((const __m256i*)(dh + 16 * v))));
  }
}

// y[t * ldy + i] (first: =, else +=) for rows i < nr (NV vectors) and tokens t < NT of one panel and tile.
template <int NV, int NT>
void micro(const uint8_t* p, const uint8_t* x, int nbk, float* y, int64_t ldy, int nr, bool first,
           const float* bias) {
  __m512 af[NV][NT];
  for (int v = 0; v < NV; ++v)
    for (int t = 0; t < NT; ++t) af[v][t] = _mm512_setzero_ps();
  for (int b = 0; b < nbk; ++b, p += kPanelBlockBytes, x += kQ8TileBlockBytes) {
    const float* xd = (const float*)(x + kXQuadBytes);
    const int32_t* corr = (const int32_t*)(x + kXQuadBytes + kQ8NT * 4);
    __m512i ai[NV][NT];
    for (int t = 0; t < NT; ++t) {
      const __m512i c = _mm512_set1_epi32(corr[t]);
      for (int v = 0; v < NV; ++v) ai[v][t] = c;
    }
    for (int q = 0; q < 8; ++q) {
      __m512i wv[NV];
      for (int v = 0; v < NV; ++v) wv[v] = _mm512_load_si512((const void*)(p + (q * kNV + v) * 64));
      for (int t = 0; t < NT; ++t) {
        int32_t xq4;
        std::memcpy(&xq4, x + (q * kQ8NT + t) * 4, 4);
        const __m512i xv = _mm512_set1_epi32(xq4);
        for (int v = 0; v < NV; ++v) ai[v][t] = _mm512_dpbusd_epi32(ai[v][t], wv[v], xv);
      }
    }
    for (int v = 0; v < NV; ++v) {
      const __m512 dw = _mm512_load_ps((const float*)(p + kPanelQuadBytes) + 16 * v);
      for (int t = 0; t < NT; ++t)
        af[v][t] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[v][t]), _mm512_mul_ps(dw, _mm512_set1_ps(xd[t])), af[v][t]);
    }
  }
  for (int v = 0; v < NV; ++v) {
    const int n = nr - 16 * v < 16 ? nr - 16 * v : 16;
    const __mmask16 m = (__mmask16)((1u << n) - 1);
    const __m512 bv = bias ? _mm512_maskz_loadu_ps(m, bias + 16 * v) : _mm512_setzero_ps();
    for (int t = 0; t < NT; ++t) {
      float* yt = y + t * ldy + 16 * v;
      __m512 r = _mm512_add_ps(af[v][t], bv);
      if (!first) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(m, yt));
      _mm512_mask_storeu_ps(yt, m, r);
    }
  }
}

template <int NV, int NT>
void micro_nt(int nt, const uint8_t* p, const uint8_t* x, int nbk, float* y, int64_t ldy, int nr, bool first,
              const float* bias) {
  if constexpr (NT > 1)
    if (nt < NT) return micro_nt<NV, NT - 1>(nt, p, x, nbk, y, ldy, nr, first, bias);
  micro<NV, NT>(p, x, nbk, y, ldy, nr, first, bias);
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
      float* xd = (float*)(o + kXQuadBytes);
      int32_t* corr = (int32_t*)(o + kXQuadBytes + kQ8NT * 4);
      for (int t = 0; t < kQ8NT; ++t) {
        const int tok = j * kQ8NT + t;
        alignas(32) int8_t q[kQ8_0Block] = {};
        xd[t] = tok < n_tokens ? quantize_block(x + tok * cols + b * kQ8_0Block, q) : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < kQ8_0Block; ++i) sum += q[i];
        corr[t] = -128 * sum;
        for (int q4 = 0; q4 < 8; ++q4) std::memcpy(o + (q4 * kQ8NT + t) * 4, q + 4 * q4, 4);
      }
    }
  }
}

void matmul_q8_int8_gemm_vnni(const MatmulArgs& a, int64_t r0, int64_t r1) {
  const int64_t nb = a.cols / kQ8_0Block;
  const uint8_t* xp = (const uint8_t*)a.xq;
  alignas(64) uint8_t buf[(kMC / (kNV * 16)) * kKB * kPanelBlockBytes];  // 144 KiB: L2
  for (int64_t rb = r0; rb < r1; rb += kMC) {
    const int64_t re = r1 - rb < kMC ? r1 : rb + kMC;
    const int np = (int)((re - rb + kNV * 16 - 1) / (kNV * 16));
    for (int64_t b0 = 0; b0 < nb; b0 += kKB) {
      const int nbk = nb - b0 < kKB ? (int)(nb - b0) : kKB;
      for (int i = 0; i < np; ++i) {
        const int64_t r = rb + i * kNV * 16;
        pack_panel(a.w + r * a.row_bytes, a.row_bytes, (int)std::min<int64_t>(re - r, kNV * 16), b0, nbk,
                   buf + (size_t)i * kKB * kPanelBlockBytes);
      }
      const bool first = b0 == 0, last = b0 + nbk == nb;
      for (int t = 0; t < a.n_tokens; t += kQ8NT) {
        const int nt = a.n_tokens - t < kQ8NT ? a.n_tokens - t : kQ8NT;
        const uint8_t* x = xp + ((int64_t)(t / kQ8NT) * nb + b0) * kQ8TileBlockBytes;
        for (int i = 0; i < np; ++i) {
          const int64_t r = rb + i * kNV * 16;
          const int nr = (int)std::min<int64_t>(re - r, kNV * 16);
          const uint8_t* p = buf + (size_t)i * kKB * kPanelBlockBytes;
          float* y = a.y + (int64_t)t * a.rows + r;
          const float* bias = a.bias && last ? a.bias + r : nullptr;
          if (nr > 16)
            micro_nt<2, kQ8NT>(nt, p, x, nbk, y, a.rows, nr, first, bias);
          else
            micro_nt<1, kQ8NT>(nt, p, x, nbk, y, a.rows, nr, first, bias);
        }
      }
    }
  }
}

}  // namespace ultra::cpu::detail
