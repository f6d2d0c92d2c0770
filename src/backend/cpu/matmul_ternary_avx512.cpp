// AVX-512 matmul of TERNARY weights (matmul_ternary.h on simd::Avx512: one vector per word, mask
// registers), compiled with ULTRA_AVX512_ISA; reached through matmul_kernels_avx512() only.
// GCC 12's avx512fintrin.h initialises its "undefined" vectors from themselves, which trips these
// (false-positive) warnings once the intrinsics are inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <cstdint>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/matmul_driver.h"
#include "backend/cpu/matmul_ternary.h"
#include "backend/cpu/simd_traits.h"

namespace ultra::cpu::detail {

void matmul_ternary_avx512(const MatmulArgs& a, int64_t r0, int64_t r1) {
  driver::range_scaled<Ternary<simd::Avx512, 4>>(a, r0, r1);
}

}  // namespace ultra::cpu::detail
