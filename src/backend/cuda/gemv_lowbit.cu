// Low-bit weights (Q8_0, F8_E4M3, TERNARY) on the device: the host repacking into the device layout, the
// decode GEMV and the BF16 dequantisation for the prefill GEMM (gemv_lowbit.h).
//
// GEMV (1 <= n <= 32 rows of x). A warp owns R consecutive weight rows; its lanes take the rows' 16-byte
// chunks in turn (lane l: chunks l, l + 32, ...; a chunk is 16 Q8_0 / F8_E4M3 codes or 64 trits), so each
// warp-wide load instruction reads 512 contiguous bytes of a row. U chunks of each of the R rows (U * R
// 16-byte streaming loads per lane, ld.global.nc without L1 allocation) are issued before any is used. A
// chunk is decoded in registers 16 columns at a time (lowbit.cuh: a byte permute and an add per Q8_0 code,
// shifts, an and-or and a multiply per E4M3 code, about three integer / float ops per trit), then each of
// the n rows of x (16 floats through L1, float4 loads where aligned) is multiplied into a per-16-column
// partial sum that is scaled and added into the f32 accumulators acc[R][n]: every weight is read once for
// all n rows, and the decoding is shared by them. The lanes' sums are added by a butterfly of warp shuffles
// (fixed order: deterministic). R and U shrink as n grows (registers: acc is R x NMAX); see dispatch_lb.
//
// Expected speed (H200, not yet measured; op counts from the PTX of the n = 1 kernels per 16 weights): a
// Q8_0 weight costs ~3.3 ops (prmt, add, fma; an xor per 4), an E4M3 weight ~5 (shift / and / or, the 2^120
// multiply, fma), below the ~7 ops per byte that the SIMT units sustain at the HBM rate (128 lane-ops per
// clock and SM), so both should stream near the read bandwidth; a ternary weight costs ~4.5 ops at 4 weights
// per byte, so it is compute-bound at roughly 40% of the read bandwidth (still about half the time of Q8_0
// for the same matrix). For n > ~4
// all three are bound by the n FMAs per weight on the SIMT units (a tensor-core variant, the weights
// converted to BF16 in registers as gemv.cu's bf16x3 flavour, is the next step).
//
// Dequantisation: one thread per 16 columns of a row (one 16-byte chunk of codes, or one ternary word),
// two 16-byte stores of BF16.
#include <cstdlib>
#include <cstring>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/lowbit.cuh"
#include "backend/cuda/tuning.h"
#include "core/dtype.h"

