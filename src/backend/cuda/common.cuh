// Device helpers shared by the CUDA kernels: element loads and conversions, TF32 tensor-core MMA,
// warp / block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "core/dtype.h"

namespace ultra::cuda::detail {

constexpr unsigned kFullMask = 0xffffffffu;

inline bool aligned16(const void* p) {
  return ((uintptr_t)p & 15) == 0;
}

// Bytes per element of the dense weight types the matmul kernels take (F32, F16, BF16); 0 for any other
// (the low-bit types Q8_0 / F8_E4M3 / TERNARY have their own kernels: gemv_lowbit.h).
inline int64_t dense_elem_bytes(GgmlType t) {
  return t == GgmlType::F32 ? 4 : (t == GgmlType::F16 || t == GgmlType::BF16) ? 2 : 0;
}

// ---- Loads -----------------------------------------------------------------------------------------------

// 16 bytes of data read once (weights, KV cache): read-only path, not kept in L1 (which holds the
// activations every warp re-reads), with a 256-byte L2 prefetch of the following bytes of the stream.
__device__ __forceinline__ uint4 ld_stream16(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// silu(g) = g / (1 + exp(-g)), as silu_mul and the SwiGLU prologue of the streaming gemv evaluate it.
__device__ __forceinline__ float silu_f(float g) {
  return g / (1.0f + expf(-g));
}

// gpt-oss's clamped SwiGLU, cpu::swiglu_oai (backend/cpu/ops.h) term by term: g = min(gate, limit),
// u = clamp(up, -limit, limit) (std::min / std::clamp's comparisons, NaN handling included), then
// (u + 1) * g * sigmoid(1.702 g), each operation rounded as the CPU rounds it (expf within 2 ulp of libm).
__device__ __forceinline__ float swiglu_oai_f(float gate, float up, float limit) {
  const float g = limit < gate ? limit : gate;
  const float u = up < -limit ? -limit : limit < up ? limit : up;
  const float glu = __fmul_rn(g, __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-__fmul_rn(g, 1.702f)))));
  return __fmul_rn(__fadd_rn(u, 1.0f), glu);
}

// x^2 + y^2 + z^2 + w^2 in a fixed order (explicit roundings: no contraction choices left to the compiler,
// so that rmsnorm and the gemv prologue that replays it agree bit for bit).
__device__ __forceinline__ float sumsq4(float4 v) {
  return __fmaf_rn(v.w, v.w, __fmaf_rn(v.z, v.z, __fmaf_rn(v.y, v.y, __fmul_rn(v.x, v.x))));
}

// rmsnorm's scale from the sum of squares of a row of dim floats.
__device__ __forceinline__ float rms_scale(float ss, int dim, float eps) {
  return 1.0f / sqrtf(ss / (float)dim + eps);
}

__device__ __forceinline__ float4 ld_f4(const float* p) {
  return __ldg(reinterpret_cast<const float4*>(p));
}

// One element of type T at index i, as f32 (any alignment of the row).
template <GgmlType T>
__device__ __forceinline__ float load_elem(const void* base, int64_t i) {
  if constexpr (T == GgmlType::F32) {
    return static_cast<const float*>(base)[i];
  } else if constexpr (T == GgmlType::F16) {
    return __half2float(static_cast<const __half*>(base)[i]);
  } else {
    static_assert(T == GgmlType::BF16);
    return __uint_as_float((uint32_t) static_cast<const uint16_t*>(base)[i] << 16);
  }
}

// f32 -> element of type T (round to nearest even), stored at index i.
template <GgmlType T>
__device__ __forceinline__ void store_elem(void* base, int64_t i, float v) {
  if constexpr (T == GgmlType::F32) {
    static_cast<float*>(base)[i] = v;
  } else if constexpr (T == GgmlType::F16) {
    static_cast<__half*>(base)[i] = __float2half_rn(v);
  } else {
    static_assert(T == GgmlType::BF16);
    static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v);
  }
}

