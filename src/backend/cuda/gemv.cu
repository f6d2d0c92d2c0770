// Decode / small-batch matmul (n <= 32 rows of activations): y[n, rows] = x[n, cols] . W^T (+ bias) (+= y).
//
// One row of F16 / BF16 weights goes to the weight-streaming kernel (gemv_stream.cu) unless the tuning says
// otherwise; for the rest, two tensor-core kernels; dispatch() picks one from the shape (measured on the
// H200, docs/CUDA.md):
//  * column-split (gemv_tc_kernel, the default): a block owns 16 or 32 rows, its 8 warps split the
//    columns, x is read through L1, ordinary launch. TF32 hi/lo MMAs (see its comment below).
//  * split-K (gemv2_kernel): BF16 weights with >= 8192 rows and n <= 4, or >= 65536 rows and 9 <= n <= 16;
//    it uses programmatic dependent launch and is selectable for every shape through tuning.h.
//
// Split-K kernel. A block of W warps owns Rb = 16 * MT * W weight rows (each warp its own MT 16-row
// m-tiles) and one column slice; the ks blocks of a cluster (split-K, ks = 1, 2, 4 or 8, chosen so that
// the grid fills the SMs about once) split the columns, and their partial sums are added in fixed order
// through distributed shared memory, so results are deterministic. The block stages its slice of x in
// shared memory once (in sub-slices when it does not fit), already split into the parts the MMA consumes,
// and every warp reads it from there: x costs one L2 read per block instead of one per 16 rows.
// Per 32-column step, lane (g, t4) loads 16 bytes (8 elements) of rows g and g + 8 of each m-tile with
// streaming loads; a ring of D steps is kept in flight in registers (the next D steps' loads are issued
// as each step is consumed), and the first D steps are issued before the kernel waits for the previous
// kernel of the stream (programmatic dependent launch), so weight streaming overlaps the previous kernel's
// tail; optionally the next pf_steps steps are requested into L2 before the wait as well (one bulk prefetch
// per row; measured slower on the benchmark shapes, off where the kernel is chosen automatically). The MMA
// accumulators are added into f32 sums every D steps: long tensor-core accumulation chains lose accuracy
// (measured 1.8e-5 relative over 4096 columns in one chain, ~2e-6 with chains of 512). MMA flavours, both
// f32-accurate:
//   tf32    mma m16n8k8 TF32: F16 / BF16 weights exact in TF32, x = hi + lo (two products); F32 weights
//           split as well (three products).
//   bf16x3  BF16 weights only: mma m16n8k16 BF16 with the weight words used as they are, x = h + m + l in
//           three BF16 parts (three products of twice the k per instruction: fewer tensor-core cycles and
//           no conversion of the weights).
// Needs cols % 8 == 0 and 16-byte aligned rows and x, else the SIMT fallback (a warp per row).
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemv_stream.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/tuning.h"

namespace ultra::cuda {

namespace detail {
namespace {
std::atomic<bool> g_pdl{true};
std::atomic<int> g_pdl_level{kPdlAll};
}  // namespace
bool pdl_enabled(int level) {
  return g_pdl.load(std::memory_order_relaxed) && level <= g_pdl_level.load(std::memory_order_relaxed);
}
}  // namespace detail

void set_programmatic_launch(bool enabled) {
  detail::g_pdl.store(enabled, std::memory_order_relaxed);
}
void set_programmatic_launch_level(int level) {
  detail::g_pdl_level.store(level < 1 ? 1 : level > 2 ? 2 : level, std::memory_order_relaxed);
}
int programmatic_launch_level() {
  return detail::g_pdl_level.load(std::memory_order_relaxed);
}
bool programmatic_launch() {
  return detail::pdl_enabled();
}

using namespace detail;

namespace {

namespace cg = cooperative_groups;

tuning::GemvTuning g_tune;
bool g_gemv_l2_all = false;  // tuning::set_gemv_l2_all
bool g_gemv_l1_all = false;  // tuning::set_gemv_l1_all

// ---- host helpers: SM count and occupancy, cached

int sm_count() {
  static int cached[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 132;
  if (!cached[dev]) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) n = 132;
    cached[dev] = n;
  }
  return cached[dev];
}

int smem_optin() {
  static int cached[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 48 << 10;
  if (!cached[dev]) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess || n <= 0)
      n = 48 << 10;
    cached[dev] = n;
  }
  return cached[dev];
}

int occupancy(const void* fn, int threads, size_t smem) {
  struct E {
    const void* fn;
    int threads;
    size_t smem;
    int blocks;
  };
  static std::mutex mu;
  static std::vector<E> cache;
  std::lock_guard<std::mutex> lock(mu);
  for (const E& e : cache)
    if (e.fn == fn && e.threads == threads && e.smem == smem) return e.blocks;
  int b = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, fn, threads, smem) != cudaSuccess || b < 1) {
    cudaGetLastError();
    b = 1;
  }
  cache.push_back({fn, threads, smem, b});
  return b;
}

// ---- the tensor-core kernel

enum class Mma { tf32, bf16x3 };

struct Gemv2Args {
  const uint8_t* w;  // [rows, row_bytes]
  int64_t rows, cols, row_bytes;
  const float* x;  // [n, cols]
  int n;
  float* y;           // [n, rows]
  const float* bias;  // [rows] or null
  bool accumulate;
  int n_steps;        // ceil(cols / 32): 32-column steps
  int slice_steps;    // steps per split (a multiple of the ring depth)
  int sub_steps;      // steps per staged sub-slice of x (a multiple of the ring depth)
  int red_offset;     // bytes: the cross-split reduction buffer [n][Rb] f32 after the staged x
  int pf_steps;       // steps kept requested into L2 ahead of the register ring (bulk prefetch)
  bool late_trigger;  // pdl_trigger after the main loop instead of at the start
};