namespace ultra::cuda {

using namespace detail;

// ---- host: layout

size_t lowbit_row_bytes(GgmlType t, int64_t cols) {
  if (cols <= 0) return 0;
  auto up16 = [](int64_t b) { return (size_t)((b + 15) / 16 * 16); };
  switch (t) {
    case GgmlType::Q8_0:
      return cols % kQ8_0Block == 0 ? up16(cols + 2 * (cols / kQ8_0Block)) : 0;
    case GgmlType::F8_E4M3:
      return up16(cols);
    case GgmlType::TERNARY:
      return cols % 16 == 0 ? up16(cols / 4) : 0;
    default:
      return kquant_row_bytes(t, cols);
  }
}

int64_t lowbit_scale_count(const WeightView& w) {
  if (w.type != GgmlType::F8_E4M3 && w.type != GgmlType::TERNARY) return 0;
  return w.scale_row_stride ? w.rows * w.scale_row_stride : 1;
}

bool lowbit_pack_rows(const WeightView& w, int64_t r0, int64_t r1, void* out) {
  if (is_kquant(w.type)) return kquant_pack_rows(w, r0, r1, out);
  const size_t rb = lowbit_row_bytes(w.type, w.cols);
  if (!rb || !w.data || r0 < 0 || r1 > w.rows || r0 > r1) return false;
  uint8_t* o = static_cast<uint8_t*>(out);
  for (int64_t r = r0; r < r1; ++r, o += rb) {
    std::memset(o, 0, rb);
    const uint8_t* src = static_cast<const uint8_t*>(w.data) + r * w.row_bytes;
    switch (w.type) {
      case GgmlType::Q8_0: {  // [cols / 32] blocks of (f16 d, int8 qs[32]) -> qs..., d...
        const int64_t nb = w.cols / kQ8_0Block;
        for (int64_t b = 0; b < nb; ++b) {
          BlockQ8_0 blk;
          std::memcpy(&blk, src + b * sizeof(BlockQ8_0), sizeof blk);
          std::memcpy(o + b * kQ8_0Block, blk.qs, kQ8_0Block);
          std::memcpy(o + w.cols + 2 * b, &blk.d, 2);
        }
        break;
      }
      case GgmlType::F8_E4M3:
        std::memcpy(o, src, (size_t)w.cols);
        break;
      default:  // TERNARY
        std::memcpy(o, src, (size_t)(w.cols / 4));
        break;
    }
  }
  return true;
}

namespace {

// ---- the GEMV

constexpr int kLbWarps = 4;
constexpr int kLbThreads = kLbWarps * 32;

struct LbArgs {
  const uint8_t* w;  // [rows, row_bytes] device layout
  int64_t rows, cols, row_bytes;
  const float* scale;  // F8_E4M3 / TERNARY: [rows * scale_row_stride] or [1]
  int64_t scale_group, scale_row_stride;
  const float* x;  // [n, cols]
  int n;
  float* y;           // [n, rows]
  const float* bias;  // [rows] or null
  bool accumulate;
  bool x_vec;       // cols % 4 == 0 and x 16-byte aligned: x read as float4
  bool elem_scale;  // F8_E4M3 whose scale groups a 16-column group can straddle: scale per element
  int g_shift;      // scale group of column c: c >> g_shift (31 when one group spans the row), or -1: c / G
};

// Scale group of column c (no 64-bit division in the loop: a shift for power-of-two groups and whole rows).
__device__ __forceinline__ int scale_index(const LbArgs& a, int64_t c) {
  return a.g_shift >= 0 ? (int)((int)c >> a.g_shift) : (int)c / (int)a.scale_group;
}

// x[t, c0 .. c0 + 16) (zeros past cols).
__device__ __forceinline__ void load_x16(const LbArgs& a, int t, int64_t c0, float (&xf)[16]) {
  const float* xp = a.x + (int64_t)t * a.cols + c0;
  if (a.x_vec && c0 + 16 <= a.cols) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(xp) + q);
      xf[4 * q] = v.x, xf[4 * q + 1] = v.y, xf[4 * q + 2] = v.z, xf[4 * q + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int e = 0; e < 16; ++e) xf[e] = c0 + e < a.cols ? __ldg(xp + e) : 0.0f;
  }
}

// acc[j][t] += s[j] * sum_e wf[j][e] x[t, c0 + e] for the n rows of x.
template <int NMAX, int R>
__device__ __forceinline__ void fma_group(const LbArgs& a, int64_t c0, const float (&wf)[R][16],
                                          const float (&s)[R], float (&acc)[R][NMAX]) {
#pragma unroll
  for (int t = 0; t < NMAX; ++t) {
    if (t >= a.n) break;
    float xf[16];
    load_x16(a, t, c0, xf);
#pragma unroll
    for (int j = 0; j < R; ++j) {
      float p = 0.0f;
#pragma unroll
      for (int e = 0; e < 16; ++e) p = fmaf(wf[j][e], xf[e], p);
      acc[j][t] = fmaf(p, s[j], acc[j][t]);
    }
  }
}

