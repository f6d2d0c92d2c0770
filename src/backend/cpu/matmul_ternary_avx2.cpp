// AVX2 matmul of TERNARY weights (matmul_ternary.h on simd::Avx2: two vectors per word, compares
// into all-ones masks), compiled with ULTRA_AVX2_ISA; reached through matmul_kernels_avx2() only.
#include <cstdint>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/matmul_driver.h"
#include "backend/cpu/matmul_ternary.h"
#include "backend/cpu/simd_traits.h"

namespace ultra::cpu::detail {

void matmul_ternary_avx2(const MatmulArgs& a, int64_t r0, int64_t r1) {
  driver::range_scaled<Ternary<simd::Avx2, 2>>(a, r0, r1);
}

}  // namespace ultra::cpu::detail