// Staged x: [kParts][n][stride] of P, stride = sub_steps * 32 + kPad. The padding makes the rows of two
// neighbouring tokens start in different bank quarters, so the 16-byte reads of a quarter warp (tokens g, g+1
// times 4 lanes) never conflict.
template <Mma M>
struct XStage;
template <>
struct XStage<Mma::tf32> {
  using P = uint32_t;  // TF32 bit patterns: hi, lo
  static constexpr int kParts = 2, kPad = 4;
};
template <>
struct XStage<Mma::bf16x3> {
  using P = uint16_t;  // BF16: h, m, l
  static constexpr int kParts = 3, kPad = 32;
};

// Four x values of token tok at local columns 4 c4.. into the staged parts.
template <Mma M>
__device__ __forceinline__ void gemv_store_x(const Gemv2Args& a, typename XStage<M>::P* xs, int stride,
                                             int tok, int c4, float4 v) {
  if constexpr (M == Mma::tf32) {
    uint4 hi, lo;
    split_tf32(v.x, hi.x, lo.x);
    split_tf32(v.y, hi.y, lo.y);
    split_tf32(v.z, hi.z, lo.z);
    split_tf32(v.w, hi.w, lo.w);
    *reinterpret_cast<uint4*>(xs + (size_t)tok * stride + 4 * c4) = hi;
    *reinterpret_cast<uint4*>(xs + (size_t)(a.n + tok) * stride + 4 * c4) = lo;
  } else {
    uint32_t h0, m0, l0, h1, m1, l1;
    split_bf16x3(v.x, v.y, h0, m0, l0);
    split_bf16x3(v.z, v.w, h1, m1, l1);
    *reinterpret_cast<uint2*>(xs + (size_t)tok * stride + 4 * c4) = make_uint2(h0, h1);
    *reinterpret_cast<uint2*>(xs + (size_t)(a.n + tok) * stride + 4 * c4) = make_uint2(m0, m1);
    *reinterpret_cast<uint2*>(xs + (size_t)(2 * a.n + tok) * stride + 4 * c4) = make_uint2(l0, l1);
  }
}

// Loads are issued in batches of 4 per thread before any is used: one L2 round trip per batch.
template <Mma M>
__device__ __forceinline__ void gemv_stage_x(const Gemv2Args& a, typename XStage<M>::P* xs, int stride,
                                             int64_t col0, int ncols) {
  constexpr int kBatch = 4;
  const int n4 = ncols >> 2;
  const int total = a.n * n4;
  for (int i0 = threadIdx.x; i0 < total; i0 += kBatch * blockDim.x) {
    float4 vb[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = i0 + b * blockDim.x;
      const int tok = i / n4, c4 = i - tok * n4;
      const int64_t col = col0 + 4 * c4;
      vb[b] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (i < total && col < a.cols)
        vb[b] = __ldcg(reinterpret_cast<const float4*>(a.x + (int64_t)tok * a.cols + col));
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = i0 + b * blockDim.x;
      if (i >= total) break;
      const int tok = i / n4, c4 = i - tok * n4;
      const float4 v = vb[b];
      gemv_store_x<M>(a, xs, stride, tok, c4, v);
    }
  }
}

template <GgmlType WT>
constexpr int kEB = WT == GgmlType::F32 ? 4 : 2;

// Loads step st (zero past the slice end st1, past cols, or for rows past the end).
template <GgmlType WT, int MT>
__device__ __forceinline__ void gemv_load(Chunk8<WT> (&b)[MT][2], const uint8_t* const (&wrow)[MT][2],
                                          const bool (&rok)[MT][2], int st, int st1, int64_t cols, int t4) {
  const bool ok = st < st1 && (int64_t)st * 32 + t4 * 8 < cols;
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (ok && rok[m][h])
        b[m][h].load(wrow[m][h] + (int64_t)st * 32 * kEB<WT>);
      else
        b[m][h].zero();
    }
}

