// The matmul driver shared by the SIMD matmul files: how a row range is walked (decode one row at a time,
// prefill in row x token tiles over token chunks that stay in L2). The instruction set is a template
// parameter: each ISA file (matmul_avx2.cpp, matmul_avx512.cpp) includes this header and defines, in an
// anonymous namespace, a traits struct
//
//   struct Isa {
//     using F32 = ..., F16 = ..., BF16 = ..., Q8 = ...;  // loader types (Q8: a tag for Q8_0)
//     static constexpr int kR = ..., kT = ...;           // register tile: kR rows x kT tokens
//     template <class L, int R, int T> static void tile_f(w, rb, x, cols, y, ldy, bias);  // float types
//     template <int R, int T> static void tile_q8(w, rb, x, cols, y, ldy, bias);           // Q8_0
//     template <class L> static float dot_row_f(const uint8_t* w, const float* x, int64_t cols);
//     static float dot_row_q8(const uint8_t* w, const float* x, int64_t cols);
//     static constexpr int kPanelMinTokens = ...;  // > 0: steps of at least this many tokens go to
//     template <class L> static void gemm(const MatmulArgs& a, int64_t r0, int64_t r1);  // (rows r0..r1)
//     static constexpr int kPanelNR = ...;           // its token tile, and the packing of its x:
//     static void pack_x(const float* x, int n_tokens, int64_t cols, int j0, int j1, float* xp);
//   };
//
// and gets its kernel table from driver::kernels<Isa>(name). Every template here takes Isa, a type with
// internal linkage, so every instantiation has internal linkage too: the AVX2 and AVX-512 copies of the
// driver can never be merged by the linker (see cpu_internal.h).
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cpu/cpu_internal.h"

namespace ultra::cpu::detail::driver {

// Row tile kernels by weight type.
template <class Isa, class L, int R, int T>
inline void tile(const uint8_t* w, size_t rb, const float* x, int64_t cols, float* y, int64_t ldy,
                 const float* bias) {
  if constexpr (std::is_same_v<L, typename Isa::Q8>)
    Isa::template tile_q8<R, T>(w, rb, x, cols, y, ldy, bias);
  else
    Isa::template tile_f<L, R, T>(w, rb, x, cols, y, ldy, bias);
}

// Decode: one row at a time, so that each thread reads one sequential stream (interleaved row streams
// confuse the hardware prefetchers: 4-row tiles ran Q8_0 at a sixth of the bandwidth on Zen 5).
template <class Isa, class L>
void decode_f(const MatmulArgs& a, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    float s;
    if constexpr (std::is_same_v<L, typename Isa::Q8>)
      s = Isa::dot_row_q8(a.w + r * a.row_bytes, a.x, a.cols);
    else
      s = Isa::template dot_row_f<L>(a.w + r * a.row_bytes, a.x, a.cols);
    a.y[r] = a.bias ? s + a.bias[r] : s;
  }
}

// Tokens of a prefill chunk whose activations stay in L2 while the row tile is reused from L1.
template <class Isa>
inline int token_chunk(int64_t x_bytes_per_token, int tile) {
  int64_t n = (256 * 1024) / (x_bytes_per_token > 0 ? x_bytes_per_token : 1);
  n = n / tile * tile;
  return (int)(n < tile ? tile : n);
}

template <class Isa, class L, int R, int T>
inline void tokens_f(const MatmulArgs& a, const uint8_t* w, int64_t r, int t0, int t1) {
  const float* bias = a.bias ? a.bias + r : nullptr;
  int t = t0;
  for (; t + T <= t1; t += T)
    tile<Isa, L, R, T>(w, a.row_bytes, a.x + t * a.cols, a.cols, a.y + t * a.rows + r, a.rows, bias);
  switch (t1 - t) {
    case 3:
      tile<Isa, L, R, 3>(w, a.row_bytes, a.x + t * a.cols, a.cols, a.y + t * a.rows + r, a.rows, bias);
      break;
    case 2:
      tile<Isa, L, R, 2>(w, a.row_bytes, a.x + t * a.cols, a.cols, a.y + t * a.rows + r, a.rows, bias);
      break;
    case 1:
      tile<Isa, L, R, 1>(w, a.row_bytes, a.x + t * a.cols, a.cols, a.y + t * a.rows + r, a.rows, bias);
      break;
    default:
      break;
  }
}

