// RoPE (interleaved and rotate-half), the KV-cache write, and the two fused (rope_kv_write).
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace ultra::cuda {

using namespace detail;

namespace {

constexpr int kRopeThreads = 128;
constexpr int kRopeMaxHalf = 512;  // head_dim <= 1024
constexpr int kKvThreads = 128;

struct RopeArgs {
  float* q;  // [n, n_heads, head_dim]
  int n_heads;
  float* k;  // [n, n_kv, head_dim] or null (then n_kv = 0)
  int n_kv, head_dim;
  const float* v;  // [n, n_kv, head_dim] (kCache)
  KvLayerView kv;  // (kCache)
  const int32_t* pos;
  const int32_t* seq;  // (kCache)
  const float* inv_freq;
  bool interleaved;
  float mscale;  // cos and sin are multiplied by it (longrope), in double as rope_ref
};

// One thread per rotation pair of one token (block x = the token, y = a range of pairs), then with kCache one
// thread per element of the token's v rows: every thread does one round trip, so a decode step's RoPE costs
// about one memory latency. The angle is (float)pos * inv_freq[i] rounded to f32 (as HF and rope_ref); cos,
// sin and the rotation are evaluated in double and rounded once, as rope_ref does. With kCache the rotated k
// and v also go into the cache at (seq, head, pos) (rows with seq < 0, seq >= n_slots or pos outside [0,
// max_ctx) are rotated but not stored).
template <GgmlType T, bool kCache>
__global__ void rope_kernel(RopeArgs a) {
  // With kCache attention comes next: it may launch only once the projection before this kernel is done (its
  // blocks are large; early they would hold SMs that projection still needs), so the trigger follows the
  // wait.
  if constexpr (!kCache) pdl_trigger();
  pdl_wait();
  if constexpr (kCache) pdl_trigger();
  const int t = blockIdx.x, hd = a.head_dim, half = hd / 2;
  const int pairs = (a.n_heads + a.n_kv) * half;
  const int idx = blockIdx.y * blockDim.x + threadIdx.x;
  const int p = __ldcg(a.pos + t);
  int s = -1;
  bool store = false;
  if constexpr (kCache) {
    s = __ldcg(a.seq + t);
    store = s >= 0 && s < a.kv.n_slots && p >= 0 && p < a.kv.max_ctx;
  }
  if (idx < pairs) {
    const int head = idx / half, i = idx % half;
    const bool is_k = head >= a.n_heads;
    float* xh = !is_k ? a.q + ((int64_t)t * a.n_heads + head) * hd
                      : a.k + ((int64_t)t * a.n_kv + (head - a.n_heads)) * hd;
    const int i0 = a.interleaved ? 2 * i : i, i1 = a.interleaved ? 2 * i + 1 : i + half;
    const float theta = __fmul_rn((float)p, a.inv_freq[i]);
    double sn, cs;
    sincos((double)theta, &sn, &cs);
    sn *= a.mscale;
    cs *= a.mscale;
    const double x0 = __ldcg(xh + i0), x1 = __ldcg(xh + i1);
    const float r0 = (float)(x0 * cs - x1 * sn), r1 = (float)(x0 * sn + x1 * cs);
    xh[i0] = r0;
    xh[i1] = r1;
    if constexpr (kCache) {
      if (is_k && store) {
        const int64_t dst = (((int64_t)s * a.n_kv + (head - a.n_heads)) * a.kv.max_ctx + p) * hd;
        store_elem<T>(a.kv.k, dst + i0, r0);
        store_elem<T>(a.kv.k, dst + i1, r1);
      }
    }
  } else if constexpr (kCache) {
    const int j = idx - pairs;
    if (store && j < a.n_kv * hd) {
      const int h = j / hd, d = j % hd;
      const int64_t dst = (((int64_t)s * a.n_kv + h) * a.kv.max_ctx + p) * hd;
      store_elem<T>(a.kv.v, dst + d, __ldcg(a.v + ((int64_t)t * a.n_kv + h) * hd + d));
    }
  }
}

template <GgmlType T, bool kCache>
cudaError_t launch_rope(const RopeArgs& a, int n, cudaStream_t stream) {
  const int items = (a.n_heads + a.n_kv) * (a.head_dim / 2) + (kCache ? a.n_kv * a.head_dim : 0);
  if (items == 0) return cudaSuccess;
  const dim3 grid(n, (items + kRopeThreads - 1) / kRopeThreads);
  if (grid.y > 65535) return cudaErrorInvalidValue;
  return launch_ex(rope_kernel<T, kCache>, grid, dim3(kRopeThreads), 0, stream, 1, kPdlAll, a);
}

// One (token, kv head) row of k and of v into the cache.
template <GgmlType T>
__device__ __forceinline__ void kv_write_row(const KvLayerView& kv, const float* k, const float* v, int t,
                                             int h, const int32_t* pos, const int32_t* seq) {
  const int s = __ldcg(seq + t), p = __ldcg(pos + t);
  if (s < 0 || s >= kv.n_slots || p < 0 || p >= kv.max_ctx) return;
  const int hd = kv.head_dim;
  const int64_t src = ((int64_t)t * kv.n_kv_heads + h) * hd;
  const int64_t dst = (((int64_t)s * kv.n_kv_heads + h) * kv.max_ctx + p) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    store_elem<T>(kv.k, dst + d, __ldcg(k + src + d));
    store_elem<T>(kv.v, dst + d, __ldcg(v + src + d));
  }
}

template <GgmlType T>
__global__ void kv_write_kernel(KvLayerView kv, const float* k, const float* v, const int32_t* pos,
                                const int32_t* seq) {
  pdl_trigger();
  pdl_wait();
  kv_write_row<T>(kv, k, v, blockIdx.x, blockIdx.y, pos, seq);
}

}  // namespace