// One 32-column step: the lane's chunks of rows g and g + 8 of each m-tile against x of tokens 8j + g at
// the same 8 columns (local column xcol of the staged slice).
template <GgmlType WT, Mma M, int NT, int MT>
__device__ __forceinline__ void gemv_consume(float (&acc)[MT][NT][4], const Chunk8<WT> (&w)[MT][2],
                                             const typename XStage<M>::P* xs, int stride, int n, int xcol,
                                             int g) {
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    if (8 * j >= n) break;  // warp-uniform
    const int tok = 8 * j + g;
    const bool ok = tok < n;
    if constexpr (M == Mma::tf32) {
      uint4 h0 = make_uint4(0, 0, 0, 0), h1 = h0, l0 = h0, l1 = h0;
      if (ok) {
        const uint32_t* ph = xs + (size_t)tok * stride + xcol;
        const uint32_t* pl = xs + (size_t)(n + tok) * stride + xcol;
        h0 = *reinterpret_cast<const uint4*>(ph);
        h1 = *reinterpret_cast<const uint4*>(ph + 4);
        l0 = *reinterpret_cast<const uint4*>(pl);
        l1 = *reinterpret_cast<const uint4*>(pl + 4);
      }
      const uint32_t xh[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
      const uint32_t xl[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
#pragma unroll
      for (int s = 0; s < 4; ++s) {
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          const float2 r0 = w[m][0].pair(s);  // row g: elements 2s, 2s + 1
          const float2 r1 = w[m][1].pair(s);  // row g + 8
          if constexpr (WT == GgmlType::F32) {
            uint32_t a0, a1, a2, a3, e0, e1, e2, e3;
            split_tf32(r0.x, a0, e0);
            split_tf32(r1.x, a1, e1);
            split_tf32(r0.y, a2, e2);
            split_tf32(r1.y, a3, e3);
            mma_tf32(acc[m][j], a0, a1, a2, a3, xh[2 * s], xh[2 * s + 1]);
            mma_tf32(acc[m][j], a0, a1, a2, a3, xl[2 * s], xl[2 * s + 1]);
            mma_tf32(acc[m][j], e0, e1, e2, e3, xh[2 * s], xh[2 * s + 1]);
          } else {
            const uint32_t a0 = __float_as_uint(r0.x), a1 = __float_as_uint(r1.x);
            const uint32_t a2 = __float_as_uint(r0.y), a3 = __float_as_uint(r1.y);
            mma_tf32(acc[m][j], a0, a1, a2, a3, xh[2 * s], xh[2 * s + 1]);
            mma_tf32(acc[m][j], a0, a1, a2, a3, xl[2 * s], xl[2 * s + 1]);
          }
        }
      }
    } else {
      static_assert(WT == GgmlType::BF16, "bf16x3 takes BF16 weights");
      uint4 p[3];
#pragma unroll
      for (int q = 0; q < 3; ++q)
        p[q] = ok ? *reinterpret_cast<const uint4*>(xs + (size_t)(q * n + tok) * stride + xcol)
                  : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int s2 = 0; s2 < 2; ++s2) {
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          const uint32_t a0 = w[m][0].w[2 * s2], a1 = w[m][1].w[2 * s2];
          const uint32_t a2 = w[m][0].w[2 * s2 + 1], a3 = w[m][1].w[2 * s2 + 1];
#pragma unroll
          for (int q = 0; q < 3; ++q)
            mma_bf16(acc[m][j], a0, a1, a2, a3, s2 == 0 ? p[q].x : p[q].z, s2 == 0 ? p[q].y : p[q].w);
        }
      }
    }
  }
}

__device__ __forceinline__ void gemv2_store(const Gemv2Args& a, int tok, int64_t row, float s) {
  if (a.bias) s += __ldcg(a.bias + row);
  float* yp = a.y + (int64_t)tok * a.rows + row;
  *yp = a.accumulate ? __ldcg(yp) + s : s;
}

// Blocks per SM the register allocation must allow: 3 x 8 warps for BF16x3 with one n-tile and a ring of 4
// (at most 85 registers, no spills), else 2 (8 warps: 128 registers; 4 warps: 255).
template <Mma M, int NT, int W, int D>
constexpr int kMinBlocks = (M == Mma::bf16x3 && W == 8 && NT == 1 && D <= 4) ? 3 : 2;

