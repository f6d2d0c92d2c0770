// AVX-512 (F, BW, VL, DQ, on top of AVX2+FMA+F16C) matmul kernels, compiled with ULTRA_AVX512_ISA; only
// reached through matmul_kernels() after the run-time check of exactly those features (isa.cpp): the driver
// (matmul_driver.h) over the tiles, decode rows and panel GEMM of matmul_tile.h on simd::Avx512 (16 floats
// per step, masked loads for the column tail; Q8_0 weights dequantised in registers, 16 int8 -> int32 ->
// f32, times the block's f16 scale: exact in f32). See matmul.cpp.
// GCC 12's avx512fintrin.h initialises its "undefined" vectors from themselves, which trips these
// (false-positive) warnings once the intrinsics are inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/matmul_blocks.h"
#include "backend/cpu/matmul_driver.h"
#include "backend/cpu/matmul_panel_avx512.h"
#include "backend/cpu/matmul_tile.h"
#include "backend/cpu/simd_traits.h"

namespace ultra::cpu::detail {

// kR = 4: 16 accumulators + 4 weight + 1 activation register of 32.
const MatmulKernels& matmul_kernels_avx512() {
  using Isa = TileIsa<simd::Avx512, 4, panel::KernelAvx512>;
  static constexpr MatmulKernels k = driver::kernels<Isa>("avx512", matmul_fp8_avx512, matmul_ternary_avx512,
                                                          block_kernels<simd::Avx512, panel::KernelAvx512>());
  return k;
}

}  // namespace ultra::cpu::detail