// One 16-byte chunk k of each of the R rows (wv[j]), into acc.
template <GgmlType T, int NMAX, int R>
__device__ __forceinline__ void lb_chunk(const LbArgs& a, const uint4 (&wv)[R],
                                         const uint8_t* const (&wrow)[R], const float* const (&srow)[R],
                                         int64_t k, float (&acc)[R][NMAX]) {
  float wf[R][16];
  float s[R];
  if constexpr (T == GgmlType::TERNARY) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {  // word q: columns c0 .. c0 + 16
      const int64_t c0 = 64 * k + 16 * q;
      if (c0 >= a.cols) break;
#pragma unroll
      for (int j = 0; j < R; ++j) {
        const uint32_t word = q == 0 ? wv[j].x : q == 1 ? wv[j].y : q == 2 ? wv[j].z : wv[j].w;
        decode16_ternary(word, wf[j]);
        s[j] = __ldg(srow[j] + scale_index(a, c0));
      }
      fma_group<NMAX, R>(a, c0, wf, s, acc);
    }
  } else {
    const int64_t c0 = 16 * k;
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const uint32_t ws[4] = {wv[j].x, wv[j].y, wv[j].z, wv[j].w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        float f[4];
        if constexpr (T == GgmlType::Q8_0)
          decode4_q8(ws[q], f);
        else
          decode4_fp8(ws[q], f);
#pragma unroll
        for (int e = 0; e < 4; ++e) wf[j][4 * q + e] = f[e];
      }
      if constexpr (T == GgmlType::Q8_0) {
        const uint16_t d = __ldg(reinterpret_cast<const unsigned short*>(wrow[j] + a.cols) + (k >> 1));
        s[j] = __half2float(__ushort_as_half(d));
      } else {
        if (!a.elem_scale) {
          s[j] = __ldg(srow[j] + scale_index(a, c0));
        } else {  // the scale of each column (zero weights past cols need none)
#pragma unroll
          for (int e = 0; e < 16; ++e)
            if (c0 + e < a.cols) wf[j][e] *= __ldg(srow[j] + scale_index(a, c0 + e));
          s[j] = 1.0f;
        }
      }
    }
    fma_group<NMAX, R>(a, c0, wf, s, acc);
  }
}