cudaError_t rope(float* q, int n_heads, float* k, int n_kv_heads, int n, int head_dim, const int32_t* pos,
                 const float* inv_freq, bool interleaved, cudaStream_t stream, float mscale) {
  if (n < 0 || n_heads < 0 || head_dim <= 0 || head_dim % 2 != 0 || head_dim / 2 > kRopeMaxHalf ||
      (k && n_kv_heads < 0))
    return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  RopeArgs a{};
  a.q = q, a.n_heads = n_heads, a.k = k, a.n_kv = k ? n_kv_heads : 0, a.head_dim = head_dim;
  a.pos = pos, a.inv_freq = inv_freq, a.interleaved = interleaved, a.mscale = mscale;
  if (cudaError_t e = launch_rope<GgmlType::F32, false>(a, n, stream)) return e;
  return cudaGetLastError();
}

cudaError_t kv_write(const KvLayerView& kv, const float* k, const float* v, int n, const int32_t* pos,
                     const int32_t* seq, cudaStream_t stream) {
  if (n < 0 || kv.n_kv_heads <= 0 || kv.head_dim <= 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const dim3 grid(n, kv.n_kv_heads);
  switch (kv.type) {
    case GgmlType::F32:
      if (cudaError_t e = launch_ex(kv_write_kernel<GgmlType::F32>, grid, dim3(kKvThreads), 0, stream, 1,
                                    kPdlAll, kv, k, v, pos, seq))
        return e;
      break;
    case GgmlType::F16:
      if (cudaError_t e = launch_ex(kv_write_kernel<GgmlType::F16>, grid, dim3(kKvThreads), 0, stream, 1,
                                    kPdlAll, kv, k, v, pos, seq))
        return e;
      break;
    case GgmlType::BF16:
      if (cudaError_t e = launch_ex(kv_write_kernel<GgmlType::BF16>, grid, dim3(kKvThreads), 0, stream, 1,
                                    kPdlAll, kv, k, v, pos, seq))
        return e;
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t rope_kv_write(float* q, int n_heads, float* k, const float* v, const KvLayerView& kv, int n,
                          const int32_t* pos, const int32_t* seq, const float* inv_freq, bool interleaved,
                          cudaStream_t stream, float mscale) {
  if (n < 0 || n_heads < 0 || !k || !v || kv.n_kv_heads <= 0 || kv.head_dim <= 0 || kv.head_dim % 2 != 0 ||
      kv.head_dim / 2 > kRopeMaxHalf)
    return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  RopeArgs a{};
  a.q = q, a.n_heads = n_heads, a.k = k, a.n_kv = kv.n_kv_heads, a.head_dim = kv.head_dim, a.v = v, a.kv = kv;
  a.pos = pos, a.seq = seq, a.inv_freq = inv_freq, a.interleaved = interleaved, a.mscale = mscale;
  cudaError_t e;
  switch (kv.type) {
    case GgmlType::F32:
      e = launch_rope<GgmlType::F32, true>(a, n, stream);
      break;
    case GgmlType::F16:
      e = launch_rope<GgmlType::F16, true>(a, n, stream);
      break;
    case GgmlType::BF16:
      e = launch_rope<GgmlType::BF16, true>(a, n, stream);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return e != cudaSuccess ? e : cudaGetLastError();
}

}  // namespace ultra::cuda
