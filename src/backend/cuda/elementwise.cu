// Row and elementwise ops: embedding lookup, rmsnorm, silu_mul, add, gather_rows, f32 conversion; and the
// device query.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/lowbit.cuh"

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
  const int32_t tok = __ldcg(tokens + i);
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
  pdl_trigger();
  pdl_wait();
  embed_row<T>(w, tokens, blockIdx.x, x);
}

// Q8_0 / F8_E4M3 / TERNARY (device layout): element by element (a row is read once per token).
__global__ void embed_lowbit_kernel(WeightView w, const int32_t* tokens, float* x) {
  pdl_trigger();
  pdl_wait();
  const int32_t tok = __ldcg(tokens + blockIdx.x);
  float* xr = x + (int64_t)blockIdx.x * w.cols;
  const bool in = tok >= 0 && tok < w.rows;
  for (int64_t d = threadIdx.x; d < w.cols; d += blockDim.x) xr[d] = in ? lowbit_elem(w, tok, d) : 0.0f;
}

// ---- rmsnorm

__device__ __forceinline__ void rmsnorm_row(const float* x,  // [n, dim]
                                            const float* w,  // [dim]
                                            int row, int dim, float eps,
                                            float* out,        // [n, dim]
                                            float* scratch) {  // [32] shared
  const float* xr = x + (int64_t)row * dim;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = __ldcg(xr + i);
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float scale = 1.0f / sqrtf(ss / (float)dim + eps);
  float* o = out + (int64_t)row * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = __ldcg(xr + i) * scale * w[i];
}

__global__ void rmsnorm_kernel(const float* x, const float* w, int dim, float eps, float* out) {
  __shared__ float scratch[32];
  pdl_trigger();
  pdl_wait();
  rmsnorm_row(x, w, blockIdx.x, dim, eps, out, scratch);
}

// One row per block, latency-bound when n is small (decode): every thread loads its V float4 of x at once
// (one L2 round trip), and keeps them for the output; the norm weights are loaded before pdl_wait. Needs
// dim % 4 == 0, 16-byte aligned x, w, out, and dim <= 4 V blockDim.
template <int V>
__global__ void rmsnorm_vec_kernel(const float* x, const float* w, int dim, float eps, float* out) {
  __shared__ float scratch[32];
  const int d4 = dim >> 2;
  const float4* xr = reinterpret_cast<const float4*>(x + (int64_t)blockIdx.x * dim);
  const float4* wr = reinterpret_cast<const float4*>(w);
  float4 wv[V], v[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    wv[k] = i < d4 ? __ldg(wr + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  pdl_trigger();
  pdl_wait();
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    v[k] = i < d4 ? __ldcg(xr + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < V; ++k) ss = __fadd_rn(ss, sumsq4(v[k]));
  ss = block_sum(ss, scratch);
  const float scale = rms_scale(ss, dim, eps);
  float4* o = reinterpret_cast<float4*>(out + (int64_t)blockIdx.x * dim);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < d4)
      o[i] = make_float4(v[k].x * scale * wv[k].x, v[k].y * scale * wv[k].y, v[k].z * scale * wv[k].z,
                         v[k].w * scale * wv[k].w);
  }
}

// ---- elementwise

template <bool kVec4>
__global__ void silu_mul_kernel(const float* gate, const float* up, int64_t count, float* out) {
  pdl_trigger();
  pdl_wait();
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t t0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if constexpr (kVec4) {
    for (int64_t i = t0; i < count / 4; i += stride) {
      const float4 g = __ldcg(reinterpret_cast<const float4*>(gate) + i);
      const float4 u = __ldcg(reinterpret_cast<const float4*>(up) + i);
      reinterpret_cast<float4*>(out)[i] =
          make_float4(silu_f(g.x) * u.x, silu_f(g.y) * u.y, silu_f(g.z) * u.z, silu_f(g.w) * u.w);
    }
  } else {
    for (int64_t i = t0; i < count; i += stride) out[i] = silu_f(__ldcg(gate + i)) * __ldcg(up + i);
  }
}

template <bool kVec4>
__global__ void add_kernel(float* x, const float* y, int64_t count) {
  pdl_trigger();
  pdl_wait();
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t t0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if constexpr (kVec4) {
    for (int64_t i = t0; i < count / 4; i += stride) {
      float4 a = __ldcg(reinterpret_cast<const float4*>(x) + i);
      const float4 b = __ldcg(reinterpret_cast<const float4*>(y) + i);
      a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
      reinterpret_cast<float4*>(x)[i] = a;
    }
  } else {
    for (int64_t i = t0; i < count; i += stride) x[i] = __ldcg(x + i) + __ldcg(y + i);
  }
}

__device__ __forceinline__ void gather_row(const float* x, const int32_t* rows, int r, int dim, float* out) {
  const int32_t src = __ldcg(rows + r);
  float* o = out + (int64_t)r * dim;
  if (src < 0) {
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = 0.0f;
    return;
  }
  const float* xr = x + (int64_t)src * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = __ldcg(xr + i);
}

__global__ void gather_rows_kernel(const float* x, const int32_t* rows, int dim, float* out) {
  pdl_trigger();
  pdl_wait();
  gather_row(x, rows, blockIdx.x, dim, out);
}