template <GgmlType WT, Mma M, int NT, int MT, int W, int D>
__global__ void __launch_bounds__(W * 32, (kMinBlocks<M, NT, W, D>)) gemv2_kernel(Gemv2Args a) {
  using C8 = Chunk8<WT>;
  using XS = XStage<M>;
  using P = typename XS::P;
  constexpr int kRb = 16 * MT * W;
  extern __shared__ __align__(16) uint8_t gemv_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int split = blockIdx.x;
  const int64_t row_base = (int64_t)blockIdx.y * kRb;
  const int st0 = split * a.slice_steps;
  const int st1 = min(st0 + a.slice_steps, a.n_steps);

  const uint8_t* wrow[MT][2];
  bool rok[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = row_base + warp * 16 * MT + m * 16 + h * 8 + g;
      rok[m][h] = r < a.rows;
      wrow[m][h] = a.w + (rok[m][h] ? r : 0) * a.row_bytes + t4 * 8 * kEB<WT>;
    }

  // The weights are never written by the kernels before this one: the ring's first D steps, and a request of
  // the next pf_steps steps into L2 (lane l < 16 MT: row l of the warp, one bulk prefetch), go out before
  // the wait, so that with programmatic launch they stream while the previous kernel finishes.
  C8 buf[D][MT][2];
#pragma unroll
  for (int d = 0; d < D; ++d) gemv_load<WT, MT>(buf[d], wrow, rok, st0 + d, st1, a.cols, t4);
  if (a.pf_steps > 0 && lane < 16 * MT) {
    const int64_t prow = row_base + warp * 16 * MT + lane;
    const int64_t c0 = (int64_t)(st0 + D) * 32;
    int64_t c1 = (int64_t)min(st0 + D + a.pf_steps, st1) * 32;
    c1 = c1 < a.cols ? c1 : a.cols;
    if (prow < a.rows && c1 > c0)
      prefetch_l2(a.w + prow * a.row_bytes + c0 * kEB<WT>, (uint32_t)((c1 - c0) * kEB<WT>));
  }
  if (!a.late_trigger) pdl_trigger();
  pdl_wait();

  // acc: f32 sums (FADD, round to nearest); part: the MMA accumulators of the current ring cycle (D steps),
  // added into acc after each cycle, so no tensor-core accumulation chain is longer than D steps.
  float acc[MT][NT][4], part[MT][NT][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[m][j][r] = 0.0f, part[m][j][r] = 0.0f;

  P* xs = reinterpret_cast<P*>(gemv_smem);
  const int stride = a.sub_steps * 32 + XS::kPad;
  for (int sub0 = st0; sub0 < st1; sub0 += a.sub_steps) {
    const int sub1 = min(sub0 + a.sub_steps, st1);
    if (sub0 != st0) __syncthreads();  // every warp is done with the previous sub-slice
    gemv_stage_x<M>(a, xs, stride, (int64_t)sub0 * 32, (sub1 - sub0) * 32);
    __syncthreads();
    for (int st = sub0; st < sub1; st += D) {
#pragma unroll
      for (int d = 0; d < D; ++d) {  // buf[d] holds step st + d
        if (st + d < sub1)
          gemv_consume<WT, M, NT, MT>(part, buf[d], xs, stride, a.n, (st + d - sub0) * 32 + t4 * 8, g);
        gemv_load<WT, MT>(buf[d], wrow, rok, st + d + D, st1, a.cols, t4);
      }
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) acc[m][j][r] += part[m][j][r], part[m][j][r] = 0.0f;
    }
  }
  if (a.late_trigger) pdl_trigger();  // every load of this block is issued

  // C fragment: acc[m][j][r] is row 16m + g + 8 (r / 2) of the warp's rows, token 8j + 2 t4 + r % 2.
  if (gridDim.x == 1) {
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int tok = 8 * j + 2 * t4 + (r & 1);
          const int64_t row = row_base + warp * 16 * MT + m * 16 + g + 8 * (r >> 1);
          if (tok < a.n && row < a.rows) gemv2_store(a, tok, row, acc[m][j][r]);
        }
    return;
  }
  // Split-K: partial sums [n][Rb] in each block's shared memory, added in rank order across the cluster.
  float* red = reinterpret_cast<float*>(gemv_smem + a.red_offset);
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int tok = 8 * j + 2 * t4 + (r & 1);
        if (tok < a.n) red[tok * kRb + warp * 16 * MT + m * 16 + g + 8 * (r >> 1)] = acc[m][j][r];
      }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int ks = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
  const int total = a.n * kRb, per = (total + ks - 1) / ks;
  const int i1 = min(total, (rank + 1) * per);
  for (int i = rank * per + (int)threadIdx.x; i < i1; i += blockDim.x) {
    const int tok = i / kRb, rl = i - tok * kRb;
    float v[8];  // all remote reads in flight before the sum
#pragma unroll
    for (int q = 0; q < 8; ++q) v[q] = q < ks ? cluster.map_shared_rank(red, q)[i] : 0.0f;
    float s = 0.0f;
#pragma unroll
    for (int q = 0; q < 8; ++q)
      if (q < ks) s += v[q];
    const int64_t row = row_base + rl;
    if (row < a.rows) gemv2_store(a, tok, row, s);
  }
  cluster.sync();  // no block leaves while another still reads its shared memory
}

constexpr size_t kDefaultXBudget = 96 << 10;
constexpr int64_t kPfBytes = 24 << 20;  // weights requested into L2 ahead of the ring, over resident blocks

template <GgmlType WT, Mma M, int NT, int MT, int W, int D>
cudaError_t launch_gemv2(Gemv2Args a, const tuning::GemvTuning& tu, cudaStream_t stream) {
  using XS = XStage<M>;
  constexpr int kRb = 16 * MT * W;
  auto kern = gemv2_kernel<WT, M, NT, MT, W, D>;
  static const int max_smem = [&] {
    const int m = smem_optin();
    return cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, m) == cudaSuccess
               ? m
               : 48 << 10;
  }();
  const int64_t row_groups = (a.rows + kRb - 1) / kRb;
  if (row_groups > 65535) return cudaErrorInvalidValue;
  a.n_steps = (int)((a.cols + 31) / 32);
  const size_t budget = tu.smem_budget > 0 ? (size_t)tu.smem_budget : kDefaultXBudget;
  const size_t red_bytes = (size_t)kRb * a.n * sizeof(float);
  const size_t per_col = (size_t)XS::kParts * a.n * sizeof(typename XS::P);
  int ks = tu.splits;
  if (ks <= 0) {  // the most splits (<= 8) that keep the grid within one wave of resident blocks
    const size_t x_all = per_col * ((size_t)a.n_steps * 32 + XS::kPad);
    const size_t smem_est = (x_all < budget ? x_all : budget) + red_bytes;
    const int64_t slots = (int64_t)sm_count() * occupancy((const void*)kern, W * 32, smem_est);
    ks = 1;
    while (ks < 8 && row_groups * ks * 2 <= slots && a.n_steps >= 2 * ks * D) ks *= 2;
  }
  const int per_split = (a.n_steps + ks - 1) / ks;
  a.slice_steps = (per_split + D - 1) / D * D;
  int sub = (int)((budget / per_col - XS::kPad) / 32) / D * D;
  if (sub < D) sub = D;
  a.sub_steps = sub < a.slice_steps ? sub : a.slice_steps;
  const size_t x_bytes = (per_col * ((size_t)a.sub_steps * 32 + XS::kPad) + 15) / 16 * 16;
  a.red_offset = (int)x_bytes;
  const int64_t n_blocks = (int64_t)ks * row_groups;
  if (tu.pf_steps >= 0) {
    a.pf_steps = tu.pf_steps;
  } else {  // the rest of the slice, within kPfBytes over the blocks resident at a time
    const int64_t resident = std::min<int64_t>(
        n_blocks,
        (int64_t)sm_count() * occupancy((const void*)kern, W * 32, x_bytes + (ks > 1 ? red_bytes : 0)));
    const int64_t per_step = (int64_t)kRb * 32 * kEB<WT>;
    a.pf_steps = (int)std::min<int64_t>(a.slice_steps - D, kPfBytes / (resident * per_step));
    if (a.pf_steps < 0) a.pf_steps = 0;
  }
  a.late_trigger = tu.trigger == 2;
  const size_t smem = x_bytes + (ks > 1 ? red_bytes : 0);
  if (smem > (size_t)max_smem) return cudaErrorInvalidValue;
  return launch_ex(kern, dim3((unsigned)ks, (unsigned)row_groups), dim3(W * 32), smem, stream, ks, true, a);
}

