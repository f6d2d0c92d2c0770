// Private details shared by the CPU kernel files (not part of the ops.h interface).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ultra::cpu::detail {

// Everything a matmul range kernel needs. y[t * rows + r] for t < n_tokens, r in [r0, r1).
struct MatmulArgs {
  const uint8_t* w;
  size_t row_bytes;
  int64_t rows;
  int64_t cols;
  const float* x;  // [n_tokens, cols]
  int n_tokens;
  float* y;
  const float* bias;
};
using MatmulRangeFn = void (*)(const MatmulArgs& a, int64_t r0, int64_t r1);

struct MatmulKernels {
  MatmulRangeFn f32, f16, bf16, q8_0;
  const char* name;
};

// Defined in matmul.cpp (AVX2+FMA+F16C) and matmul_avx512.cpp (AVX-512 F/BW/VL/DQ).
const MatmulKernels& matmul_kernels_avx2();
const MatmulKernels& matmul_kernels_avx512();
// The kernels chosen for this machine (checked once, cached; ULTRA_NO_AVX512=1 forces AVX2).
const MatmulKernels& matmul_kernels();
// Whether this CPU can run matmul_kernels_avx512().
bool cpu_has_avx512();
// Tests/benchmarks: make matmul() use k (nullptr: back to matmul_kernels()). Not thread-safe w.r.t. running
// matmuls; call between them.
void set_matmul_kernels_override(const MatmulKernels* k);

}  // namespace ultra::cpu::detail
