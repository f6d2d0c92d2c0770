// GGUF block types (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) on the device: the host repacking into the
// device layout, the decode GEMV and the BF16 dequantisation for the prefill GEMM (gemv_kquant.h).
//
// GEMV (1 <= n <= 8 rows of x per launch). A warp owns R consecutive weight rows; lane l takes the rows'
// 32-weight units l, l + 32, ... (kquant.cuh: one 16-byte load of codes per unit, plus the block header /
// high bits / scales, whose addresses the 8 lanes of a block share), U units of each of the R rows loaded
// before any is used. A unit is decoded in registers to its 32 codes as exact f32 (a byte permute and a
// subtraction per weight after a few word-wide and / shift / or ops) and its two 16-column groups' scale a
// and minimum b; then for each of the n rows of x, each group's x (float4 loads through L1) gives
// p = sum code * x (two FMA chains) and, for the types with a minimum, sx = sum x (shared by the R rows),
// and a * p + b * sx is added into the f32 accumulators acc[R][n]: about 3 ops per weight and row of x. The
// lanes' sums are added by a butterfly of warp shuffles (fixed order: deterministic).
//
// Why the weights stay (nearly) in the GGUF layout: Q4_K / Q5_K blocks are 16-byte multiples and are read
// as they are; Q6_K (210 bytes) and Q4_0 (18 bytes) blocks are only 2-byte aligned, so their d are moved to
// the row end (the rest of each block then being 16-byte aligned), and the other 32-element blocks (20 to
// 24 bytes) are split likewise into their codes, high bits and scales: the same bytes as the file.
//
// Dequantisation: one thread per unit, two 32-byte stores of BF16.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kquant.cuh"
#include "backend/cuda/tuning.h"
#include "core/quants.h"

