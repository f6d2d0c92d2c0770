// Decode / small-batch matmul (n <= 32 rows of activations): y[n, rows] = x[n, cols] . W^T (+ bias) (+= y).
//
// Tensor-core path (the fast one). A block owns MB = 16 * MT weight rows; its 8 warps split the columns
// (warp w takes column spans w, w + 8, ... of 32 * U columns, so the block's warps read neighbouring spans
// of the same rows at the same time). Per span, lane (g, t) loads 16 bytes (8 elements) of rows g and g + 8
// of each 16-row m-tile with streaming loads, U spans' worth in flight before the first use, and 8 f32 of
// x for token g (of each 8-token n-tile) from L1/L2. Then 4 MMAs per (m-tile, n-tile, half of x) consume
// the chunk (see common.cuh for the k mapping). x = hi + lo in TF32 and F16 / BF16 weights are exact in
// TF32, so W.x_hi + W.x_lo is f32-accurate; F32 weights are split too (w_hi.x_hi + w_hi.x_lo + w_lo.x_hi).
// The per-warp partial sums are reduced across warps in shared memory (fixed order), then bias and the
// optional accumulate are applied once per output.
//
// Every weight byte is read once per launch for all n rows; x (n * cols * 4 bytes) is re-read from L1/L2
// by every block. Needs cols % 8 == 0 and 16-byte aligned weight rows and x; any other shape runs the SIMT
// fallback (a warp per row, scalar loads, tokens in groups of 4).
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace ultra::cuda {

using namespace detail;

namespace {

struct GemvArgs {
  const uint8_t* w;  // [rows, row_bytes]
  int64_t rows, cols;
  int64_t row_bytes;
  const float* x;  // [n, cols]
  int n;
  float* y;           // [n, rows]
  const float* bias;  // [rows] or null
  bool accumulate;
};

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

template <GgmlType T>
constexpr int kElemBytes = T == GgmlType::F32 ? 4 : 2;

// One output value: bias, accumulate, store.
__device__ __forceinline__ void gemv_store(const GemvArgs& a, int tok, int64_t row, float s) {
  if (a.bias) s += a.bias[row];
  float* yp = a.y + (int64_t)tok * a.rows + row;
  *yp = a.accumulate ? *yp + s : s;
}

// Rows [row0, row0 + 16 * MT) for all n tokens (NT n-tiles of 8). red: shared [kWarps][MT][NT][4][32].
template <GgmlType WT, int NT, int MT, int U>
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
  const float* xrow[NT];
  bool xok[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int tok = j * 8 + g;
    xok[j] = tok < a.n;
    xrow[j] = a.x + (int64_t)(xok[j] ? tok : 0) * a.cols;
  }

  const int64_t n_iter = (a.cols + kSpan - 1) / kSpan;
  for (int64_t it = warp; it < n_iter; it += kWarps) {
    const int64_t c0 = it * kSpan + t4 * 8;
    C8 wv[MT][2][U];
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
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + u * 32;
      float xv[NT][8];
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        if (xok[j] && c < a.cols) {
          const float4 p = ld_f4(xrow[j] + c), q = ld_f4(xrow[j] + c + 4);
          xv[j][0] = p.x, xv[j][1] = p.y, xv[j][2] = p.z, xv[j][3] = p.w;
          xv[j][4] = q.x, xv[j][5] = q.y, xv[j][6] = q.z, xv[j][7] = q.w;
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

template <GgmlType WT, int NT, int MT, int U>
__global__ void __launch_bounds__(kThreads, 2) gemv_tc_kernel(GemvArgs a) {
  __shared__ float red[kWarps * MT * NT * 4 * 32];
  gemv_tc_tile<WT, NT, MT, U>(a, (int64_t)blockIdx.x * (16 * MT), red);
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
        if (t0 + k < a.n) acc[k] += wv * a.x[(int64_t)(t0 + k) * a.cols + c];
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) acc[k] = warp_sum(acc[k]);
    if (lane == 0)
      for (int k = 0; k < 4 && t0 + k < a.n; ++k) gemv_store(a, t0 + k, row, acc[k]);
  }
}

template <GgmlType WT>
__global__ void __launch_bounds__(kThreads) gemv_simt_kernel(GemvArgs a) {
  const int64_t row = (int64_t)blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (row < a.rows) gemv_simt_row<WT>(a, row);
}

template <GgmlType WT, int NT, int MT, int U>
void launch_tc(const GemvArgs& a, cudaStream_t stream) {
  const int64_t blocks = (a.rows + 16 * MT - 1) / (16 * MT);
  gemv_tc_kernel<WT, NT, MT, U><<<(unsigned)blocks, kThreads, 0, stream>>>(a);
}

// Tile shapes per n-tile count (not tuned on hardware yet; see docs/CUDA.md). F32 weights take half the
// spans in flight (their chunks are twice the registers).
template <GgmlType WT>
void dispatch_tc(const GemvArgs& a, cudaStream_t stream) {
  constexpr int kU = WT == GgmlType::F32 ? 2 : 4;
  constexpr int kU2 = WT == GgmlType::F32 ? 1 : 2;
  if (a.n <= 8)
    launch_tc<WT, 1, 1, kU>(a, stream);
  else if (a.n <= 16)
    launch_tc<WT, 2, 2, kU2>(a, stream);
  else
    launch_tc<WT, 4, 2, kU2>(a, stream);
}

template <GgmlType WT>
void dispatch_simt(const GemvArgs& a, cudaStream_t stream) {
  const int64_t blocks = (a.rows + kWarps - 1) / kWarps;
  gemv_simt_kernel<WT><<<(unsigned)blocks, kThreads, 0, stream>>>(a);
}

}  // namespace

cudaError_t gemv(const WeightView& w, const float* x, int n, float* y, const float* bias, bool accumulate,
                 cudaStream_t stream, GemvPath path) {
  if (n < 1 || n > kGemvMaxRows || w.rows <= 0 || w.cols <= 0 || !w.data || !x || !y)
    return cudaErrorInvalidValue;
  int64_t esize;
  switch (w.type) {
    case GgmlType::F32:
      esize = 4;
      break;
    case GgmlType::F16:
    case GgmlType::BF16:
      esize = 2;
      break;
    default:  // TODO(q8_0): a Chunk loader for 34-byte blocks (scale * int8) in both paths.
      return cudaErrorInvalidValue;
  }
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
      use_tc ? dispatch_tc<GgmlType::F32>(a, stream) : dispatch_simt<GgmlType::F32>(a, stream);
      break;
    case GgmlType::F16:
      use_tc ? dispatch_tc<GgmlType::F16>(a, stream) : dispatch_simt<GgmlType::F16>(a, stream);
      break;
    default:
      use_tc ? dispatch_tc<GgmlType::BF16>(a, stream) : dispatch_simt<GgmlType::BF16>(a, stream);
      break;
  }
  return cudaGetLastError();
}

}  // namespace ultra::cuda