// ---- TF32 tensor-core MMA --------------------------------------------------------------------------------
//
// mma.sync m16n8k8 .tf32, fragments per lane (g = lane / 4, t = lane % 4):
//   A (16x8, row-major): a0 = A[g][t], a1 = A[g+8][t], a2 = A[g][t+4], a3 = A[g+8][t+4]
//   B (8x8, "col"):      b0 = B[t][g], b1 = B[t+4][g]
//   C (16x8):            c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]
// The kernels exploit that the k order of a product is free: lane t of a row loads 8 consecutive elements
// (16 bytes) and uses elements (2s, 2s+1) as its k = t and k = t + 4 of the s-th MMA; the B side (x) uses
// the same mapping, so the sum over k covers every column exactly once.

__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// x = hi + lo with hi, lo in TF32; hi + lo equals x to ~2^-22 relative.
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = to_tf32(x);
  lo = to_tf32(x - __uint_as_float(hi));
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// A chunk of 8 consecutive elements of a weight / cache row, as raw 32-bit words: 4 words for F16 / BF16
// (one 16-byte load), 8 for F32 (two loads).
template <GgmlType T>
struct Chunk8 {
  static constexpr int kWords = T == GgmlType::F32 ? 8 : 4;
  uint32_t w[kWords];

  __device__ __forceinline__ void load(const void* p) {  // p: 16-byte aligned
    const uint4 a = ld_stream16(p);
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
    if constexpr (kWords == 8) {
      const uint4 b = ld_stream16(static_cast<const uint8_t*>(p) + 16);
      w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
    }
  }
  __device__ __forceinline__ void load_shared(const void* p) {  // p: 16-byte aligned shared memory
    const uint4 a = *static_cast<const uint4*>(p);
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
    if constexpr (kWords == 8) {
      const uint4 b = *reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(p) + 16);
      w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
    }
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = 0;
  }
  // Elements 2s and 2s+1 as f32 values.
  __device__ __forceinline__ float2 pair(int s) const {
    if constexpr (T == GgmlType::F32) {
      return make_float2(__uint_as_float(w[2 * s]), __uint_as_float(w[2 * s + 1]));
    } else if constexpr (T == GgmlType::F16) {
      __half2 h;
      memcpy(&h, &w[s], 4);
      return __half22float2(h);
    } else {
      return make_float2(__uint_as_float(w[s] << 16), __uint_as_float(w[s] & 0xffff0000u));
    }
  }
  // Element e (0..7) as f32.
  __device__ __forceinline__ float elem(int e) const {
    const float2 p = pair(e >> 1);
    return (e & 1) ? p.y : p.x;
  }
};

// ---- BF16 tensor-core MMA
// ----------------------------------------------------------------------------------
//
// mma.sync m16n8k16 .bf16 with f32 accumulation, fragments per lane (g = lane / 4, t = lane % 4), each
// register a pair of bf16 (lower k in the low half):
//   A: a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9]
//   B: b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g];  C as for the TF32 MMA.
// As there, the k order is free: lane t of a row uses the 32-bit words of its own 16-byte chunk (word 2s for
// k = 2t, 2t+1 and word 2s+1 for k = 2t+8, 2t+9 of the s-th MMA), and the B side the same words of x.

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two f32 as a bf16 pair (round to nearest even): lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ float bf16_lo(uint32_t w) {
  return __uint_as_float(w << 16);
}
__device__ __forceinline__ float bf16_hi(uint32_t w) {
  return __uint_as_float(w & 0xffff0000u);
}

// (v0, v1) = h + m + l in three bf16 pairs: each residual is exact in f32, so h + m + l equals v to
// ~2^-24 relative (bf16 keeps f32's exponent range).
__device__ __forceinline__ void split_bf16x3(float v0, float v1, uint32_t& h, uint32_t& m, uint32_t& l) {
  h = pack_bf16x2(v0, v1);
  const float r0 = __fsub_rn(v0, bf16_lo(h)), r1 = __fsub_rn(v1, bf16_hi(h));
  m = pack_bf16x2(r0, r1);
  l = pack_bf16x2(__fsub_rn(r0, bf16_lo(m)), __fsub_rn(r1, bf16_hi(m)));
}

// ---- F16 / BF16 tensor-core MMA on 16-bit operands (m16n8k16, f32 accumulation) --------------------------
//
// Fragments as for mma_bf16 above; T is F16 or BF16 (the element type of both operands). Pure register
// operations (not volatile: the compiler may schedule them freely).

