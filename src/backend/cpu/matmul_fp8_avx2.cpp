// AVX2+FMA+F16C matmul of F8_E4M3 weights (matmul_fp8.h on simd::Avx2: 8 codes per step, scalar column
// tail), compiled with ULTRA_AVX2_ISA; reached through matmul_kernels_avx2() only.
#include <cstdint>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/matmul_driver.h"
#include "backend/cpu/matmul_fp8.h"
#include "backend/cpu/simd_traits.h"

namespace ultra::cpu::detail {

void matmul_fp8_avx2(const MatmulArgs& a, int64_t r0, int64_t r1) {
  // 2 rows: 8 accumulators + 2 weight + 1 activation register of 16
  driver::range_scaled<Fp8<simd::Avx2, 2>>(a, r0, r1);
}

}  // namespace ultra::cpu::detail
