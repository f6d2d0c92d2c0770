// RoPE (interleaved and rotate-half) and the KV-cache write.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace ultra::cuda {

using namespace detail;

namespace {

constexpr int kRopeThreads = 128;
constexpr int kRopeMaxHalf = 512;  // head_dim <= 1024
constexpr int kKvThreads = 128;

// Rotates the heads of one token. cos/sin of the token's angles are computed once into shared memory.
// The angle is (float)pos * inv_freq[i] rounded to f32 (as HF and rope_ref); cos, sin and the rotation are
// evaluated in double and rounded once, as rope_ref does.
__device__ __forceinline__ void rope_token(float* q, int n_heads, float* k, int n_kv_heads, int t,
                                           int head_dim, const int32_t* pos, const float* inv_freq,
                                           bool interleaved, double* cs,
                                           double* sn) {  // [head_dim / 2] shared each
  const int half = head_dim / 2;
  const float p = (float)pos[t];
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float theta = __fmul_rn(p, inv_freq[i]);
    sincos((double)theta, &sn[i], &cs[i]);
  }
  __syncthreads();
  const int n_total = (n_heads + (k ? n_kv_heads : 0)) * half;
  for (int idx = threadIdx.x; idx < n_total; idx += blockDim.x) {
    const int head = idx / half, i = idx % half;
    float* xh = head < n_heads ? q + ((int64_t)t * n_heads + head) * head_dim
                               : k + ((int64_t)t * n_kv_heads + (head - n_heads)) * head_dim;
    const int i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
    const double x0 = xh[i0], x1 = xh[i1];
    xh[i0] = (float)(x0 * cs[i] - x1 * sn[i]);
    xh[i1] = (float)(x0 * sn[i] + x1 * cs[i]);
  }
}

__global__ void rope_kernel(float* q, int n_heads, float* k, int n_kv_heads, int head_dim, const int32_t* pos,
                            const float* inv_freq, bool interleaved) {
  __shared__ double cs[kRopeMaxHalf], sn[kRopeMaxHalf];
  rope_token(q, n_heads, k, n_kv_heads, blockIdx.x, head_dim, pos, inv_freq, interleaved, cs, sn);
}

// One (token, kv head) row of k and of v into the cache.
template <GgmlType T>
__device__ __forceinline__ void kv_write_row(const KvLayerView& kv, const float* k, const float* v, int t,
                                             int h, const int32_t* pos, const int32_t* seq) {
  const int s = seq[t], p = pos[t];
  if (s < 0 || s >= kv.n_slots || p < 0 || p >= kv.max_ctx) return;
  const int hd = kv.head_dim;
  const int64_t src = ((int64_t)t * kv.n_kv_heads + h) * hd;
  const int64_t dst = (((int64_t)s * kv.n_kv_heads + h) * kv.max_ctx + p) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    store_elem<T>(kv.k, dst + d, k[src + d]);
    store_elem<T>(kv.v, dst + d, v[src + d]);
  }
}

template <GgmlType T>
__global__ void kv_write_kernel(KvLayerView kv, const float* k, const float* v, const int32_t* pos,
                                const int32_t* seq) {
  kv_write_row<T>(kv, k, v, blockIdx.x, blockIdx.y, pos, seq);
}

}  // namespace

cudaError_t rope(float* q, int n_heads, float* k, int n_kv_heads, int n, int head_dim, const int32_t* pos,
                 const float* inv_freq, bool interleaved, cudaStream_t stream) {
  if (n < 0 || n_heads < 0 || head_dim <= 0 || head_dim % 2 != 0 || head_dim / 2 > kRopeMaxHalf ||
      (k && n_kv_heads < 0))
    return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  rope_kernel<<<n, kRopeThreads, 0, stream>>>(q, n_heads, k, n_kv_heads, head_dim, pos, inv_freq,
                                              interleaved);
  return cudaGetLastError();
}

cudaError_t kv_write(const KvLayerView& kv, const float* k, const float* v, int n, const int32_t* pos,
                     const int32_t* seq, cudaStream_t stream) {
  if (n < 0 || kv.n_kv_heads <= 0 || kv.head_dim <= 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const dim3 grid(n, kv.n_kv_heads);
  switch (kv.type) {
    case GgmlType::F32:
      kv_write_kernel<GgmlType::F32><<<grid, kKvThreads, 0, stream>>>(kv, k, v, pos, seq);
      break;
    case GgmlType::F16:
      kv_write_kernel<GgmlType::F16><<<grid, kKvThreads, 0, stream>>>(kv, k, v, pos, seq);
      break;
    case GgmlType::BF16:
      kv_write_kernel<GgmlType::BF16><<<grid, kKvThreads, 0, stream>>>(kv, k, v, pos, seq);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace ultra::cuda
