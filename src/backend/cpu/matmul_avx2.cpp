// AVX2+FMA+F16C matmul kernels (compiled with ULTRA_AVX2_ISA; reached through matmul_kernels() only after
// the run-time check): the driver (matmul_driver.h) over the tiles, decode rows and panel GEMM of
// matmul_tile.h on simd::Avx2 (8 floats per step, scalar column tails). See matmul.cpp for the structure
// and the Q8_0 arithmetic.
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/matmul_blocks.h"
#include "backend/cpu/matmul_driver.h"
#include "backend/cpu/matmul_panel_avx2.h"
#include "backend/cpu/matmul_tile.h"
#include "backend/cpu/simd_traits.h"

namespace ultra::cpu::detail {

// kR = 2: 8 accumulators + 2 weight + 1 activation register of 16.
const MatmulKernels& matmul_kernels_avx2() {
  using Isa = TileIsa<simd::Avx2, 2, panel::KernelAvx2>;
  static constexpr MatmulKernels k = driver::kernels<Isa>("avx2", matmul_fp8_avx2, matmul_ternary_avx2,
                                                          block_kernels<simd::Avx2, panel::KernelAvx2>());
  return k;
}

}  // namespace ultra::cpu::detail
