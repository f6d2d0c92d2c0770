// Prefill matmul for AVX-512 (included by matmul_avx512.cpp only, compiled with its ISA flags): the
// packed-panel GEMM of matmul_panel.h on simd::Avx512: panels of kMR = 32 rows (two vectors) x kKC = 256
// columns (32 KB of f32, k-major: the panel stays in L1), micro-tiles of kNR = 12 tokens, 24 vector
// accumulators (2 loads + 12 broadcasts per 24 FMAs); the column tail of a panel is packed by masked loads.
// Token tiles of x are packed by 16 x 16 transposes.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/matmul_panel.h"
#include "backend/cpu/simd_traits.h"

namespace ultra::cpu::detail {
namespace {  // internal linkage: this header is compiled with the AVX-512 flags of one file only
namespace panel {

struct PackXAvx512 {
  static constexpr int kNR = 12;  // tokens per micro-tile: 2 x 12 accumulators
  // Packs tokens [0, nt) (nt <= kNR) x columns [0, kn) of x (row stride ldx) into xp[k][kNR], k-major.
  static void pack_x(const float* x, int64_t ldx, int nt, int kn, float* xp) {
    using V = simd::Avx512;
    for (int k0 = 0; k0 < kn; k0 += 16) {
      const int kw = kn - k0 < 16 ? kn - k0 : 16;
      const __mmask16 m = (__mmask16)((1u << kw) - 1);
      __m512 v[16];
      for (int t = 0; t < 16; ++t)
        v[t] = t < nt ? _mm512_maskz_loadu_ps(m, x + t * ldx + k0) : _mm512_setzero_ps();
      V::transpose(v);
      for (int j = 0; j < kw; ++j)
        _mm512_mask_storeu_ps(xp + (size_t)(k0 + j) * kNR, (__mmask16)((1u << kNR) - 1), v[j]);
    }
  }
};
using KernelAvx512 = Kernel<simd::Avx512, PackXAvx512::kNR, PackXAvx512>;

}  // namespace panel
}  // namespace
}  // namespace ultra::cpu::detail