template <GgmlType T, int NMAX, int R, int U>
__global__ void __launch_bounds__(kLbThreads) gemv_lowbit_kernel(LbArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t row0 = ((int64_t)blockIdx.x * kLbWarps + (threadIdx.x >> 5)) * R;
  if (row0 >= a.rows) return;  // the whole warp
  constexpr int kChunkElems = T == GgmlType::TERNARY ? 64 : 16;
  const int64_t n_chunks = (a.cols + kChunkElems - 1) / kChunkElems;
  const uint8_t* wrow[R];  // the warp's rows (row0 again for rows past the end: loaded, never stored)
  const float* srow[R];    // their scales (F8_E4M3 / TERNARY)
#pragma unroll
  for (int j = 0; j < R; ++j) {
    const int64_t r = row0 + j < a.rows ? row0 + j : row0;
    wrow[j] = a.w + r * a.row_bytes;
    srow[j] = a.scale + r * a.scale_row_stride;
  }
  float acc[R][NMAX];
#pragma unroll
  for (int j = 0; j < R; ++j)
#pragma unroll
    for (int t = 0; t < NMAX; ++t) acc[j][t] = 0.0f;

  for (int64_t k0 = lane; k0 < n_chunks; k0 += 32 * U) {
    uint4 wv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < R; ++j)
        wv[u][j] =
            k0 + 32 * u < n_chunks ? ld_stream16(wrow[j] + 16 * (k0 + 32 * u)) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (k0 + 32 * u < n_chunks) lb_chunk<T, NMAX, R>(a, wv[u], wrow, srow, k0 + 32 * u, acc);
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

template <GgmlType T, int NMAX, int R, int U>
cudaError_t launch_lb(const LbArgs& a, cudaStream_t stream) {
  const int64_t rows_per_block = (int64_t)R * kLbWarps;
  const int64_t blocks = (a.rows + rows_per_block - 1) / rows_per_block;
  return launch_ex(gemv_lowbit_kernel<T, NMAX, R, U>, dim3((unsigned)blocks), dim3(kLbThreads), 0, stream, 1,
                   0, a);
}

// Tile per n (not tuned on hardware yet): R rows per warp and U chunks in flight per row. x comes from L1
// (32 floats per clock and SM, a quarter of the FMA rate), so each x value loaded serves R rows: R = 4 at
// n <= 8 and 2 above where the grid still has >= 1024 warps; on smaller matrices (k / v projections) fewer
// rows per warp so that the grid covers the SMs.
// ULTRA_CUDA_LB_TILE=RU (kernel_tuning().lb_tile; timing experiments; e.g. 24: R = 2, U = 4) sets the
// one-row tile of every shape.
int lb_tile_override() {
  return kernel_tuning().lb_tile;
}

template <GgmlType T>
cudaError_t dispatch_lb(const LbArgs& a, cudaStream_t stream) {
  const bool small = a.rows < 4096;
  if (a.n == 1) switch (lb_tile_override()) {
      case 14:
        return launch_lb<T, 1, 1, 4>(a, stream);
      case 18:
        return launch_lb<T, 1, 1, 8>(a, stream);
      case 24:
        return launch_lb<T, 1, 2, 4>(a, stream);
      case 28:
        return launch_lb<T, 1, 2, 8>(a, stream);
      case 42:
        return launch_lb<T, 1, 4, 2>(a, stream);
      case 44:
        return launch_lb<T, 1, 4, 4>(a, stream);
      default:
        break;
    }
  // F8_E4M3 (its decode costs the most ops per byte) on 4096..8192 rows: 2 rows x 4 chunks per lane
  // (faster there, slower on 1024 and >= 14336 rows and for Q8_0 / TERNARY, where 4 x 2 / 1 x 4 stay:
  // docs/CUDA.md, "Tuning switches").
  if (a.n == 1 && T == GgmlType::F8_E4M3 && a.rows >= 4096 && a.rows <= 8192)
    return launch_lb<T, 1, 2, 4>(a, stream);
  if (a.n == 1) return small ? launch_lb<T, 1, 1, 4>(a, stream) : launch_lb<T, 1, 4, 2>(a, stream);
  if (a.n == 2) return small ? launch_lb<T, 2, 1, 4>(a, stream) : launch_lb<T, 2, 4, 2>(a, stream);
  if (a.n <= 4) return small ? launch_lb<T, 4, 2, 2>(a, stream) : launch_lb<T, 4, 4, 2>(a, stream);
  if (a.n <= 8) return small ? launch_lb<T, 8, 2, 1>(a, stream) : launch_lb<T, 8, 4, 1>(a, stream);
  if (a.n <= 16) return small ? launch_lb<T, 16, 1, 2>(a, stream) : launch_lb<T, 16, 2, 1>(a, stream);
  return small ? launch_lb<T, 32, 1, 1>(a, stream) : launch_lb<T, 32, 2, 1>(a, stream);
}

// Host checks of a device-layout view: the row size and alignment the kernels assume, the scales.
bool lowbit_view_ok(const WeightView& w) {
  const size_t rb = lowbit_row_bytes(w.type, w.cols);
  if (!rb || w.rows <= 0 || w.cols > 0x7fffffff || !w.data || !aligned16(w.data) || w.row_bytes < rb ||
      w.row_bytes % 16 != 0)
    return false;
  if (w.type == GgmlType::Q8_0) return true;
  if (!w.scale || w.scale_group <= 0 || w.scale_row_stride < 0) return false;
  if (w.scale_row_stride != 0 && w.scale_row_stride < (w.cols + w.scale_group - 1) / w.scale_group)
    return false;
  if (w.type == GgmlType::TERNARY && (w.scale_group % 16 != 0 || w.cols % w.scale_group != 0)) return false;
  return true;
}

// ---- BF16 dequantisation

__global__ void __launch_bounds__(256) dequant_bf16_kernel(WeightView w, __nv_bfloat16* out, int64_t ld) {
  const int64_t gpr = (ld + 15) / 16;  // 16-column groups per row
  const int64_t total = w.rows * gpr;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / gpr, c0 = (i - r * gpr) * 16;
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * (int64_t)w.row_bytes;
    float f[16];
    if (c0 + 16 <= w.cols) {
      if (w.type == GgmlType::TERNARY) {
        decode16_ternary(__ldg(reinterpret_cast<const uint32_t*>(row) + c0 / 16), f);
        const float s = w.scale[r * w.scale_row_stride + c0 / w.scale_group];
#pragma unroll
        for (int e = 0; e < 16; ++e) f[e] *= s;
      } else {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(row + c0));
        const uint32_t ws[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          float g[4];
          if (w.type == GgmlType::Q8_0)
            decode4_q8(ws[q], g);
          else
            decode4_fp8(ws[q], g);
#pragma unroll
          for (int e = 0; e < 4; ++e) f[4 * q + e] = g[e];
        }
        if (w.type == GgmlType::Q8_0) {
          const float d = __half2float(
              __ushort_as_half(__ldg(reinterpret_cast<const unsigned short*>(row + w.cols) + c0 / 32)));
#pragma unroll
          for (int e = 0; e < 16; ++e) f[e] *= d;
        } else {
          const float* sr = w.scale + r * w.scale_row_stride;
#pragma unroll
          for (int e = 0; e < 16; ++e) f[e] *= __ldg(sr + (c0 + e) / w.scale_group);
        }
      }
    } else {
#pragma unroll
      for (int e = 0; e < 16; ++e) f[e] = c0 + e < w.cols ? lowbit_elem(w, r, c0 + e) : 0.0f;
    }
    __nv_bfloat16* o = out + r * ld + c0;
    if (c0 + 16 <= ld) {
      uint4 p0, p1;
      p0.x = pack_bf16x2(f[0], f[1]), p0.y = pack_bf16x2(f[2], f[3]);
      p0.z = pack_bf16x2(f[4], f[5]), p0.w = pack_bf16x2(f[6], f[7]);
      p1.x = pack_bf16x2(f[8], f[9]), p1.y = pack_bf16x2(f[10], f[11]);
      p1.z = pack_bf16x2(f[12], f[13]), p1.w = pack_bf16x2(f[14], f[15]);
      reinterpret_cast<uint4*>(o)[0] = p0;
      reinterpret_cast<uint4*>(o)[1] = p1;
    } else {
      for (int e = 0; c0 + e < ld; ++e) o[e] = __float2bfloat16_rn(f[e]);
    }
  }
}

}  // namespace