namespace ultra::cuda {

using namespace detail;

// ---- host: layout

size_t kquant_row_bytes(GgmlType t, int64_t cols) {
  const int64_t be = kquant_block_elems(t);
  if (!be || cols <= 0 || cols % be != 0) return 0;
  const int64_t nb = cols / be;
  int64_t b = 0;
  switch (t) {
    case GgmlType::Q4_0:
      b = nb * 18;
      break;
    case GgmlType::Q4_1:
      b = nb * 20;
      break;
    case GgmlType::Q5_0:
      b = nb * 22;
      break;
    case GgmlType::Q5_1:
      b = nb * 24;
      break;
    case GgmlType::Q4_K:
      b = nb * 144;
      break;
    case GgmlType::Q5_K:
      b = nb * 176;
      break;
    default:  // Q6_K
      b = nb * 210;
      break;
  }
  return (size_t)((b + 15) / 16 * 16);
}

bool kquant_pack_rows(const WeightView& w, int64_t r0, int64_t r1, void* out) {
  const size_t rb = kquant_row_bytes(w.type, w.cols);
  if (!rb || !w.data || r0 < 0 || r1 > w.rows || r0 > r1) return false;
  const int64_t nb = w.cols / kquant_block_elems(w.type);
  uint8_t* o = static_cast<uint8_t*>(out);
  for (int64_t r = r0; r < r1; ++r, o += rb) {
    std::memset(o, 0, rb);
    const uint8_t* src = static_cast<const uint8_t*>(w.data) + r * w.row_bytes;
    switch (w.type) {
      case GgmlType::Q4_K:
      case GgmlType::Q5_K:
        std::memcpy(o, src, (size_t)nb * (w.type == GgmlType::Q4_K ? 144 : 176));
        break;
      case GgmlType::Q6_K:
        for (int64_t b = 0; b < nb; ++b) {
          BlockQ6_K blk;
          std::memcpy(&blk, src + b * sizeof(BlockQ6_K), sizeof blk);
          std::memcpy(o + 208 * b, &blk, 208);  // ql, qh, scales
          std::memcpy(o + 208 * nb + 2 * b, &blk.d, 2);
        }
        break;
      default: {  // 32-element blocks: d, (m), (qh[4]), qs[16] -> qs..., (qh...), d..., (m...)
        const bool has_m = w.type == GgmlType::Q4_1 || w.type == GgmlType::Q5_1;
        const bool has_qh = w.type == GgmlType::Q5_0 || w.type == GgmlType::Q5_1;
        const size_t bb = 18 + (has_m ? 2 : 0) + (has_qh ? 4 : 0);  // GGUF block bytes
        uint8_t* qh = o + 16 * nb;
        uint8_t* d = qh + (has_qh ? 4 * nb : 0);
        for (int64_t b = 0; b < nb; ++b) {
          const uint8_t* blk = src + b * bb;
          std::memcpy(o + 16 * b, blk + bb - 16, 16);
          if (has_qh) std::memcpy(qh + 4 * b, blk + bb - 20, 4);
          std::memcpy(d + 2 * b, blk, 2);
          if (has_m) std::memcpy(d + 2 * nb + 2 * b, blk + 2, 2);
        }
        break;
      }
    }
  }
  return true;
}

namespace {

static_assert(offsetof(BlockQ6_K, d) == 208, "Q6_K: ql, qh, scales first");

// ---- the GEMV

constexpr int kKqWarps = 4;
constexpr int kKqThreads = kKqWarps * 32;
constexpr int kKqMaxN = 8;                 // rows of x per launch
constexpr size_t kKqMaxStage = 96u << 10;  // most bytes of x the staged kernel copies to shared memory
int g_stage = -1;                          // set_kquant_stage; -1: kernel_tuning().kq_stage

struct KqArgs {
  const uint8_t* w;  // [rows, row_bytes] device layout
  int64_t rows, cols, row_bytes;
  const float* x;  // [n, cols]
  int n;
  float* y;           // [n, rows]
  const float* bias;  // [rows] or null
  bool accumulate;
  bool x_vec;  // x 16-byte aligned: float4 loads
};

// x[t, c0 .. c0 + 16).
__device__ __forceinline__ void kq_x16(const KqArgs& a, int t, int c0, float (&xf)[16]) {
  const float* xp = a.x + (int64_t)t * a.cols + c0;
  if (a.x_vec) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(xp) + q);
      xf[4 * q] = v.x, xf[4 * q + 1] = v.y, xf[4 * q + 2] = v.z, xf[4 * q + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int e = 0; e < 16; ++e) xf[e] = __ldg(xp + e);
  }
}

