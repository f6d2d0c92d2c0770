// The block-quantized weight types of core/quants.h and quants_iq.h (Q4_0 .. Q6_K, IQ4_NL, IQ4_XS, MXFP4, the
// grid i-quants) in the SIMD matmul
// files (matmul_avx2.cpp, matmul_avx512.cpp), on f32 activations: each block is decoded (quant_decode.h) to
// int8 codes and per-16 scales and offsets, its exact f32 values made in registers (one FMA per vector),
// and multiplied like an F32 row. The result is the f32 dot product of the dequantised weights: the
// scalar reference (matmul.cpp's ref_rows, double accumulation of the same values) within f32 rounding, and
// no activation quantisation. This is the exact path of these types (the one fixtures and perplexity
// comparisons pin), and the fallback on CPUs without the integer dot products.
//
//   decode (1 token): one row at a time, a block decoded and dotted with x in four vector chains;
//   prefill, < 16 tokens: per row, token tiles of up to 4, each block decoded once per tile;
//   prefill, >= 16 tokens: the packed-panel GEMM (matmul_panel.h), its panels packed from rows decoded 256
//     columns at a time (LoadBlocks::pack_panel), so a weight is decoded once per step.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/matmul_panel.h"
#include "backend/cpu/matmul_tile.h"
#include "backend/cpu/quant_decode.h"
#include "backend/cpu/simd_traits.h"
#include "core/quants.h"

