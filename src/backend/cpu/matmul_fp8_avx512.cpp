// AVX-512 matmul of F8_E4M3 weights (matmul_fp8.h on simd::Avx512: 16 codes per step, masked column tail),
// compiled with ULTRA_AVX512_ISA; reached through matmul_kernels_avx512() only.
// GCC 12's avx512fintrin.h initialises its "undefined" vectors from themselves, which trips these
// (false-positive) warnings once the intrinsics are inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <cstdint>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/matmul_driver.h"
#include "backend/cpu/matmul_fp8.h"
#include "backend/cpu/simd_traits.h"

namespace ultra::cpu::detail {

void matmul_fp8_avx512(const MatmulArgs& a, int64_t r0, int64_t r1) {
  // 4 rows: 16 accumulators + 4 weight + 1 activation register of 32
  driver::range_scaled<Fp8<simd::Avx512, 4>>(a, r0, r1);
}

}  // namespace ultra::cpu::detail