// Block shapes for BF16 weights (warps, m-tiles per warp, ring depth); F16 takes the first, F32 (chunks
// twice the registers) 8 warps x 1 m-tile with a ring of 2.
constexpr const char* kConfigNames[] = {"8 warps x 16 rows, ring 4", "8 warps x 16 rows, ring 8",
                                        "4 warps x 32 rows, ring 4"};
constexpr int kConfigs = 3;

template <GgmlType WT, Mma M, int NT>
cudaError_t gemv2_config(const Gemv2Args& a, const tuning::GemvTuning& tu, cudaStream_t stream) {
  if constexpr (WT == GgmlType::F32) {
    return launch_gemv2<WT, M, NT, 1, 8, 2>(a, tu, stream);
  } else if constexpr (WT == GgmlType::F16) {
    return launch_gemv2<WT, M, NT, 1, 8, 4>(a, tu, stream);
  } else {
    switch (tu.config) {
      case 1:
        return launch_gemv2<WT, M, NT, 1, 8, 8>(a, tu, stream);
      case 2:
        return launch_gemv2<WT, M, NT, 2, 4, 4>(a, tu, stream);
      default:
        return launch_gemv2<WT, M, NT, 1, 8, 4>(a, tu, stream);
    }
  }
}

template <GgmlType WT, Mma M>
cudaError_t gemv2_nt(const Gemv2Args& a, const tuning::GemvTuning& tu, cudaStream_t stream) {
  if (a.n <= 8) return gemv2_config<WT, M, 1>(a, tu, stream);
  if (a.n <= 16) return gemv2_config<WT, M, 2>(a, tu, stream);
  return gemv2_config<WT, M, 4>(a, tu, stream);
}

template <GgmlType WT>
cudaError_t gemv2(const Gemv2Args& a, const tuning::GemvTuning& tu, cudaStream_t stream) {
  if constexpr (WT == GgmlType::BF16) {
    if (tu.mma == 1) return gemv2_nt<WT, Mma::tf32>(a, tu, stream);
    return gemv2_nt<WT, Mma::bf16x3>(a, tu, stream);
  } else {
    return gemv2_nt<WT, Mma::tf32>(a, tu, stream);
  }
}

// ---- the column-split kernel (the default for most shapes; tuning kernel = 1)

struct GemvArgs {
  const uint8_t* w;  // [rows, row_bytes]
  int64_t rows, cols;
  int64_t row_bytes;
  const float* x;  // [n, cols]
  int n;
  float* y;           // [n, rows]
  const float* bias;  // [rows] or null
  bool accumulate;
  bool late_trigger = false;  // pdl_trigger after the main loop instead of before the wait
};

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

template <GgmlType T>
constexpr int kElemBytes = T == GgmlType::F32 ? 4 : 2;

// One output value: bias, accumulate, store.
__device__ __forceinline__ void gemv_store(const GemvArgs& a, int tok, int64_t row, float s) {
  if (a.bias) s += a.bias[row];
  float* yp = a.y + (int64_t)tok * a.rows + row;
  *yp = a.accumulate ? __ldcg(yp) + s : s;
}

// 8 consecutive x values of one token (16-byte aligned), read through L2 (written by an earlier kernel that
// may still have been running when this one started, see pdl_wait).
// kL1: through the non-coherent path and L1 instead (ordinary launches only: the kernel starts after the
// previous one completed).
template <bool kL1>
__device__ __forceinline__ void gemv_load_x8(const GemvArgs& a, int64_t off, float (&v)[8]) {
  const float4 p = kL1 ? ld_f4(a.x + off) : __ldcg(reinterpret_cast<const float4*>(a.x + off));
  const float4 q = kL1 ? ld_f4(a.x + off + 4) : __ldcg(reinterpret_cast<const float4*>(a.x + off + 4));
  v[0] = p.x, v[1] = p.y, v[2] = p.z, v[3] = p.w, v[4] = q.x, v[5] = q.y, v[6] = q.z, v[7] = q.w;
}