cudaError_t gemv_lowbit(const WeightView& w, const float* x, int n, float* y, const float* bias,
                        bool accumulate, cudaStream_t stream) {
  if (is_kquant(w.type)) return gemv_kquant(w, x, n, y, bias, accumulate, stream);
  if (n < 1 || n > kGemvMaxRows || !x || !y || !lowbit_view_ok(w) || w.rows > (int64_t)0x7fffffff * kLbWarps)
    return cudaErrorInvalidValue;
  LbArgs a{};
  a.w = static_cast<const uint8_t*>(w.data);
  a.rows = w.rows;
  a.cols = w.cols;
  a.row_bytes = (int64_t)w.row_bytes;
  a.scale = w.scale;
  a.scale_group = w.scale_group > 0 ? w.scale_group : w.cols;
  a.scale_row_stride = w.scale_row_stride;
  a.x = x;
  a.n = n;
  a.y = y;
  a.bias = bias;
  a.accumulate = accumulate;
  a.x_vec = w.cols % 4 == 0 && aligned16(x);
  a.elem_scale = w.type == GgmlType::F8_E4M3 && a.scale_group < w.cols && a.scale_group % 16 != 0;
  a.g_shift = -1;
  if (a.scale_group >= w.cols) {
    a.g_shift = 31;
  } else if ((a.scale_group & (a.scale_group - 1)) == 0) {
    a.g_shift = 0;
    while ((int64_t(1) << a.g_shift) < a.scale_group) ++a.g_shift;
  }
  cudaError_t e;
  switch (w.type) {
    case GgmlType::Q8_0:
      e = dispatch_lb<GgmlType::Q8_0>(a, stream);
      break;
    case GgmlType::F8_E4M3:
      e = dispatch_lb<GgmlType::F8_E4M3>(a, stream);
      break;
    default:
      e = dispatch_lb<GgmlType::TERNARY>(a, stream);
      break;
  }
  return e != cudaSuccess ? e : cudaGetLastError();
}

cudaError_t lowbit_dequant_bf16(const WeightView& w, void* out, cudaStream_t stream) {
  if (is_kquant(w.type)) return kquant_dequant_bf16(w, out, stream);
  if (!lowbit_view_ok(w) || !out || !aligned16(out)) return cudaErrorInvalidValue;
  const int64_t ld = lowbit_bf16_ld(w.cols);
  const int64_t groups = w.rows * ((ld + 15) / 16);
  const int64_t blocks = (groups + 255) / 256;
  dequant_bf16_kernel<<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(
      w, static_cast<__nv_bfloat16*>(out), ld);
  return cudaGetLastError();
}

}  // namespace ultra::cuda