// S (staged): the block first copies x into shared memory in unit order (xs, below), so that the lanes'
// reads of x, consecutive units, are consecutive 16-byte words (from L1, each lane's 16-column groups lie
// 64 to 256 bytes apart: a warp's float4 load touched 16 to 32 lines); the block then loops over row tiles
// (a grid of a few blocks per SM, each staging x once). Otherwise x is read from L1 and a block has one tile.
// xs[((t * 2 + g) * 4 + q) * n_units + k] = x[t, kq_col(k, g) + 4 q .. + 4) (float4).
template <GgmlType T, int NMAX, int R, int U, bool S>
__global__ void __launch_bounds__(kKqThreads) gemv_kquant_kernel(KqArgs a) {
  extern __shared__ float4 xs_mem[];
  float4* xs = xs_mem;
  const int lane = threadIdx.x & 31;
  const int n_units = kq_units(a.cols);
  if constexpr (S) {
    const int quads = (int)(a.cols >> 2);
    for (int m = threadIdx.x; m < a.n * quads; m += kKqThreads) {
      const int t = m / quads, c = (m - t * quads) * 4;
      int k, g, e;
      kq_locate<T>(c, &k, &g, &e);
      xs[((t * 2 + g) * 4 + (e >> 2)) * n_units + k] =
          __ldg(reinterpret_cast<const float4*>(a.x + (int64_t)t * a.cols + c));
    }
    __syncthreads();
  }
  const int64_t n_tiles = (a.rows + (int64_t)R * kKqWarps - 1) / ((int64_t)R * kKqWarps);
  for (int64_t tile = blockIdx.x; tile < n_tiles; tile += S ? gridDim.x : n_tiles) {
    const int64_t row0 = (tile * kKqWarps + (threadIdx.x >> 5)) * R;
    if (row0 >= a.rows) break;  // the whole warp (later tiles are further)
    const uint8_t* wrow[R];     // the warp's rows (row0 again for rows past the end: loaded, never stored)
#pragma unroll
    for (int j = 0; j < R; ++j) wrow[j] = a.w + (row0 + j < a.rows ? row0 + j : row0) * a.row_bytes;
    float acc[R][NMAX];
#pragma unroll
    for (int j = 0; j < R; ++j)
#pragma unroll
      for (int t = 0; t < NMAX; ++t) acc[j][t] = 0.0f;

    for (int k0 = lane; k0 < n_units; k0 += 32 * U) {
      KqUnit u[U][R];
#pragma unroll
      for (int v = 0; v < U; ++v)
#pragma unroll
        for (int j = 0; j < R; ++j)
          if (k0 + 32 * v < n_units) u[v][j] = kq_load<T>(wrow[j], a.cols, k0 + 32 * v);
#pragma unroll
      for (int v = 0; v < U; ++v) {
        const int k = k0 + 32 * v;
        if (k >= n_units) break;
        float qf[R][2][16], sa[R][2], sb[R][2];
#pragma unroll
        for (int j = 0; j < R; ++j) kq_codes<T>(u[v][j], k, qf[j], sa[j], sb[j]);
#pragma unroll
        for (int g = 0; g < 2; ++g) {
          const int c0 = kq_col<T>(k, g);
#pragma unroll
          for (int t = 0; t < NMAX; ++t) {
            if (t >= a.n) break;
            float xf[16];
            if constexpr (S) {
#pragma unroll
              for (int q = 0; q < 4; ++q) {
                const float4 v = xs[((t * 2 + g) * 4 + q) * n_units + k];
                xf[4 * q] = v.x, xf[4 * q + 1] = v.y, xf[4 * q + 2] = v.z, xf[4 * q + 3] = v.w;
              }
            } else {
              kq_x16(a, t, c0, xf);
            }
            float sx = 0.0f;  // sum of x over the group (the minimum's term), shared by the R rows
            if constexpr (kq_has_min(T)) {
              float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
              for (int e = 0; e < 16; e += 2) s0 += xf[e], s1 += xf[e + 1];
              sx = s0 + s1;
            }
#pragma unroll
            for (int j = 0; j < R; ++j) {
              float p0 = 0.0f, p1 = 0.0f;  // two chains: sum of code * x
#pragma unroll
              for (int e = 0; e < 16; e += 2)
                p0 = fmaf(qf[j][g][e], xf[e], p0), p1 = fmaf(qf[j][g][e + 1], xf[e + 1], p1);
              float r = sa[j][g] * (p0 + p1);
              if constexpr (kq_has_min(T)) r = fmaf(sb[j][g], sx, r);
              acc[j][t] += r;
            }
          }
        }
      }
    }

#pragma unroll
    for (int j = 0; j < R; ++j)
#pragma unroll
      for (int t = 0; t < NMAX; ++t) {
        if (t >= a.n) break;
        const float v = warp_sum(acc[j][t]);
        if (lane == ((j * NMAX + t) & 31) && row0 + j < a.rows) {
          const int64_t r = row0 + j;
          float s = v;
          if (a.bias) s += a.bias[r];
          float* yp = a.y + (int64_t)t * a.rows + r;
          *yp = a.accumulate ? *yp + s : s;
        }
      }
  }
}

