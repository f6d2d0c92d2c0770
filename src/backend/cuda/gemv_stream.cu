// Weight-streaming gemv for one row of activations: y[rows] = W[rows, cols] . x[cols] (+ bias) (+= y), F16 /
// BF16 weights, and F8_E4M3 with a scale per row (or tensor) applied to the row's sum; f32 arithmetic (each
// product exact, sums in f32 FMA: ~1e-6 relative, like the CPU kernels).
//
// One block (8 warps) per SM owns a contiguous share of the rows (rows / grid, so every SM reads the same
// number of bytes and there is no tail wave); warp w takes the block's rows w, w + 8, ... Every warp streams
// its rows on its own, with no block barrier after the start: a ring of `slots` buffers of shared memory,
// each one segment of a row (<= 4 KB), filled by the bulk copy engine (cp.async.bulk issued by lane 0,
// completing on the slot's mbarrier); a slot is refilled as soon as the warp's lanes are done with it
// (__syncwarp, then a proxy fence). The first segments are requested before griddepcontrol.wait: weights are
// never written by kernels, so under programmatic dependent launch they stream while the previous kernel
// still runs. After the wait the block forms x in shared memory once (copied, or computed by a fused
// prologue: the rmsnorm before a projection, the SwiGLU product before the down projection; every block
// computes it redundantly, from L2, while its first weight segments are in flight); a lane multiplies its
// 16-byte chunks of a segment with x from there (two FMA chains), and a row's 32 lane sums are added by warp
// shuffles (deterministic).
//
// A first version (one ring per block, stages of whole rows, two block barriers per stage) was slower than
// the register-ring kernels of gemv.cu at every budget (docs/CUDA.md): its barriers, not memory, set the
// pace.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemv_stream.h"

