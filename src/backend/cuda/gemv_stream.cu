// Weight-streaming gemv for one row of activations: y[rows] = W[rows, cols] . x[cols] (+ bias) (+= y), F16 /
// BF16 weights, f32 arithmetic (each product exact, sums in f32 FMA: ~1e-6 relative, like the CPU kernels).
//
// One block (8 warps) per SM owns a contiguous share of the rows (rows / grid, so every SM reads the same
// number of bytes and there is no tail wave); warp w takes the block's rows w, w + 8, ... Every warp streams
// its rows on its own, with no block barrier after the start: a ring of `slots` buffers of shared memory,
// each one segment of a row (<= 4 KB), filled by the bulk copy engine (cp.async.bulk issued by lane 0,
// completing on the slot's mbarrier); a slot is refilled as soon as the warp's lanes are done with it
// (__syncwarp, then a proxy fence). The first segments are requested before griddepcontrol.wait: weights are
// never written by kernels, so under programmatic dependent launch they stream while the previous kernel
// still runs. After the wait the block copies x into shared memory once; a lane multiplies its 16-byte chunks
// of a segment with x from there (two FMA chains), and a row's 32 lane sums are added by warp shuffles
// (deterministic).
//
// A first version (one ring per block, stages of whole rows, two block barriers per stage) was slower than
// the register-ring kernels of gemv.cu at every budget (docs/CUDA.md): its barriers, not memory, set the
// pace.
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
  uint32_t data_bytes;  // cols * 2: bytes used per row (a multiple of 16)
  uint32_t seg_bytes;   // min(kSegBytes, data_bytes)
  int spr;              // segments per row
  int cols;
  const float* x;     // [cols]
  float* y;           // [rows]
  const float* bias;  // [rows] or null
  bool accumulate;
  int slots, grid;
  uint32_t x_bytes;  // cols * 4 rounded up to 128
};

size_t smem_bytes(const StreamArgs& a) {
  return a.x_bytes + (size_t)kWarps * a.slots * a.seg_bytes + (size_t)kWarps * a.slots * sizeof(uint64_t);
}

template <GgmlType WT>
__global__ void __launch_bounds__(kThreads) gemv_stream_kernel(StreamArgs a) {
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
  for (int i = tid; i < a.cols / 4; i += kThreads)
    reinterpret_cast<float4*>(xs)[i] = __ldcg(reinterpret_cast<const float4*>(a.x) + i);
  __syncthreads();

  float acc0 = 0.0f, acc1 = 0.0f;
  for (int k = 0; k < items; ++k) {
    const int sg = k % a.spr;
    mbar_wait(&bars[k % a.slots], (uint32_t)(k / a.slots) & 1u);
    const uint8_t* seg = my + (size_t)(k % a.slots) * a.seg_bytes;
    const uint32_t off = (uint32_t)sg * a.seg_bytes;
    const int nch = (int)((a.data_bytes - off < a.seg_bytes ? a.data_bytes - off : a.seg_bytes) / 16);
    const float4* xseg = reinterpret_cast<const float4*>(xs + off / 2);
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
        float out = a.bias ? v + a.bias[row] : v;
        if (a.accumulate) out = __ldcg(a.y + row) + out;
        a.y[row] = out;
      }
    }
  }
}

template <GgmlType WT>
cudaError_t launch(const StreamArgs& a, cudaStream_t stream) {
  static const cudaError_t attr = [] {
    int dev = 0, optin = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    return cudaFuncSetAttribute(gemv_stream_kernel<WT>, cudaFuncAttributeMaxDynamicSharedMemorySize, optin);
  }();
  if (attr != cudaSuccess) return attr;
  return launch_ex(gemv_stream_kernel<WT>, dim3((unsigned)a.grid), dim3(kThreads), smem_bytes(a), stream, 1,
                   kPdlAll, a);
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
                        cudaStream_t stream) {
  if ((type != GgmlType::F16 && type != GgmlType::BF16) || rows <= 0 || cols <= 0 || cols % 8 != 0 ||
      cols > kMaxCols || row_bytes % 16 != 0 || row_bytes < cols * 2 || !aligned16(w) || !aligned16(x))
    return cudaErrorNotSupported;
  static const int n_sms = device_int(cudaDevAttrMultiProcessorCount, 132);
  static const int optin = device_int(cudaDevAttrMaxSharedMemoryPerBlockOptin, 48 << 10);
  StreamArgs a{};
  a.w = w, a.rows = rows, a.row_bytes = row_bytes;
  a.data_bytes = (uint32_t)(cols * 2);
  a.seg_bytes = a.data_bytes < kSegBytes ? a.data_bytes : kSegBytes;
  a.spr = (int)((a.data_bytes + a.seg_bytes - 1) / a.seg_bytes);
  a.cols = (int)cols;
  a.x = x, a.y = y, a.bias = bias, a.accumulate = accumulate;
  a.grid = (int)(rows < n_sms ? rows : n_sms);
  a.x_bytes = (uint32_t)((cols * 4 + 127) / 128 * 128);
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
  const cudaError_t e =
      type == GgmlType::F16 ? launch<GgmlType::F16>(a, stream) : launch<GgmlType::BF16>(a, stream);
  return e != cudaSuccess ? e : cudaGetLastError();
}

}  // namespace ultra::cuda::detail
