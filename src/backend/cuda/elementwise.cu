// Row and elementwise ops: embedding lookup, rmsnorm, silu_mul, add, gather_rows, f32 conversion; and the
// device query.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace ultra::cuda {

using namespace detail;

namespace {

constexpr int kRowThreads = 256;
constexpr int kEltThreads = 256;

int elt_blocks(int64_t count) {
  const int64_t b = (count + kEltThreads - 1) / kEltThreads;
  return (int)(b < 4096 ? b : 4096);  // grid-stride beyond
}

// ---- embed

template <GgmlType T>
__device__ __forceinline__ void embed_row(const WeightView& w,
                                          const int32_t* tokens,  // [n]
                                          int i,
                                          float* x) {  // [n, dim]
  const int32_t tok = tokens[i];
  float* xr = x + (int64_t)i * w.cols;
  if (tok < 0 || tok >= w.rows) {
    for (int64_t d = threadIdx.x; d < w.cols; d += blockDim.x) xr[d] = 0.0f;
    return;
  }
  const uint8_t* row = static_cast<const uint8_t*>(w.data) + (int64_t)tok * w.row_bytes;
  for (int64_t d = threadIdx.x; d < w.cols; d += blockDim.x) xr[d] = load_elem<T>(row, d);
}

template <GgmlType T>
__global__ void embed_kernel(WeightView w, const int32_t* tokens, float* x) {
  embed_row<T>(w, tokens, blockIdx.x, x);
}

// ---- rmsnorm

__device__ __forceinline__ void rmsnorm_row(const float* x,  // [n, dim]
                                            const float* w,  // [dim]
                                            int row, int dim, float eps,
                                            float* out,        // [n, dim]
                                            float* scratch) {  // [32] shared
  const float* xr = x + (int64_t)row * dim;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, scratch);
  const float scale = 1.0f / sqrtf(ss / (float)dim + eps);
  float* o = out + (int64_t)row * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = xr[i] * scale * w[i];
}

__global__ void rmsnorm_kernel(const float* x, const float* w, int dim, float eps, float* out) {
  __shared__ float scratch[32];
  rmsnorm_row(x, w, blockIdx.x, dim, eps, out, scratch);
}

// ---- elementwise

__device__ __forceinline__ float silu(float g) {
  return g / (1.0f + expf(-g));
}

template <bool kVec4>
__global__ void silu_mul_kernel(const float* gate, const float* up, int64_t count, float* out) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t t0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if constexpr (kVec4) {
    for (int64_t i = t0; i < count / 4; i += stride) {
      const float4 g = ld_f4(gate + 4 * i), u = ld_f4(up + 4 * i);
      reinterpret_cast<float4*>(out)[i] =
          make_float4(silu(g.x) * u.x, silu(g.y) * u.y, silu(g.z) * u.z, silu(g.w) * u.w);
    }
  } else {
    for (int64_t i = t0; i < count; i += stride) out[i] = silu(gate[i]) * up[i];
  }
}

template <bool kVec4>
__global__ void add_kernel(float* x, const float* y, int64_t count) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t t0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if constexpr (kVec4) {
    for (int64_t i = t0; i < count / 4; i += stride) {
      float4 a = reinterpret_cast<float4*>(x)[i];
      const float4 b = ld_f4(y + 4 * i);
      a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
      reinterpret_cast<float4*>(x)[i] = a;
    }
  } else {
    for (int64_t i = t0; i < count; i += stride) x[i] += y[i];
  }
}

__device__ __forceinline__ void gather_row(const float* x, const int32_t* rows, int r, int dim, float* out) {
  const int32_t src = rows[r];
  float* o = out + (int64_t)r * dim;
  if (src < 0) {
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = 0.0f;
    return;
  }
  const float* xr = x + (int64_t)src * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = xr[i];
}

__global__ void gather_rows_kernel(const float* x, const int32_t* rows, int dim, float* out) {
  gather_row(x, rows, blockIdx.x, dim, out);
}

template <GgmlType T>
__global__ void convert_kernel(const float* x, int64_t count, void* out) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
    store_elem<T>(out, i, x[i]);
}

}  // namespace

cudaError_t query_device(int device, DeviceInfo* out) {
  cudaDeviceProp p;
  if (cudaError_t e = cudaGetDeviceProperties(&p, device); e != cudaSuccess) return e;
  out->device = device;
  out->n_sms = p.multiProcessorCount;
  out->l2_bytes = (size_t)p.l2CacheSize;
  out->smem_optin_bytes = p.sharedMemPerBlockOptin;
  return cudaSuccess;
}

cudaError_t embed(const WeightView& tok_embd, const int32_t* tokens, int n, float* x, cudaStream_t stream) {
  if (n < 0 || tok_embd.cols <= 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  switch (tok_embd.type) {
    case GgmlType::F32:
      embed_kernel<GgmlType::F32><<<n, kRowThreads, 0, stream>>>(tok_embd, tokens, x);
      break;
    case GgmlType::F16:
      embed_kernel<GgmlType::F16><<<n, kRowThreads, 0, stream>>>(tok_embd, tokens, x);
      break;
    case GgmlType::BF16:
      embed_kernel<GgmlType::BF16><<<n, kRowThreads, 0, stream>>>(tok_embd, tokens, x);
      break;
    default:  // TODO(q8_0): dequantising row lookup
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t rmsnorm(const float* x, const float* w, int n, int dim, float eps, float* out,
                    cudaStream_t stream) {
  if (n < 0 || dim <= 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  rmsnorm_kernel<<<n, kRowThreads, 0, stream>>>(x, w, dim, eps, out);
  return cudaGetLastError();
}

cudaError_t silu_mul(const float* gate, const float* up, int64_t count, float* out, cudaStream_t stream) {
  if (count < 0) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  if (count % 4 == 0 && aligned16(gate) && aligned16(up) && aligned16(out))
    silu_mul_kernel<true><<<elt_blocks(count / 4), kEltThreads, 0, stream>>>(gate, up, count, out);
  else
    silu_mul_kernel<false><<<elt_blocks(count), kEltThreads, 0, stream>>>(gate, up, count, out);
  return cudaGetLastError();
}

cudaError_t add(float* x, const float* y, int64_t count, cudaStream_t stream) {
  if (count < 0) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  if (count % 4 == 0 && aligned16(x) && aligned16(y))
    add_kernel<true><<<elt_blocks(count / 4), kEltThreads, 0, stream>>>(x, y, count);
  else
    add_kernel<false><<<elt_blocks(count), kEltThreads, 0, stream>>>(x, y, count);
  return cudaGetLastError();
}

cudaError_t gather_rows(const float* x, const int32_t* rows, int n_out, int dim, float* out,
                        cudaStream_t stream) {
  if (n_out < 0 || dim <= 0) return cudaErrorInvalidValue;
  if (n_out == 0) return cudaSuccess;
  gather_rows_kernel<<<n_out, kRowThreads, 0, stream>>>(x, rows, dim, out);
  return cudaGetLastError();
}

cudaError_t convert_f32(const float* x, int64_t count, GgmlType to, void* out, cudaStream_t stream) {
  if (count < 0) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  switch (to) {
    case GgmlType::F16:
      convert_kernel<GgmlType::F16><<<elt_blocks(count), kEltThreads, 0, stream>>>(x, count, out);
      break;
    case GgmlType::BF16:
      convert_kernel<GgmlType::BF16><<<elt_blocks(count), kEltThreads, 0, stream>>>(x, count, out);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace ultra::cuda
