// Gemma 2/3's element-wise ops (kernels.h): the tanh-GELU gating, scaling (of the embeddings) and
// soft-capping (of the final logits). Grid-stride loops in f32, as PyTorch computes them; programmatic launch
// like the other element-wise kernels (trigger, then wait before reading).
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace ultra::cuda {

using namespace detail;

namespace {

constexpr int kThreads = 256;

int blocks(int64_t count) {
  const int64_t b = (count + kThreads - 1) / kThreads;
  return (int)(b < 4096 ? b : 4096);
}

__global__ void gelu_mul_kernel(const float* gate, const float* up, int64_t count, float* out) {
  pdl_trigger();
  pdl_wait();
  const float c = 0.79788456080286535588f;  // sqrt(2 / pi)
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
       i += (int64_t)gridDim.x * blockDim.x) {
    const float g = __ldcg(gate + i);
    out[i] = 0.5f * g * (1.0f + tanhf(c * (g + 0.044715f * g * g * g))) * __ldcg(up + i);
  }
}

__global__ void scale_kernel(float* x, int64_t count, float s) {
  pdl_trigger();
  pdl_wait();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
       i += (int64_t)gridDim.x * blockDim.x)
    x[i] = __ldcg(x + i) * s;
}

__global__ void softcap_kernel(float* x, int64_t count, float cap) {
  pdl_trigger();
  pdl_wait();
  const float inv = 1.0f / cap;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
       i += (int64_t)gridDim.x * blockDim.x)
    x[i] = tanhf(__ldcg(x + i) * inv) * cap;
}

}  // namespace

cudaError_t gelu_mul(const float* gate, const float* up, int64_t count, float* out, cudaStream_t stream) {
  if (count < 0) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  const cudaError_t e = launch_ex(gelu_mul_kernel, dim3(blocks(count)), dim3(kThreads), 0, stream, 1, kPdlAll,
                                  gate, up, count, out);
  return e != cudaSuccess ? e : cudaGetLastError();
}

cudaError_t scale(float* x, int64_t count, float s, cudaStream_t stream) {
  if (count < 0) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  const cudaError_t e =
      launch_ex(scale_kernel, dim3(blocks(count)), dim3(kThreads), 0, stream, 1, kPdlAll, x, count, s);
  return e != cudaSuccess ? e : cudaGetLastError();
}

cudaError_t softcap(float* x, int64_t count, float cap, cudaStream_t stream) {
  if (count < 0 || !(cap > 0)) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  const cudaError_t e =
      launch_ex(softcap_kernel, dim3(blocks(count)), dim3(kThreads), 0, stream, 1, kPdlAll, x, count, cap);
  return e != cudaSuccess ? e : cudaGetLastError();
}

}  // namespace ultra::cuda