namespace ultra::cuda::detail {

namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr uint32_t kSegBytes = 4096;        // bytes of a row per slot
constexpr int kSegChunks = kSegBytes / 16;  // 16-byte chunks per segment: 8 per lane
constexpr int kMaxSlots = 8;                // per warp
constexpr int kMaxCols = 16384;             // x in shared memory: 64 KB
constexpr int kDefaultBudget = 192 << 10;

struct StreamArgs {
  const uint8_t* w;  // [rows] rows of row_bytes bytes
  int64_t rows, row_bytes;
  uint32_t data_bytes;  // cols * element size: bytes used per row (a multiple of 16)
  uint32_t seg_bytes;   // min(kSegBytes, data_bytes)
  int spr;              // segments per row
  int cols;
  const float* x;     // [cols]
  float* y;           // [rows]
  const float* bias;  // [rows] or null
  bool accumulate;
  int slots, grid;
  uint32_t x_bytes;  // cols * 4 rounded up to 128
  StreamInput in;
  const float* scale;  // F8_E4M3: [rows * scale_row_stride] (stride 0: [1])
  int64_t scale_row_stride;
  int norm_threads, norm_v;  // rmsnorm: the block size and float4s per thread of cuda::rmsnorm for cols
};

constexpr int kXPer = kMaxCols / 4 / kThreads;  // float4 of x per thread at most: 16

// Two E4M3 codes (low byte: element 0) -> f32: the hardware conversion to an f16 pair (exact: every E4M3
// value is an f16), then f16 -> f32 (exact).
__device__ __forceinline__ float2 e4m3x2_to_float2(uint16_t v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)v, __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// x[cols] into shared memory, as a.in says. Every load a thread makes is issued before any is used (the
// loops are unrolled over kXPer, predicated): with the block's weight copies in flight an L2 round trip is
// slow, and the prologue costs about one of them instead of one per loop trip. The rmsnorm reduction
// replays cuda::rmsnorm's (rmsnorm_vec_kernel with norm_threads threads of norm_v float4 each, then
// block_sum) with the 8 warps standing for its norm_threads / 32 (warp w for w, w + 8, w + 16, w + 24),
// so that the fused result is bit-identical to rmsnorm followed by the gemv.
template <int kKind>
__device__ __forceinline__ void form_x(const StreamArgs& a, float* xs, float* red, int tid, int lane,
                                       int warp) {
  const int d4 = a.cols >> 2;
  float4* xs4 = reinterpret_cast<float4*>(xs);
  const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if constexpr (kKind == StreamInput::silu_mul) {
    const float4* g4 = reinterpret_cast<const float4*>(a.x);
    const float4* u4 = reinterpret_cast<const float4*>(a.in.w);
    float4 g[kXPer], u[kXPer];
#pragma unroll
    for (int j = 0; j < kXPer; ++j) {
      const int i = tid + j * kThreads;
      g[j] = i < d4 ? __ldcg(g4 + i) : zero4;
      u[j] = i < d4 ? __ldcg(u4 + i) : zero4;
    }
#pragma unroll
    for (int j = 0; j < kXPer; ++j) {
      const int i = tid + j * kThreads;
      if (i < d4)
        xs4[i] = make_float4(silu_f(g[j].x) * u[j].x, silu_f(g[j].y) * u[j].y, silu_f(g[j].z) * u[j].z,
                             silu_f(g[j].w) * u[j].w);
    }
    __syncthreads();
    return;
  }
  const float* src = a.x;
  bool zero = false;
  if (a.in.row) {
    const int32_t r = __ldcg(a.in.row);
    zero = r < 0;
    src += zero ? 0 : (int64_t)r * a.cols;
  }
  const float4* x4 = reinterpret_cast<const float4*>(src);
  if constexpr (kKind == StreamInput::plain) {
    float4 v[kXPer];
#pragma unroll
    for (int j = 0; j < kXPer; ++j) {
      const int i = tid + j * kThreads;
      v[j] = i < d4 ? __ldcg(x4 + i) : zero4;
    }
#pragma unroll
    for (int j = 0; j < kXPer; ++j) {
      const int i = tid + j * kThreads;
      if (i < d4) xs4[i] = v[j];
    }
    __syncthreads();
    return;
  }
  // rmsnorm. Item j of this thread: virtual warp warp + 8 (j / 4), its float4 k = j % 4 (none past norm_v).
  const int vwarps = a.norm_threads >> 5;
  const float4* w4 = reinterpret_cast<const float4*>(a.in.w);
  auto index = [&](int j) {
    const int vw = warp + kWarps * (j >> 2), k = j & 3;
    const int i = vw * 32 + lane + k * a.norm_threads;
    return vw < vwarps && k < a.norm_v && i < d4 ? i : -1;
  };
  float4 v[kXPer], w[kXPer];
#pragma unroll
  for (int j = 0; j < kXPer; ++j) {
    const int i = index(j);
    v[j] = i >= 0 && !zero ? __ldcg(x4 + i) : zero4;
    w[j] = i >= 0 ? __ldg(w4 + i) : zero4;
  }
#pragma unroll
  for (int q = 0; q < kXPer / 4; ++q) {
    float ss = 0.0f;  // the virtual thread's sum; its terms past norm_v are +0 and change no bit
#pragma unroll
    for (int k = 0; k < 4; ++k) ss = __fadd_rn(ss, sumsq4(v[4 * q + k]));
    ss = warp_sum(ss);
    const int vw = warp + kWarps * q;
    if (lane == 0 && vw < vwarps) red[vw] = ss;
  }
  __syncthreads();
  const float ss = warp_sum(lane < vwarps ? red[lane] : 0.0f);
  const float scale = rms_scale(ss, a.cols, a.in.eps);
#pragma unroll
  for (int j = 0; j < kXPer; ++j) {
    const int i = index(j);
    if (i >= 0)
      xs4[i] = make_float4(v[j].x * scale * w[j].x, v[j].y * scale * w[j].y, v[j].z * scale * w[j].z,
                           v[j].w * scale * w[j].w);
  }
  __syncthreads();
}

// x, the slots, their mbarriers, the rmsnorm prologue's 32 partial sums (dynamic shared memory only: the
// kernel asks for the device's whole opt-in size, which leaves no room for static shared memory).
__host__ __device__ inline size_t smem_bytes(const StreamArgs& a) {
  return a.x_bytes + (size_t)kWarps * a.slots * a.seg_bytes + (size_t)kWarps * a.slots * sizeof(uint64_t) +
         32 * sizeof(float);
}

// kKind: a.in.kind (one instance per prologue, so the plain kernel keeps the registers of the plain load).
template <GgmlType WT, int kKind>
__global__ void __launch_bounds__(kThreads) gemv_stream_kernel(StreamArgs a) {
  constexpr uint32_t kElemBytes = WT == GgmlType::F8_E4M3 ? 1 : 2;
  extern __shared__ __align__(128) uint8_t sm[];
  float* xs = reinterpret_cast<float*>(sm);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  uint8_t* my = sm + a.x_bytes + (size_t)warp * a.slots * a.seg_bytes;
  uint64_t* bars =
      reinterpret_cast<uint64_t*>(sm + a.x_bytes + (size_t)kWarps * a.slots * a.seg_bytes) + warp * a.slots;
  const int64_t r0 = (int64_t)blockIdx.x * a.rows / a.grid;
  const int n_rows = (int)((int64_t)(blockIdx.x + 1) * a.rows / a.grid - r0);
  const int nw = n_rows > warp ? (n_rows - warp + kWarps - 1) / kWarps : 0;  // this warp's rows
  const int items = nw * a.spr;                                              // its (row, segment) items

  auto issue = [&](int k) {  // lane 0: item k into slot k % slots
    const int i = k / a.spr, sg = k % a.spr;
    const int64_t row = r0 + warp + (int64_t)i * kWarps;
    const uint32_t off = (uint32_t)sg * a.seg_bytes;
    const uint32_t bytes = a.data_bytes - off < a.seg_bytes ? a.data_bytes - off : a.seg_bytes;
    uint64_t* bar = &bars[k % a.slots];
    mbar_expect_tx(bar, bytes);
    bulk_copy_g2s(my + (size_t)(k % a.slots) * a.seg_bytes, a.w + row * a.row_bytes + off, bytes, bar);
  };
  if (lane == 0) {
    for (int d = 0; d < a.slots; ++d) mbar_init(&bars[d], 1);
    mbar_init_fence();
    for (int k = 0; k < a.slots && k < items; ++k) issue(k);
  }
  pdl_trigger();
  pdl_wait();
  form_x<kKind>(a, xs, reinterpret_cast<float*>(sm + smem_bytes(a) - 32 * sizeof(float)), tid, lane, warp);

  float acc0 = 0.0f, acc1 = 0.0f;
  for (int k = 0; k < items; ++k) {
    const int sg = k % a.spr;
    mbar_wait(&bars[k % a.slots], (uint32_t)(k / a.slots) & 1u);
    const uint8_t* seg = my + (size_t)(k % a.slots) * a.seg_bytes;
    const uint32_t off = (uint32_t)sg * a.seg_bytes;
    const int nch = (int)((a.data_bytes - off < a.seg_bytes ? a.data_bytes - off : a.seg_bytes) / 16);
    const float4* xseg = reinterpret_cast<const float4*>(xs + off / kElemBytes);
    if constexpr (WT == GgmlType::F8_E4M3) {
      // A 4-byte word (4 codes) per lane and step, its x one float4: consecutive lanes read consecutive
      // words and float4s (no bank conflicts). Two codes at a time to an f16 pair (exact), then f32.
      const int nw = nch * 4;
#pragma unroll 8
      for (int i = 0; i < kSegChunks * 4 / 32; ++i) {
        const int c = lane + 32 * i;
        if (c < nw) {
          const uint32_t wd = reinterpret_cast<const uint32_t*>(seg)[c];
          const float4 xq = xseg[c];
          const float2 lo = e4m3x2_to_float2((uint16_t)(wd & 0xffffu));
          const float2 hi = e4m3x2_to_float2((uint16_t)(wd >> 16));
          acc0 = fmaf(lo.x, xq.x, acc0);
          acc1 = fmaf(lo.y, xq.y, acc1);
          acc0 = fmaf(hi.x, xq.z, acc0);
          acc1 = fmaf(hi.y, xq.w, acc1);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kSegChunks / 32; ++i) {
        const int c = lane + 32 * i;
        if (c < nch) {
          Chunk8<WT> wv;
          wv.load_shared(seg + (size_t)c * 16);
          const float4 x0 = xseg[2 * c], x1 = xseg[2 * c + 1];
          acc0 = fmaf(wv.elem(0), x0.x, acc0);
          acc1 = fmaf(wv.elem(1), x0.y, acc1);
          acc0 = fmaf(wv.elem(2), x0.z, acc0);
          acc1 = fmaf(wv.elem(3), x0.w, acc1);
          acc0 = fmaf(wv.elem(4), x1.x, acc0);
          acc1 = fmaf(wv.elem(5), x1.y, acc1);
          acc0 = fmaf(wv.elem(6), x1.z, acc0);
          acc1 = fmaf(wv.elem(7), x1.w, acc1);
        }
      }
    }
    __syncwarp();  // every lane is done with the slot
    if (lane == 0 && k + a.slots < items) {
      fence_proxy_async();
      issue(k + a.slots);
    }
    if (sg == a.spr - 1) {  // the row is complete
      const float v = warp_sum(acc0 + acc1);
      acc0 = acc1 = 0.0f;
      if (lane == 0) {
        const int64_t row = r0 + warp + (int64_t)(k / a.spr) * kWarps;
        float out = v;
        if constexpr (WT == GgmlType::F8_E4M3) out = v * __ldg(a.scale + row * a.scale_row_stride);
        out = a.bias ? out + a.bias[row] : out;
        if (a.accumulate) out = __ldcg(a.y + row) + out;
        a.y[row] = out;
      }
    }
  }
}

template <GgmlType WT, int kKind>
cudaError_t launch_kind(const StreamArgs& a, cudaStream_t stream) {
  static const cudaError_t attr = [] {
    int dev = 0, optin = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    return cudaFuncSetAttribute(gemv_stream_kernel<WT, kKind>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                optin);
  }();
  if (attr != cudaSuccess) return attr;
  return launch_ex(gemv_stream_kernel<WT, kKind>, dim3((unsigned)a.grid), dim3(kThreads), smem_bytes(a),
                   stream, 1, kPdlAll, a);
}

template <GgmlType WT>
cudaError_t launch(const StreamArgs& a, cudaStream_t stream) {
  switch (a.in.kind) {
    case StreamInput::rmsnorm:
      return launch_kind<WT, StreamInput::rmsnorm>(a, stream);
    case StreamInput::silu_mul:
      return launch_kind<WT, StreamInput::silu_mul>(a, stream);
    default:
      return launch_kind<WT, StreamInput::plain>(a, stream);
  }
}

int device_int(cudaDeviceAttr attr, int fallback) {
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess || v <= 0)
    return fallback;
  return v;
}

}  // namespace