// Rows [row0, row0 + 16 * MT) for all n tokens (NT n-tiles of 8). red: shared [kWarps][MT][NT][4][32].
// Each warp's first span of weight loads is issued before pdl_wait (weights are never written by kernels),
// so under programmatic launch they stream while the previous kernel finishes.
template <GgmlType WT, int NT, int MT, int U, bool kL1>
__device__ __forceinline__ void gemv_tc_tile(const GemvArgs& a, int64_t row0, float* red) {
  using C8 = Chunk8<WT>;
  constexpr bool kSplitW = WT == GgmlType::F32;  // f32 weights are not exact in TF32
  constexpr int kSpan = 32 * U;                  // columns per warp iteration
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;

  float acc[MT][NT][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[m][j][r] = 0.0f;

  // Rows past the end re-read the last row (valid memory); their results are never stored.
  const uint8_t* wrow[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int64_t r = row0 + m * 16 + h * 8 + g;
      if (r >= a.rows) r = a.rows - 1;
      wrow[m][h] = a.w + r * a.row_bytes;
    }
  int64_t xoff[NT];
  bool xok[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int tok = j * 8 + g;
    xok[j] = tok < a.n;
    xoff[j] = (int64_t)(xok[j] ? tok : 0) * a.cols;
  }

  const int64_t n_iter = (a.cols + kSpan - 1) / kSpan;
  C8 wv[MT][2][U];
  auto load_w = [&](int64_t it) {
    const int64_t c0 = it * kSpan + t4 * 8;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + u * 32;
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (c < a.cols)
            wv[m][h][u].load(wrow[m][h] + c * kElemBytes<WT>);
          else
            wv[m][h][u].zero();
        }
    }
  };
  // The MMA accumulators are added into f32 sums every kFlush iterations (512 columns): one tensor-core
  // accumulation chain over a warp's whole column range loses accuracy (1.0e-5 relative measured at 16392
  // columns against ~2e-6 for chains of 512 columns).
  constexpr int kFlush = 512 / kSpan > 1 ? 512 / kSpan : 1;
  float sum[MT][NT][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) sum[m][j][r] = 0.0f;
  int since_flush = 0;
  if (warp < n_iter) load_w(warp);
  if (!a.late_trigger) pdl_trigger();
  pdl_wait();
  for (int64_t it = warp; it < n_iter; it += kWarps) {
    const int64_t c0 = it * kSpan + t4 * 8;
    if (it != warp) load_w(it);
    if (++since_flush > kFlush) {
      since_flush = 1;
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) sum[m][j][r] += acc[m][j][r], acc[m][j][r] = 0.0f;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + u * 32;
      float xv[NT][8];
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        if (xok[j] && c < a.cols) {
          gemv_load_x8<kL1>(a, xoff[j] + c, xv[j]);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) xv[j][e] = 0.0f;
        }
      }
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        uint32_t bh[NT][2], bl[NT][2];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          split_tf32(xv[j][2 * s], bh[j][0], bl[j][0]);
          split_tf32(xv[j][2 * s + 1], bh[j][1], bl[j][1]);
        }
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          const float2 r0 = wv[m][0][u].pair(s);  // row g: elements 2s, 2s + 1
          const float2 r1 = wv[m][1][u].pair(s);  // row g + 8
          uint32_t a0, a1, a2, a3, l0 = 0, l1 = 0, l2 = 0, l3 = 0;
          if constexpr (kSplitW) {
            split_tf32(r0.x, a0, l0);
            split_tf32(r1.x, a1, l1);
            split_tf32(r0.y, a2, l2);
            split_tf32(r1.y, a3, l3);
          } else {
            a0 = __float_as_uint(r0.x), a1 = __float_as_uint(r1.x);
            a2 = __float_as_uint(r0.y), a3 = __float_as_uint(r1.y);
          }
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            mma_tf32(acc[m][j], a0, a1, a2, a3, bh[j][0], bh[j][1]);
            mma_tf32(acc[m][j], a0, a1, a2, a3, bl[j][0], bl[j][1]);
            if constexpr (kSplitW) mma_tf32(acc[m][j], l0, l1, l2, l3, bh[j][0], bh[j][1]);
          }
        }
      }
    }
  }

  if (a.late_trigger) pdl_trigger();  // every weight load of this block is issued
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[m][j][r] += sum[m][j][r];
        // Cross-warp reduction. C fragment: acc[m][j][r] is row m*16 + g + 8*(r/2), token j*8 + 2*t4 + (r%2).
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) red[(((warp * MT + m) * NT + j) * 4 + r) * 32 + lane] = acc[m][j][r];
  __syncthreads();
  constexpr int kRows = MT * 16, kOut = kRows * NT * 8;
  for (int idx = threadIdx.x; idx < kOut; idx += blockDim.x) {
    const int tok = idx / kRows, rr = idx % kRows;
    const int64_t row = row0 + rr;
    if (tok >= a.n || row >= a.rows) continue;
    const int m = rr / 16, rm = rr % 16;
    const int j = tok / 8, tt = tok % 8;
    const int r = (rm / 8) * 2 + (tt & 1), ln = (rm % 8) * 4 + tt / 2;
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += red[(((w * MT + m) * NT + j) * 4 + r) * 32 + ln];
    gemv_store(a, tok, row, s);
  }
}

template <GgmlType WT, int NT, int MT, int U, bool kL1>
__global__ void __launch_bounds__(kThreads, 2) gemv_tc_kernel(GemvArgs a) {
  __shared__ float red[kWarps * MT * NT * 4 * 32];
  gemv_tc_tile<WT, NT, MT, U, kL1>(a, (int64_t)blockIdx.x * (16 * MT), red);
}

// SIMT fallback: one warp per weight row, tokens in groups of 4 (the row is re-read from L1/L2 per group).
template <GgmlType WT>
__device__ __forceinline__ void gemv_simt_row(const GemvArgs& a, int64_t row) {
  const int lane = threadIdx.x & 31;
  const uint8_t* wr = a.w + row * a.row_bytes;
  for (int t0 = 0; t0 < a.n; t0 += 4) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t c = lane; c < a.cols; c += 32) {
      const float wv = load_elem<WT>(wr, c);
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (t0 + k < a.n) acc[k] += wv * __ldcg(a.x + (int64_t)(t0 + k) * a.cols + c);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) acc[k] = warp_sum(acc[k]);
    if (lane == 0)
      for (int k = 0; k < 4 && t0 + k < a.n; ++k) gemv_store(a, t0 + k, row, acc[k]);
  }
}