// Two f32 as a pair of T (round to nearest even): lo in the low half.
template <GgmlType T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  static_assert(T == GgmlType::F16 || T == GgmlType::BF16);
  uint32_t r;
  if constexpr (T == GgmlType::F16)
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

template <GgmlType T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  static_assert(T == GgmlType::F16 || T == GgmlType::BF16);
  if constexpr (T == GgmlType::F16)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ldmatrix: four 8x8 matrices of 16-bit elements from shared memory (lanes 8i..8i+7 give the row addresses
// of matrix i, 16 bytes each); r[i] of lane l holds row l / 4, elements 2 (l % 4), 2 (l % 4) + 1 of matrix
// i, or with .trans the elements [2 (l % 4)][l / 4] and [2 (l % 4) + 1][l / 4].
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// ---- cp.async (16 bytes per thread, global -> shared, through L2 only) ----------------------------------

// Copies src_bytes (0 or 16) of src to dst (both 16-byte aligned) and zero-fills the rest of the 16 bytes;
// with src_bytes = 0 nothing is read.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// Waits until at most n of this thread's committed groups are pending.
template <int n>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(n) : "memory");
}

// ---- Programmatic dependent launch (Hopper)
// ----------------------------------------------------------------
//
// Kernels launched by launch_ex() may start while the previous kernel of the stream is still running. Each
// such kernel calls pdl_wait() (griddepcontrol.wait: returns once the previous grid has completed and its
// writes are visible) in every block before it reads anything an earlier kernel may have written and before
// it writes anything, and pdl_trigger() as soon as its own blocks are all running, so that the next kernel
// can be scheduled into the SMs this one leaves idle. Both are no-ops for a kernel launched without the
// attribute. Data written by earlier kernels is read after the wait with L2-coherent loads (ld.global.cg or
// the bulk copy engine), never through the non-coherent path.

__device__ __forceinline__ void pdl_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
__device__ __forceinline__ void pdl_trigger() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Programmatic launch levels: kPdlCore for the kernels that have used it from the start (sampler, split-K
// gemv, attention when asked), kPdlAll for the rest (row and elementwise ops, RoPE / KV write, the
// column-split gemv). pdl_enabled(level): set_programmatic_launch() and set_programmatic_launch_level()
// (kernels.h) allow that level; defined in gemv.cu.
constexpr int kPdlCore = 1, kPdlAll = 2;
bool pdl_enabled(int level = kPdlCore);

// Launches kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization when pdl
// (a level, 0 = never) is enabled, and with cluster_x > 1 as clusters of cluster_x blocks along x.
template <class... KArgs, class... Args>
cudaError_t launch_ex(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      int cluster_x, int pdl, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  int na = 0;
  if (pdl > 0 && pdl_enabled(pdl)) {
    attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[na].val.programmaticStreamSerializationAllowed = 1;
    ++na;
  }
  if (cluster_x > 1) {
    attr[na].id = cudaLaunchAttributeClusterDimension;
    attr[na].val.clusterDim.x = (unsigned)cluster_x;
    attr[na].val.clusterDim.y = 1;
    attr[na].val.clusterDim.z = 1;
    ++na;
  }
  cfg.attrs = attr;
  cfg.numAttrs = na;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// ---- Bulk copies into shared memory (cp.async.bulk, completing on an mbarrier)
// ------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async proxy (before the block barrier that publishes them).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// Orders this thread's earlier generic-proxy accesses to shared memory before later async-proxy ones.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// bytes (multiple of 16) from global src to shared dst (both 16-byte aligned), completing on bar.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// Requests bytes (multiple of 16) at global src (16-byte aligned) into L2; no completion to wait for.
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

// ---- Reductions ------------------------------------------------------------------------------------------

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// scratch: 32 elements of shared memory; the function synchronizes the block twice.
template <class T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T r = lane < n_warps ? scratch[lane] : T(0);
  r = warp_sum(r);
  __syncthreads();  // scratch may be reused right after
  return r;
}

}  // namespace ultra::cuda::detail