// Shared memory of the staged kernel (0: x too large for it, or not 16-byte aligned: the L1 kernel).
size_t kq_stage_bytes(const KqArgs& a) {
  const size_t b = (size_t)a.n * (size_t)a.cols * sizeof(float);
  const bool on = g_stage >= 0 ? g_stage != 0 : kernel_tuning().kq_stage;
  return a.x_vec && on && b <= kKqMaxStage ? b : 0;
}

template <GgmlType T, int NMAX, int R, int U>
cudaError_t launch_kq(const KqArgs& a, cudaStream_t stream) {
  const int64_t rows_per_block = (int64_t)R * kKqWarps;
  const int64_t tiles = (a.rows + rows_per_block - 1) / rows_per_block;
  if (const size_t smem = kq_stage_bytes(a)) {
    static const cudaError_t attr =
        cudaFuncSetAttribute(gemv_kquant_kernel<T, NMAX, R, U, true>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kKqMaxStage);
    if (attr != cudaSuccess) return attr;
    static int n_sms = 0;
    if (!n_sms) {
      int dev = 0;
      if (cudaGetDevice(&dev) != cudaSuccess ||
          cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n_sms <= 0)
        n_sms = 132;
    }
    // Blocks per SM: 4 where shared memory allows (227 KB per SM), at least 1.
    const int64_t per_sm = std::max<int64_t>(1, std::min<int64_t>(4, (int64_t)(220u << 10) / (int64_t)smem));
    const int64_t blocks = std::min<int64_t>(tiles, per_sm * n_sms);
    gemv_kquant_kernel<T, NMAX, R, U, true><<<(unsigned)blocks, kKqThreads, smem, stream>>>(a);
  } else {
    gemv_kquant_kernel<T, NMAX, R, U, false><<<(unsigned)tiles, kKqThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

// Tile per n: R rows per warp (each x value loaded serves R rows), U units in flight per row; fewer rows
// per warp on small matrices (k / v projections) so that the grid covers the SMs.
int g_tile = 0;  // set_kquant_tile

template <GgmlType T>
cudaError_t dispatch_kq(const KqArgs& a, cudaStream_t stream) {
  const bool small = a.rows < 4096;
  if (a.n == 1) switch (g_tile) {
      case 11:
        return launch_kq<T, 1, 1, 1>(a, stream);
      case 12:
        return launch_kq<T, 1, 1, 2>(a, stream);
      case 14:
        return launch_kq<T, 1, 1, 4>(a, stream);
      case 21:
        return launch_kq<T, 1, 2, 1>(a, stream);
      case 22:
        return launch_kq<T, 1, 2, 2>(a, stream);
      case 24:
        return launch_kq<T, 1, 2, 4>(a, stream);
      case 41:
        return launch_kq<T, 1, 4, 1>(a, stream);
      case 42:
        return launch_kq<T, 1, 4, 2>(a, stream);
      default:
        break;
    }
  if (a.n == 1) return small ? launch_kq<T, 1, 1, 4>(a, stream) : launch_kq<T, 1, 2, 2>(a, stream);
  if (a.n == 2) return small ? launch_kq<T, 2, 1, 4>(a, stream) : launch_kq<T, 2, 2, 2>(a, stream);
  if (a.n <= 4) return small ? launch_kq<T, 4, 1, 2>(a, stream) : launch_kq<T, 4, 2, 2>(a, stream);
  return small ? launch_kq<T, 8, 1, 2>(a, stream) : launch_kq<T, 8, 2, 1>(a, stream);
}

// f(std::integral_constant<GgmlType, t>) for the block type t (Q6_K for any other).
template <class F>
cudaError_t kq_switch(GgmlType t, F&& f) {
  switch (t) {
    case GgmlType::Q4_0:
      return f(std::integral_constant<GgmlType, GgmlType::Q4_0>{});
    case GgmlType::Q4_1:
      return f(std::integral_constant<GgmlType, GgmlType::Q4_1>{});
    case GgmlType::Q5_0:
      return f(std::integral_constant<GgmlType, GgmlType::Q5_0>{});
    case GgmlType::Q5_1:
      return f(std::integral_constant<GgmlType, GgmlType::Q5_1>{});
    case GgmlType::Q4_K:
      return f(std::integral_constant<GgmlType, GgmlType::Q4_K>{});
    case GgmlType::Q5_K:
      return f(std::integral_constant<GgmlType, GgmlType::Q5_K>{});
    default:
      return f(std::integral_constant<GgmlType, GgmlType::Q6_K>{});
  }
}

bool kquant_view_ok(const WeightView& w) {
  const size_t rb = kquant_row_bytes(w.type, w.cols);
  return rb && w.rows > 0 && w.cols <= 0x7fffffff && w.data && aligned16(w.data) && w.row_bytes >= rb &&
         w.row_bytes % 16 == 0 && w.rows <= (int64_t)0x7fffffff * kKqWarps;
}

// ---- The GEMV with int8 activations (gemv_kquant_q8)
//
// x quantised per 32 columns (kq_quantize_x_kernel, one warp per block of 32: the CPU's quantize_x_q8_ref,
// d = max |x| / 127, q = x * (127 / max |x|) rounded to nearest even) into the workspace: xq [n, cols] int8,
// then xm [n, cols / 16] of (d as bits, sum of the 16 q). The GEMV (launched programmatically: its first
// weight loads are issued before it waits for the quantisation) copies xq and xm into shared memory in the
// lanes' unit order (kq_locate, 16 columns per 16-byte chunk), then per unit, group and row of x: four
// dp4a give dot = sum code * q exactly, and the group adds d * (a * (dot - K * s) + b * s), K the code
// offset and s the group's sum of q.

constexpr size_t kKqQ8MaxSmem = 200u << 10;  // shared memory of the int8 GEMV: n * cols * 1.5 bytes
int g_int8 = -1;                             // set_kquant_int8; -1: kernel_tuning().kq_int8

__global__ void __launch_bounds__(256) kq_quantize_x_kernel(const float* __restrict__ x, int64_t cols, int n,
                                                            int8_t* __restrict__ xq, int2* __restrict__ xm) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const int64_t blocks = cols / 32;
  const int64_t gw = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
  if (gw >= (int64_t)n * blocks) return;
  const int64_t t = gw / blocks, b = gw - t * blocks;
  const float v = __ldcg(x + t * cols + 32 * b + lane);
  const float m = warp_max(fabsf(v));
  const float d = m / 127.0f;
  const float id = m > 0.0f ? 127.0f / m : 0.0f;
  const int q = __float2int_rn(v * id);
  xq[t * cols + 32 * b + lane] = (int8_t)q;
  int s = q;
#pragma unroll
  for (int o = 1; o < 16; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((lane & 15) == 0) xm[t * (cols / 16) + 2 * b + (lane >> 4)] = make_int2(__float_as_int(d), s);
}

template <GgmlType T, int NMAX, int R, int U>
__global__ void __launch_bounds__(kKqThreads)
    gemv_kquant_q8_kernel(KqArgs a, const int8_t* __restrict__ xq, const int2* __restrict__ xm) {
  extern __shared__ float4 xs_mem[];             // (the staged kernel's declaration: one type per name)
  uint4* xs = reinterpret_cast<uint4*>(xs_mem);  // [n][2][n_units] chunks of xq, then xms
  const int lane = threadIdx.x & 31;
  const int n_units = kq_units(a.cols);
  int2* xms = reinterpret_cast<int2*>(xs + (size_t)a.n * 2 * n_units);  // [n][2][n_units] (d, s)
  const int64_t row0 = ((int64_t)blockIdx.x * kKqWarps + (threadIdx.x >> 5)) * R;
  const bool live = row0 < a.rows;
  const uint8_t* wrow[R];  // the warp's rows (row0 again for rows past the end: loaded, never stored)
#pragma unroll
  for (int j = 0; j < R; ++j) wrow[j] = a.w + (row0 + j < a.rows ? row0 + j : row0) * a.row_bytes;
  KqUnit u[U][R];
  const auto load = [&](int k0) {
#pragma unroll
    for (int v = 0; v < U; ++v)
#pragma unroll
      for (int j = 0; j < R; ++j)
        if (k0 + 32 * v < n_units) u[v][j] = kq_load<T>(wrow[j], a.cols, k0 + 32 * v);
  };
  if (live) load(lane);  // the weights do not depend on the kernels before
  pdl_wait();
  const int chunks = (int)(a.cols / 16);
  for (int i = threadIdx.x; i < a.n * chunks; i += kKqThreads) {
    const int t = i / chunks, c = (i - t * chunks) * 16;
    int k, g, e;
    kq_locate<T>(c, &k, &g, &e);
    const int dst = (t * 2 + g) * n_units + k;
    xs[dst] = __ldcg(reinterpret_cast<const uint4*>(xq + (int64_t)t * a.cols + c));
    xms[dst] = __ldcg(xm + (int64_t)t * chunks + c / 16);
  }
  __syncthreads();
  pdl_trigger();
  if (!live) return;

  float acc[R][NMAX];
#pragma unroll
  for (int j = 0; j < R; ++j)
#pragma unroll
    for (int t = 0; t < NMAX; ++t) acc[j][t] = 0.0f;
  constexpr int K = kq_offset<T>();
  for (int k0 = lane; k0 < n_units; k0 += 32 * U) {
    if (k0 != lane) load(k0);
#pragma unroll
    for (int v = 0; v < U; ++v) {
      const int k = k0 + 32 * v;
      if (k >= n_units) break;
      uint32_t w[R][2][4];
      float sa[R][2], sb[R][2];
#pragma unroll
      for (int j = 0; j < R; ++j) kq_words<T>(u[v][j], k, w[j][0], w[j][1], sa[j], sb[j]);
#pragma unroll
      for (int t = 0; t < NMAX; ++t) {
        if (t >= a.n) break;
#pragma unroll
        for (int g = 0; g < 2; ++g) {
          const uint4 xv = xs[(t * 2 + g) * n_units + k];
          const int2 m = xms[(t * 2 + g) * n_units + k];
          const float d = __int_as_float(m.x);
#pragma unroll
          for (int j = 0; j < R; ++j) {
            int dot = __dp4a((int)w[j][g][0], (int)xv.x, 0);
            dot = __dp4a((int)w[j][g][1], (int)xv.y, dot);
            dot = __dp4a((int)w[j][g][2], (int)xv.z, dot);
            dot = __dp4a((int)w[j][g][3], (int)xv.w, dot);
            float r = sa[j][g] * (float)(dot - K * m.y);
            if constexpr (kq_has_min(T)) r = fmaf(sb[j][g], (float)m.y, r);
            acc[j][t] = fmaf(d, r, acc[j][t]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < R; ++j)
#pragma unroll
    for (int t = 0; t < NMAX; ++t) {
      if (t >= a.n) break;
      const float v = warp_sum(acc[j][t]);
      if (lane == ((j * NMAX + t) & 31) && row0 + j < a.rows) {
        const int64_t r = row0 + j;
        float s = v;
        if (a.bias) s += a.bias[r];
        float* yp = a.y + (int64_t)t * a.rows + r;
        *yp = a.accumulate ? __ldcg(yp) + s : s;
      }
    }
}

size_t kq8_smem(int n, int64_t cols) {
  return (size_t)n * (size_t)cols / 16 * (16 + 8);
}

template <GgmlType T, int NMAX, int R, int U>
cudaError_t launch_kq8(const KqArgs& a, const int8_t* xq, const int2* xm, cudaStream_t stream) {
  const size_t smem = kq8_smem(a.n, a.cols);
  static const cudaError_t attr = cudaFuncSetAttribute(
      gemv_kquant_q8_kernel<T, NMAX, R, U>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kKqQ8MaxSmem);
  if (attr != cudaSuccess) return attr;
  const int64_t rows_per_block = (int64_t)R * kKqWarps;
  const int64_t tiles = (a.rows + rows_per_block - 1) / rows_per_block;
  return launch_ex(gemv_kquant_q8_kernel<T, NMAX, R, U>, dim3((unsigned)tiles), dim3(kKqThreads), smem,
                   stream, 1, kPdlCore, a, xq, xm);
}

template <GgmlType T>
cudaError_t dispatch_kq8(const KqArgs& a, const int8_t* xq, const int2* xm, cudaStream_t stream) {
  const bool small = a.rows < 4096;
  if (a.n == 1) switch (g_tile) {
      case 11:
        return launch_kq8<T, 1, 1, 1>(a, xq, xm, stream);
      case 12:
        return launch_kq8<T, 1, 1, 2>(a, xq, xm, stream);
      case 14:
        return launch_kq8<T, 1, 1, 4>(a, xq, xm, stream);
      case 21:
        return launch_kq8<T, 1, 2, 1>(a, xq, xm, stream);
      case 22:
        return launch_kq8<T, 1, 2, 2>(a, xq, xm, stream);
      case 24:
        return launch_kq8<T, 1, 2, 4>(a, xq, xm, stream);
      case 41:
        return launch_kq8<T, 1, 4, 1>(a, xq, xm, stream);
      case 42:
        return launch_kq8<T, 1, 4, 2>(a, xq, xm, stream);
      default:
        break;
    }
  if (a.n == 1)
    return small ? launch_kq8<T, 1, 1, 4>(a, xq, xm, stream) : launch_kq8<T, 1, 2, 2>(a, xq, xm, stream);
  if (a.n == 2)
    return small ? launch_kq8<T, 2, 1, 4>(a, xq, xm, stream) : launch_kq8<T, 2, 2, 2>(a, xq, xm, stream);
  if (a.n <= 4)
    return small ? launch_kq8<T, 4, 1, 2>(a, xq, xm, stream) : launch_kq8<T, 4, 2, 2>(a, xq, xm, stream);
  return small ? launch_kq8<T, 8, 1, 2>(a, xq, xm, stream) : launch_kq8<T, 8, 2, 1>(a, xq, xm, stream);
}

// ---- BF16 dequantisation

template <GgmlType T>
__global__ void __launch_bounds__(256) kquant_dequant_kernel(WeightView w, __nv_bfloat16* out, int64_t ld) {
  const int n_units = kq_units(w.cols);
  const int64_t total = w.rows * n_units;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / n_units;
    const int k = (int)(i - r * n_units);
    float f[2][16];
    kq_decode<T>(kq_load<T>(static_cast<const uint8_t*>(w.data) + r * (int64_t)w.row_bytes, w.cols, k), k, f);
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      uint4 p0, p1;
      p0.x = pack_bf16x2(f[g][0], f[g][1]), p0.y = pack_bf16x2(f[g][2], f[g][3]);
      p0.z = pack_bf16x2(f[g][4], f[g][5]), p0.w = pack_bf16x2(f[g][6], f[g][7]);
      p1.x = pack_bf16x2(f[g][8], f[g][9]), p1.y = pack_bf16x2(f[g][10], f[g][11]);
      p1.z = pack_bf16x2(f[g][12], f[g][13]), p1.w = pack_bf16x2(f[g][14], f[g][15]);
      uint4* o = reinterpret_cast<uint4*>(out + r * ld + kq_col<T>(k, g));
      o[0] = p0;
      o[1] = p1;
    }
  }
}

}  // namespace

void set_kquant_tile(int ru) {
  g_tile = ru;
}

void set_kquant_stage(int on) {
  g_stage = on;
}

cudaError_t gemv_kquant(const WeightView& w, const float* x, int n, float* y, const float* bias,
                        bool accumulate, cudaStream_t stream) {
  if (n < 1 || n > kGemvMaxRows || !x || !y || !kquant_view_ok(w)) return cudaErrorInvalidValue;
  KqArgs a{};
  a.w = static_cast<const uint8_t*>(w.data);
  a.rows = w.rows;
  a.cols = w.cols;
  a.row_bytes = (int64_t)w.row_bytes;
  a.bias = bias;
  a.accumulate = accumulate;
  a.x_vec = aligned16(x);
  for (int t0 = 0; t0 < n; t0 += kKqMaxN) {  // launches of up to 8 rows of x
    a.x = x + (int64_t)t0 * w.cols;
    a.y = y + (int64_t)t0 * w.rows;
    a.n = n - t0 < kKqMaxN ? n - t0 : kKqMaxN;
    const cudaError_t e =
        kq_switch(w.type, [&](auto type) { return dispatch_kq<decltype(type)::value>(a, stream); });
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

void set_kquant_int8(int on) {
  g_int8 = on;
}

bool kquant_int8_on() {
  return g_int8 >= 0 ? g_int8 != 0 : kernel_tuning().kq_int8;
}

size_t kquant_q8_ws_bytes(int n, int64_t cols) {
  const size_t q = ((size_t)n * (size_t)cols + 255) / 256 * 256;
  return q + (size_t)n * (size_t)(cols / 16) * sizeof(int2);
}

bool kquant_q8_ok(const WeightView& w, int n) {
  return n >= 1 && n <= kKqMaxN && kquant_view_ok(w) && kq8_smem(n, w.cols) <= kKqQ8MaxSmem;
}

cudaError_t gemv_kquant_q8(const WeightView& w, const float* x, int n, float* y, const float* bias,
                           bool accumulate, void* ws, size_t ws_bytes, cudaStream_t stream) {
  if (!x || !y || !ws || !aligned16(ws) || !kquant_q8_ok(w, n) || ws_bytes < kquant_q8_ws_bytes(n, w.cols))
    return cudaErrorInvalidValue;
  int8_t* xq = static_cast<int8_t*>(ws);
  int2* xm = reinterpret_cast<int2*>(xq + ((size_t)n * (size_t)w.cols + 255) / 256 * 256);
  const int64_t warps = (int64_t)n * (w.cols / 32);
  if (cudaError_t e = launch_ex(kq_quantize_x_kernel, dim3((unsigned)((warps + 7) / 8)), dim3(256), 0, stream,
                                1, kPdlCore, x, (int64_t)w.cols, n, xq, xm);
      e != cudaSuccess)
    return e;
  KqArgs a{};
  a.w = static_cast<const uint8_t*>(w.data);
  a.rows = w.rows;
  a.cols = w.cols;
  a.row_bytes = (int64_t)w.row_bytes;
  a.bias = bias;
  a.accumulate = accumulate;
  a.x = x;
  a.n = n;
  a.y = y;
  return kq_switch(w.type, [&](auto type) { return dispatch_kq8<decltype(type)::value>(a, xq, xm, stream); });
}

cudaError_t kquant_dequant_bf16(const WeightView& w, void* out, cudaStream_t stream) {
  if (!kquant_view_ok(w) || !out || !aligned16(out)) return cudaErrorInvalidValue;
  const int64_t ld = lowbit_bf16_ld(w.cols);
  const int64_t units = w.rows * (w.cols / 32);
  const int64_t blocks = (units + 255) / 256;
  __nv_bfloat16* o = static_cast<__nv_bfloat16*>(out);
  const unsigned grid = (unsigned)(blocks < 65536 ? blocks : 65536);
  return kq_switch(w.type, [&](auto type) {
    kquant_dequant_kernel<decltype(type)::value><<<grid, 256, 0, stream>>>(w, o, ld);
    return cudaGetLastError();
  });
}

}  // namespace ultra::cuda
