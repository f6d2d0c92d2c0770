// Prefill matmul for AVX2+FMA (included by matmul_avx2.cpp only, compiled with its ISA flags): the
// packed-panel GEMM of matmul_panel.h on simd::Avx2: panels of kMR = 16 rows (two vectors) x kKC = 256
// columns (16 KB of f32, k-major), micro-tiles of kNR = 6 tokens, 12 vector accumulators (2 loads + 6
// broadcasts per 12 FMAs); the column tail of a panel is packed value by value. Token tiles of x are packed
// by plain copies.
#pragma once

#include <cstdint>

#include "backend/cpu/matmul_panel.h"
#include "backend/cpu/simd_traits.h"

namespace ultra::cpu::detail {
namespace {  // internal linkage: this header is compiled with the AVX2 flags of one file only
namespace panel {

struct PackXAvx2 {
  static constexpr int kNR = 6;  // tokens per micro-tile: 2 x 6 accumulators
  // Packs tokens [0, nt) (nt <= kNR) x columns [0, kn) of x (row stride ldx) into xp[k][kNR], k-major.
  static void pack_x(const float* x, int64_t ldx, int nt, int kn, float* xp) {
    for (int t = 0; t < nt; ++t)
      for (int k = 0; k < kn; ++k) xp[(size_t)k * kNR + t] = x[t * ldx + k];
    for (int t = nt; t < kNR; ++t)
      for (int k = 0; k < kn; ++k) xp[(size_t)k * kNR + t] = 0.0f;
  }
};
using KernelAvx2 = Kernel<simd::Avx2, PackXAvx2::kNR, PackXAvx2>;

}  // namespace panel
}  // namespace
}  // namespace ultra::cpu::detail
