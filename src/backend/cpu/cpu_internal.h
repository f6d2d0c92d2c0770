// Private details shared by the CPU kernel files (not part of the ops.h interface).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ultra::cpu::detail {

// Activations quantised for the Q8_0 integer dot product: per token, nb = cols/32 blocks stored as
// qs[nb*32] int8 then d[nb] float (x[i] ~= d[b] * qs[i], d = amax/127 kept in f32, not rounded to f16).
// Size of one token's record in floats: nb*32 bytes of int8 + nb floats.
inline size_t q8_act_token_floats(int64_t cols) {
  return (size_t)(cols / 32) * 9;
}

// Everything a matmul range kernel needs. y[t * rows + r] for t < n_tokens, r in [r0, r1).
struct MatmulArgs {
  const uint8_t* w;
  size_t row_bytes;
  int64_t rows;
  int64_t cols;
  const float* x;   // [n_tokens, cols]
  const float* xq;  // Q8_0 only: quantised activations, q8_act_token_floats(cols) floats per token
  int n_tokens;
  float* y;
  const float* bias;
};
using MatmulRangeFn = void (*)(const MatmulArgs& a, int64_t r0, int64_t r1);

struct MatmulKernels {
  MatmulRangeFn f32, f16, bf16, q8_0;
  void (*quantize_act)(const float* x, int64_t cols, float* out);  // one token's record
  const char* name;
};

// Defined in matmul.cpp (AVX2+FMA+F16C) and matmul_avx512.cpp (AVX-512 F/BW/VL/VNNI).
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