template <GgmlType T>
__global__ void convert_kernel(const float* x, int64_t count, void* out) {
  pdl_trigger();
  pdl_wait();
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
    store_elem<T>(out, i, __ldcg(x + i));
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
      if (cudaError_t e = launch_ex(embed_kernel<GgmlType::F32>, dim3(n), dim3(kRowThreads), 0, stream, 1,
                                    kPdlAll, tok_embd, tokens, x))
        return e;
      break;
    case GgmlType::F16:
      if (cudaError_t e = launch_ex(embed_kernel<GgmlType::F16>, dim3(n), dim3(kRowThreads), 0, stream, 1,
                                    kPdlAll, tok_embd, tokens, x))
        return e;
      break;
    case GgmlType::BF16:
      if (cudaError_t e = launch_ex(embed_kernel<GgmlType::BF16>, dim3(n), dim3(kRowThreads), 0, stream, 1,
                                    kPdlAll, tok_embd, tokens, x))
        return e;
      break;
    case GgmlType::Q8_0:
    case GgmlType::F8_E4M3:
    case GgmlType::TERNARY:
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
      if (!tok_embd.data || tok_embd.row_bytes < lowbit_row_bytes(tok_embd.type, tok_embd.cols) ||
          tok_embd.row_bytes % 16 != 0 ||
          (tok_embd.type != GgmlType::Q8_0 && !is_kquant(tok_embd.type) &&
           (!tok_embd.scale || tok_embd.scale_group <= 0)))
        return cudaErrorInvalidValue;
      if (cudaError_t e = launch_ex(embed_lowbit_kernel, dim3(n), dim3(kRowThreads), 0, stream, 1, kPdlAll,
                                    tok_embd, tokens, x))
        return e;
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t rmsnorm(const float* x, const float* w, int n, int dim, float eps, float* out,
                    cudaStream_t stream) {
  if (n < 0 || dim <= 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  cudaError_t e;
  const int d4 = dim / 4;
  if (dim % 4 == 0 && aligned16(x) && aligned16(w) && aligned16(out) && d4 <= 4 * 1024) {
    const int v = (d4 + 1023) / 1024;                       // float4 per thread: 1..4
    const int threads = ((d4 + v - 1) / v + 31) / 32 * 32;  // <= 1024
    switch (v) {
      case 1:
        e = launch_ex(rmsnorm_vec_kernel<1>, dim3(n), dim3(threads), 0, stream, 1, kPdlAll, x, w, dim, eps,
                      out);
        break;
      case 2:
        e = launch_ex(rmsnorm_vec_kernel<2>, dim3(n), dim3(threads), 0, stream, 1, kPdlAll, x, w, dim, eps,
                      out);
        break;
      default:
        e = launch_ex(rmsnorm_vec_kernel<4>, dim3(n), dim3(threads), 0, stream, 1, kPdlAll, x, w, dim, eps,
                      out);
        break;
    }
  } else {
    e = launch_ex(rmsnorm_kernel, dim3(n), dim3(kRowThreads), 0, stream, 1, kPdlAll, x, w, dim, eps, out);
  }
  return e != cudaSuccess ? e : cudaGetLastError();
}

cudaError_t silu_mul(const float* gate, const float* up, int64_t count, float* out, cudaStream_t stream) {
  if (count < 0) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  cudaError_t e;
  if (count % 4 == 0 && aligned16(gate) && aligned16(up) && aligned16(out)) {
    e = launch_ex(silu_mul_kernel<true>, dim3(elt_blocks(count / 4)), dim3(kEltThreads), 0, stream, 1,
                  kPdlAll, gate, up, count, out);
  } else {
    e = launch_ex(silu_mul_kernel<false>, dim3(elt_blocks(count)), dim3(kEltThreads), 0, stream, 1, kPdlAll,
                  gate, up, count, out);
  }
  return e != cudaSuccess ? e : cudaGetLastError();
}

cudaError_t add(float* x, const float* y, int64_t count, cudaStream_t stream) {
  if (count < 0) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  cudaError_t e;
  if (count % 4 == 0 && aligned16(x) && aligned16(y)) {
    e = launch_ex(add_kernel<true>, dim3(elt_blocks(count / 4)), dim3(kEltThreads), 0, stream, 1, kPdlAll, x,
                  y, count);
  } else {
    e = launch_ex(add_kernel<false>, dim3(elt_blocks(count)), dim3(kEltThreads), 0, stream, 1, kPdlAll, x, y,
                  count);
  }
  return e != cudaSuccess ? e : cudaGetLastError();
}

cudaError_t gather_rows(const float* x, const int32_t* rows, int n_out, int dim, float* out,
                        cudaStream_t stream) {
  if (n_out < 0 || dim <= 0) return cudaErrorInvalidValue;
  if (n_out == 0) return cudaSuccess;
  if (cudaError_t e = launch_ex(gather_rows_kernel, dim3(n_out), dim3(kRowThreads), 0, stream, 1, kPdlAll, x,
                                rows, dim, out))
    return e;
  return cudaGetLastError();
}

cudaError_t convert_f32(const float* x, int64_t count, GgmlType to, void* out, cudaStream_t stream) {
  if (count < 0) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  switch (to) {
    case GgmlType::F16:
      if (cudaError_t e = launch_ex(convert_kernel<GgmlType::F16>, dim3(elt_blocks(count)), dim3(kEltThreads),
                                    0, stream, 1, kPdlAll, x, count, out))
        return e;
      break;
    case GgmlType::BF16:
      if (cudaError_t e = launch_ex(convert_kernel<GgmlType::BF16>, dim3(elt_blocks(count)),
                                    dim3(kEltThreads), 0, stream, 1, kPdlAll, x, count, out))
        return e;
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace ultra::cuda