namespace ultra::cpu::detail {
namespace {  // internal linkage: instantiated with the ISA flags of one file only

// The values of a decoded block (quant_decode.h): t[i] = fma(s, code, o), W at a time.
template <class V, int QK>
inline void expand(const Decoded<QK>& d, float* t) {
  constexpr int W = V::W;
  for (int c = 0; c < QK / 16; ++c) {
    const typename V::F s = V::set1(d.s[c]), o = V::set1(d.o[c]);
    for (int p = 0; p < 16 / W; ++p)
      V::store(t + 16 * c + W * p, V::fmadd(s, V::q8_widen(d.q + 16 * c + W * p), o));
  }
}

// row . x over cols (a multiple of the block size): each block decoded, its values made and multiplied in
// registers, four accumulator chains.
template <class V, class B>
inline float dot_row_blocks(const uint8_t* w, const float* x, int64_t cols) {
  constexpr int QK = kBlockElems<B>, W = V::W;
  const B* b = (const B*)w;
  const int64_t nb = cols / QK;
  Decoded<QK> d;
  typename V::F acc[4] = {V::zero(), V::zero(), V::zero(), V::zero()};
  for (int64_t i = 0; i < nb; ++i) {
    const char* pf = (const char*)(b + i) + kDecodePrefetchBytes;
    for (int l = 0; l < ((int)sizeof(B) + 63) / 64; ++l) _mm_prefetch(pf + 64 * l, _MM_HINT_T0);
    decode(b[i], d);
    const float* xi = x + i * QK;
    for (int c = 0; c < QK / 16; ++c) {
      const typename V::F s = V::set1(d.s[c]), o = V::set1(d.o[c]);
      for (int p = 0; p < 16 / W; ++p) {
        const int k = 16 * c + W * p;
        acc[(k / W) % 4] = V::fmadd(V::fmadd(s, V::q8_widen(d.q + k), o), V::load(xi + k), acc[(k / W) % 4]);
      }
    }
  }
  return V::hsum(V::add(V::add(acc[0], acc[1]), V::add(acc[2], acc[3])));
}

// Row w times tokens [0, T) of x: y[t * ldy] = w . x[t] (+ bias), each block decoded once.
template <class V, class B, int T>
inline void tile_blocks(const uint8_t* w, const float* x, int64_t cols, float* y, int64_t ldy,
                        const float* bias) {
  constexpr int QK = kBlockElems<B>, W = V::W, kVecs = QK / W;
  const B* b = (const B*)w;
  const int64_t nb = cols / QK;
  Decoded<QK> d;
  alignas(64) float t[QK];
  typename V::F acc[T][2];
  for (int j = 0; j < T; ++j) acc[j][0] = acc[j][1] = V::zero();
  for (int64_t i = 0; i < nb; ++i) {
    decode(b[i], d);
    expand<V>(d, t);
    for (int k = 0; k < kVecs; ++k) {
      const typename V::F wv = V::load(t + W * k);
      for (int j = 0; j < T; ++j)
        acc[j][k % 2] = V::fmadd(wv, V::load(x + j * cols + i * QK + W * k), acc[j][k % 2]);
    }
  }
  for (int j = 0; j < T; ++j) {
    const float s = V::hsum(V::add(acc[j][0], acc[j][1]));
    y[j * ldy] = bias ? s + *bias : s;
  }
}

// The panel GEMM's pack hook (matmul_panel.h's Kernel::pack takes it for loaders with pack_panel): rows
// [0, nr) x columns [kc, kc + kn) decoded into a row-major buffer, then packed as F32.
template <class V, class B>
struct LoadBlocks {
  static constexpr bool kPackPanel = true;
  template <int kMR>
  static void pack_panel(const uint8_t* w, size_t rb, int nr, int64_t kc, int kn, float* p) {
    constexpr int QK = kBlockElems<B>;
    alignas(64) float rows[kMR * panel::kKC];
    Decoded<QK> d;
    for (int i = 0; i < nr; ++i) {
      const B* b = (const B*)(w + i * rb) + kc / QK;
      for (int k = 0; k < kn / QK; ++k) {
        decode(b[k], d);
        expand<V>(d, rows + i * panel::kKC + k * QK);
      }
    }
    panel::pack<V, kMR, LoadF32<V>>((const uint8_t*)rows, panel::kKC * sizeof(float), nr, 0, kn, p);
  }
};

template <class V, class B, int T>
inline void tokens_blocks(const MatmulArgs& a, int64_t r, int t0, int t1) {
  const uint8_t* w = a.w + r * a.row_bytes;
  const float* bias = a.bias ? a.bias + r : nullptr;
  int t = t0;
  for (; t + T <= t1; t += T)
    tile_blocks<V, B, T>(w, a.x + t * a.cols, a.cols, a.y + t * a.rows + r, a.rows, bias);
  switch (t1 - t) {
    case 3:
      return tile_blocks<V, B, 3>(w, a.x + t * a.cols, a.cols, a.y + t * a.rows + r, a.rows, bias);
    case 2:
      return tile_blocks<V, B, 2>(w, a.x + t * a.cols, a.cols, a.y + t * a.rows + r, a.rows, bias);
    case 1:
      return tile_blocks<V, B, 1>(w, a.x + t * a.cols, a.cols, a.y + t * a.rows + r, a.rows, bias);
    default:
      return;
  }
}

// The range kernel of block type B (MatmulKernels::blocks) for the ISA's vectors V and panel kernel K.
template <class V, class K, class B>
void range_blocks(const MatmulArgs& a, int64_t r0, int64_t r1) {
  if (a.n_tokens == 1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float s = dot_row_blocks<V, B>(a.w + r * a.row_bytes, a.x, a.cols);
      a.y[r] = a.bias ? s + a.bias[r] : s;
    }
    return;
  }
  if (a.n_tokens >= 16 && panel_gemm_enabled()) return panel_driver::gemm<K, LoadBlocks<V, B>>(a, r0, r1);
  for (int64_t r = r0; r < r1; ++r) tokens_blocks<V, B, 4>(a, r, 0, a.n_tokens);
}

// The table of MatmulKernels::blocks, in BlockKind order.
template <class V, class K>
constexpr BlockKernelTable block_kernels() {
  return BlockKernelTable{
      range_blocks<V, K, BlockQ4_0>,    range_blocks<V, K, BlockQ4_1>,   range_blocks<V, K, BlockQ5_0>,
      range_blocks<V, K, BlockQ5_1>,    range_blocks<V, K, BlockQ2_K>,   range_blocks<V, K, BlockQ3_K>,
      range_blocks<V, K, BlockQ4_K>,    range_blocks<V, K, BlockQ5_K>,   range_blocks<V, K, BlockQ6_K>,
      range_blocks<V, K, BlockIQ4_NL>,  range_blocks<V, K, BlockIQ4_XS>, range_blocks<V, K, BlockMXFP4>,
      range_blocks<V, K, BlockIQ2_XXS>, range_blocks<V, K, BlockIQ2_XS>, range_blocks<V, K, BlockIQ2_S>,
      range_blocks<V, K, BlockIQ3_XXS>, range_blocks<V, K, BlockIQ3_S>,  range_blocks<V, K, BlockIQ1_S>,
      range_blocks<V, K, BlockIQ1_M>};
}

}  // namespace
}  // namespace ultra::cpu::detail