cudaError_t gemv_stream(GgmlType type, const uint8_t* w, int64_t rows, int64_t cols, int64_t row_bytes,
                        const float* x, float* y, const float* bias, bool accumulate, int smem_budget,
                        cudaStream_t stream, const StreamInput& in, const float* scale,
                        int64_t scale_row_stride) {
  const bool fp8 = type == GgmlType::F8_E4M3;
  const int64_t esize = fp8 ? 1 : 2;
  if ((type != GgmlType::F16 && type != GgmlType::BF16 && !fp8) || rows <= 0 || cols <= 0 ||
      cols % (16 / esize) != 0 || cols > kMaxCols || row_bytes % 16 != 0 || row_bytes < cols * esize ||
      !aligned16(w) || !aligned16(x) || (in.kind != StreamInput::plain && !aligned16(in.w)) ||
      (fp8 && (!scale || scale_row_stride < 0)))
    return cudaErrorNotSupported;
  static const int n_sms = device_int(cudaDevAttrMultiProcessorCount, 132);
  static const int optin = device_int(cudaDevAttrMaxSharedMemoryPerBlockOptin, 48 << 10);
  StreamArgs a{};
  a.w = w, a.rows = rows, a.row_bytes = row_bytes;
  a.data_bytes = (uint32_t)(cols * esize);
  a.seg_bytes = a.data_bytes < kSegBytes ? a.data_bytes : kSegBytes;
  a.spr = (int)((a.data_bytes + a.seg_bytes - 1) / a.seg_bytes);
  a.cols = (int)cols;
  a.x = x, a.y = y, a.bias = bias, a.accumulate = accumulate;
  a.grid = (int)(rows < n_sms ? rows : n_sms);
  a.x_bytes = (uint32_t)((cols * 4 + 127) / 128 * 128);
  a.in = in;
  a.scale = scale;
  a.scale_row_stride = scale_row_stride;
  const int d4 = (int)(cols / 4);
  a.norm_v = (d4 + 1023) / 1024;                                     // as cuda::rmsnorm (cols <= 16384: <= 4)
  a.norm_threads = ((d4 + a.norm_v - 1) / a.norm_v + 31) / 32 * 32;  // <= 1024
  size_t budget = smem_budget > 0 ? (size_t)smem_budget : (size_t)kDefaultBudget;
  if (budget > (size_t)optin) budget = (size_t)optin;
  // As many slots per warp as the budget holds after x (1..kMaxSlots), no more than the busiest warp has
  // items.
  const size_t per_slot = (size_t)kWarps * (a.seg_bytes + sizeof(uint64_t));
  int slots = budget > a.x_bytes ? (int)((budget - a.x_bytes) / per_slot) : 0;
  if (slots > kMaxSlots) slots = kMaxSlots;
  const int64_t per_block = (rows + a.grid - 1) / a.grid;
  const int64_t max_items = (per_block + kWarps - 1) / kWarps * a.spr;
  if (slots > max_items) slots = (int)max_items;
  if (slots < 1) slots = 1;
  a.slots = slots;
  if (smem_bytes(a) > (size_t)optin) return cudaErrorNotSupported;
  const cudaError_t e = type == GgmlType::F16 ? launch<GgmlType::F16>(a, stream)
                        : fp8                 ? launch<GgmlType::F8_E4M3>(a, stream)
                                              : launch<GgmlType::BF16>(a, stream);
  return e != cudaSuccess ? e : cudaGetLastError();
}

}  // namespace ultra::cuda::detail