template <GgmlType WT>
__global__ void __launch_bounds__(kThreads) gemv_simt_kernel(GemvArgs a) {
  pdl_trigger();
  pdl_wait();
  const int64_t row = (int64_t)blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (row < a.rows) gemv_simt_row<WT>(a, row);
}

// kL1 = false: programmatic launch, x through L2 (decode: weight loads overlap the previous kernel);
// true: ordinary launch, x through L1 (two blocks of an SM share x; measured faster for n >= 2).
template <GgmlType WT, int NT, int MT, int U, bool kL1 = false>
cudaError_t launch_tc(const GemvArgs& a, cudaStream_t stream) {
  const int64_t blocks = (a.rows + 16 * MT - 1) / (16 * MT);
  return launch_ex(gemv_tc_kernel<WT, NT, MT, U, kL1>, dim3((unsigned)blocks), dim3(kThreads), 0, stream, 1,
                   kL1 ? 0 : kPdlAll, a);
}

// Tile shapes per n-tile count (not tuned on hardware yet; see docs/CUDA.md). F32 weights take half the
// spans in flight (their chunks are twice the registers).
template <GgmlType WT>
cudaError_t dispatch_tc(const GemvArgs& a, cudaStream_t stream) {
  constexpr int kU = WT == GgmlType::F32 ? 2 : 4;
  constexpr int kU2 = WT == GgmlType::F32 ? 1 : 2;
  // One row: programmatic launch and x through L2; more rows: ordinary launch and x through L1 (measured on
  // the H200, docs/CUDA.md: n = 8 on the 8B shape 10% faster, n = 32 35% faster that way).
  const bool l2 = !g_gemv_l1_all && (a.n == 1 || g_gemv_l2_all);
  if (a.n <= 8) return l2 ? launch_tc<WT, 1, 1, kU>(a, stream) : launch_tc<WT, 1, 1, kU, true>(a, stream);
  if (a.n <= 16) return l2 ? launch_tc<WT, 2, 2, kU2>(a, stream) : launch_tc<WT, 2, 2, kU2, true>(a, stream);
  return l2 ? launch_tc<WT, 4, 2, kU2>(a, stream) : launch_tc<WT, 4, 2, kU2, true>(a, stream);
}

template <GgmlType WT>
cudaError_t dispatch_simt(const GemvArgs& a, cudaStream_t stream) {
  const int64_t blocks = (a.rows + kWarps - 1) / kWarps;
  return launch_ex(gemv_simt_kernel<WT>, dim3((unsigned)blocks), dim3(kThreads), 0, stream, 1, kPdlAll, a);
}

template <GgmlType WT>
cudaError_t dispatch(const GemvArgs& a, bool use_tc, cudaStream_t stream) {
  if (!use_tc) {
    if (cudaError_t e = dispatch_simt<WT>(a, stream)) return e;
    return cudaGetLastError();
  }
  // Automatic choice, from the H200 measurements (docs/CUDA.md, "Measurements"): the split-K kernel with
  // programmatic launch wins for tall BF16 matrices only (ring 8 for n <= 4 on >= 8192 rows; ring 4 without
  // the L2 prefetch for 9 <= n <= 16 on >= 65536 rows); everywhere else the column-split kernel is faster.
  tuning::GemvTuning tu = g_tune;
  // One row of F16 / BF16 weights: the weight-streaming kernel (gemv_stream.cu), measured faster in the
  // decode step (docs/CUDA.md, "Weight streaming").
  if (tu.kernel == 0 && a.n == 1 && WT != GgmlType::F32) tu.kernel = 3;
  if (tu.kernel == 0) {
    tu.kernel = 1;
    if (WT == GgmlType::BF16 && a.rows >= 8192 && a.n <= 4) {
      tu.kernel = 2;
      if (tu.config < 0) tu.config = 1;
    } else if (WT == GgmlType::BF16 && a.rows >= 65536 && a.n > 8 && a.n <= 16) {
      tu.kernel = 2;
      if (tu.pf_steps < 0) tu.pf_steps = 0;
    }
  }
  if (tu.kernel == 3 && a.n == 1 && WT != GgmlType::F32) {
    const cudaError_t e = gemv_stream(WT, a.w, a.rows, a.cols, a.row_bytes, a.x, a.y, a.bias, a.accumulate,
                                      tu.smem_budget, stream);
    if (e != cudaErrorNotSupported) return e;
    tu.kernel = 1;  // a shape it does not take: the column-split kernel
  }
  if (tu.kernel == 1 || tu.kernel == 3) {
    GemvArgs b = a;
    b.late_trigger = tu.trigger == 2;
    if (cudaError_t e = dispatch_tc<WT>(b, stream)) return e;
    return cudaGetLastError();
  }
  Gemv2Args b{};
  b.w = a.w;
  b.rows = a.rows;
  b.cols = a.cols;
  b.row_bytes = a.row_bytes;
  b.x = a.x;
  b.n = a.n;
  b.y = a.y;
  b.bias = a.bias;
  b.accumulate = a.accumulate;
  if (cudaError_t e = gemv2<WT>(b, tu, stream); e != cudaSuccess) return e;
  return cudaGetLastError();
}