template <class Isa, class L>
void range_f(const MatmulArgs& a, int64_t r0, int64_t r1) {
  if (a.n_tokens == 1) return decode_f<Isa, L>(a, r0, r1);
  // An ISA with a packed-panel GEMM (Isa::kPanelMinTokens > 0) takes steps of at least that many tokens.
  if constexpr (Isa::kPanelMinTokens > 0)
    if (a.n_tokens >= Isa::kPanelMinTokens && panel_gemm_enabled()) return Isa::template gemm<L>(a, r0, r1);
  constexpr int kR = Isa::kR, kT = Isa::kT;
  static_assert(kT == 4, "tokens_f handles tails of up to 3 tokens");
  const int chunk = token_chunk<Isa>(a.cols * 4, kT);
  for (int tc = 0; tc < a.n_tokens; tc += chunk) {
    const int tc1 = tc + chunk < a.n_tokens ? tc + chunk : a.n_tokens;
    int64_t r = r0;
    for (; r + kR <= r1; r += kR) tokens_f<Isa, L, kR, kT>(a, a.w + r * a.row_bytes, r, tc, tc1);
    for (; r < r1; ++r) tokens_f<Isa, L, 1, kT>(a, a.w + r * a.row_bytes, r, tc, tc1);
  }
}

template <class Isa>
constexpr MatmulKernels kernels(const char* name, MatmulRangeFn fp8, MatmulRangeFn ternary,
                                BlockKernelTable blocks) {
  return MatmulKernels{range_f<Isa, typename Isa::F32>,
                       range_f<Isa, typename Isa::F16>,
                       range_f<Isa, typename Isa::BF16>,
                       range_f<Isa, typename Isa::Q8>,
                       fp8,
                       ternary,
                       name,
                       Isa::pack_x,
                       Isa::kPanelNR,
                       Isa::kPanelMinTokens,
                       blocks};
}

// The driver of the scaled types (F8_E4M3, TERNARY: matmul_fp8_*.cpp, matmul_ternary_*.cpp), the same walk
// as range_f: decode one row at a time, prefill in R x T tiles over L2-sized token chunks. K is a kernel
// struct with internal linkage:
//   static constexpr int kR, kT;
//   static float dot_row(const MatmulArgs& a, int64_t r);             // row r . x[0], scales applied
//   template <int R, int T> static void tile(const MatmulArgs& a, int64_t r, int t);
//     // y[(t + i) * rows + r + j] for j < R, i < T, scales and bias applied
template <class K, int R>
inline void scaled_tokens(const MatmulArgs& a, int64_t r, int t0, int t1) {
  constexpr int kT = K::kT;
  static_assert(kT == 4, "scaled_tokens handles tails of up to 3 tokens");
  int t = t0;
  for (; t + kT <= t1; t += kT) K::template tile<R, kT>(a, r, t);
  switch (t1 - t) {
    case 3:
      K::template tile<R, 3>(a, r, t);
      break;
    case 2:
      K::template tile<R, 2>(a, r, t);
      break;
    case 1:
      K::template tile<R, 1>(a, r, t);
      break;
    default:
      break;
  }
}

template <class K>
void range_scaled(const MatmulArgs& a, int64_t r0, int64_t r1) {
  if (a.n_tokens == 1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float s = K::dot_row(a, r);
      a.y[r] = a.bias ? s + a.bias[r] : s;
    }
    return;
  }
  constexpr int kR = K::kR;
  const int chunk = token_chunk<K>(a.cols * 4, K::kT);
  for (int tc = 0; tc < a.n_tokens; tc += chunk) {
    const int tc1 = tc + chunk < a.n_tokens ? tc + chunk : a.n_tokens;
    int64_t r = r0;
    for (; r + kR <= r1; r += kR) scaled_tokens<K, kR>(a, r, tc, tc1);
    for (; r < r1; ++r) scaled_tokens<K, 1>(a, r, tc, tc1);
  }
}

}  // namespace ultra::cpu::detail::driver
