#include "dist/nccl_sum.h"

namespace ultra::dist {

namespace {

constexpr int kThreads = 256;

__device__ float bf16_to_f32(uint16_t h) {
  return __uint_as_float((uint32_t)h << 16);
}

// core/dtype.h's fp32_to_bf16, bit for bit (a NaN stays a quiet NaN).
__device__ uint16_t f32_to_bf16(float f) {
  uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

__global__ void sum_f32(const float* __restrict__ g, int size, size_t n, float* __restrict__ x) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float s = g[i];
    for (int r = 1; r < size; ++r) s = __fadd_rn(s, g[(size_t)r * n + i]);  // no contraction, no reordering
    x[i] = s;
  }
}

__global__ void sum_bf16(const uint16_t* __restrict__ g, int size, size_t n, uint16_t* __restrict__ x) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float s = bf16_to_f32(g[i]);
    for (int r = 1; r < size; ++r) s = __fadd_rn(s, bf16_to_f32(g[(size_t)r * n + i]));
    x[i] = f32_to_bf16(s);
  }
}

unsigned blocks(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return (unsigned)(b < 1024 ? (b ? b : 1) : 1024);
}

}  // namespace

cudaError_t rank_order_sum_f32(const float* g, int size, size_t n, float* x, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  sum_f32<<<blocks(n), kThreads, 0, stream>>>(g, size, n, x);
  return cudaGetLastError();
}

cudaError_t rank_order_sum_bf16(const uint16_t* g, int size, size_t n, uint16_t* x, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  sum_bf16<<<blocks(n), kThreads, 0, stream>>>(g, size, n, x);
  return cudaGetLastError();
}

}  // namespace ultra::dist