// F8_E4M3 through the weight-streaming kernel: one scale per row (or tensor), the automatic choice or the
// streaming kernel chosen.
bool stream_fp8_ok(const WeightView& w) {
  const tuning::GemvTuning& tu = g_tune;
  return w.type == GgmlType::F8_E4M3 && lowbit_scale_per_row_or_tensor(w) &&
         (tu.kernel == 0 || tu.kernel == 3);
}

}  // namespace

namespace tuning {
void set_gemv_tuning(const GemvTuning& t) {
  g_tune = t;
}
void set_gemv_l2_all(bool on) {
  g_gemv_l2_all = on;
}
void set_gemv_l1_all(bool on) {
  g_gemv_l1_all = on;
}
int gemv_config_count() {
  return kConfigs;
}
const char* gemv_config_name(int config) {
  return config >= 0 && config < kConfigs ? kConfigNames[config] : "automatic";
}
}  // namespace tuning

cudaError_t gemv(const WeightView& w, const float* x, int n, float* y, const float* bias, bool accumulate,
                 cudaStream_t stream, GemvPath path) {
  if (n < 1 || n > kGemvMaxRows || w.rows <= 0 || w.cols <= 0 || !w.data || !x || !y)
    return cudaErrorInvalidValue;
  // F8_E4M3 / TERNARY with a scale per row or tensor: the tensor-core kernel (gemv_lowbit_tc.cu) where it
  // takes the shape, else (F8_E4M3) for one row the weight-streaming kernel; other Q8_0 / F8_E4M3 / TERNARY
  // steps (device layout): the SIMT kernel of gemv_lowbit.cu (path is ignored).
  if (gemv_lowbit_tc_ok(w, n))
    if (const cudaError_t e = gemv_lowbit_tc(w, x, n, y, bias, accumulate, stream);
        e != cudaErrorNotSupported)
      return e;
  if (n == 1 && stream_fp8_ok(w)) {
    const cudaError_t e = detail::gemv_stream(w.type, static_cast<const uint8_t*>(w.data), w.rows, w.cols,
                                              (int64_t)w.row_bytes, x, y, bias, accumulate,
                                              g_tune.smem_budget, stream, {}, w.scale, w.scale_row_stride);
    if (e != cudaErrorNotSupported) return e;
  }
  if (is_lowbit(w.type)) return gemv_lowbit(w, x, n, y, bias, accumulate, stream);
  const int64_t esize = dense_elem_bytes(w.type);
  if (esize == 0) return cudaErrorInvalidValue;
  if ((int64_t)w.row_bytes < w.cols * esize || w.rows > (int64_t)0x7fffffff * 16)
    return cudaErrorInvalidValue;
  const bool tc_ok = w.cols % 8 == 0 && aligned16(w.data) && w.row_bytes % 16 == 0 && aligned16(x);
  bool use_tc = tc_ok;
  if (path == GemvPath::tensor_core && !tc_ok) return cudaErrorInvalidValue;
  if (path == GemvPath::simt) use_tc = false;

  const GemvArgs a{
      static_cast<const uint8_t*>(w.data), w.rows, w.cols, (int64_t)w.row_bytes, x, n, y, bias, accumulate};
  switch (w.type) {
    case GgmlType::F32:
      return dispatch<GgmlType::F32>(a, use_tc, stream);
    case GgmlType::F16:
      return dispatch<GgmlType::F16>(a, use_tc, stream);
    default:
      return dispatch<GgmlType::BF16>(a, use_tc, stream);
  }
}

namespace {
cudaError_t gemv_stream_input(const WeightView& w, const float* x, const detail::StreamInput& in, float* y,
                              const float* bias, bool accumulate, cudaStream_t stream) {
  const tuning::GemvTuning& tu = g_tune;
  if ((tu.kernel != 0 && tu.kernel != 3) || !w.data || !x || !y || !in.w) return cudaErrorNotSupported;
  // F8_E4M3: where the tensor-core kernel takes the matrix, it and the op before it (measured faster than
  // the streaming kernel on the 8B shapes, docs/CUDA.md "Tuning switches").
  if (is_lowbit(w.type) && (!stream_fp8_ok(w) || gemv_lowbit_tc_ok(w, 1))) return cudaErrorNotSupported;
  return detail::gemv_stream(w.type, static_cast<const uint8_t*>(w.data), w.rows, w.cols,
                             (int64_t)w.row_bytes, x, y, bias, accumulate, tu.smem_budget, stream, in,
                             w.scale, w.scale_row_stride);
}
}  // namespace

cudaError_t gemv_rmsnorm(const WeightView& w, const float* x, const int32_t* row, const float* norm_w,
                         float eps, float* y, const float* bias, bool accumulate, cudaStream_t stream) {
  detail::StreamInput in;
  in.kind = detail::StreamInput::rmsnorm;
  in.w = norm_w;
  in.eps = eps;
  in.row = row;
  return gemv_stream_input(w, x, in, y, bias, accumulate, stream);
}

cudaError_t gemv_swiglu(const WeightView& w, const float* gate, const float* up, float* y, bool accumulate,
                        cudaStream_t stream) {
  detail::StreamInput in;
  in.kind = detail::StreamInput::silu_mul;
  in.w = up;
  return gemv_stream_input(w, gate, in, y, nullptr, accumulate, stream);
}

}  // namespace ultra::cuda
