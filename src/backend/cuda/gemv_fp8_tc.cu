// F8_E4M3 decode GEMV on the tensor cores: y[n, rows] = x[n, cols] . (W * s)^T (+ bias) (+= y), 1 <= n <= 8,
// one scale per row (or per tensor), cols % 64 == 0, n * cols <= 16384 (gemv_lowbit.h).
//
// Why: the SIMT kernel (gemv_lowbit.cu) pays ~5 integer / float ops per E4M3 weight for the decode in f32
// plus the FMA, which keeps it near 35-45% of the read bandwidth; converting codes with the hardware
// (cvt.rn.f16x2.e4m3x2, two codes per instruction, exact: every E4M3 value is an f16) and multiplying on the
// tensor cores leaves about half an instruction per weight on the SIMT side.
//
// Layout. A block (8 warps) owns T 16-row tiles (T = 1, 2, 4 or 8: as many as keep >= 1 block per SM, so
// that forming x, below, is paid once per T tiles); warp w works on tile w % T, and the 8 / T warps of a
// tile split its columns in steps of 64 (group c = w / T: steps c, c + 8 / T, ...). In a step, lane (g = lane
// / 4, t = lane % 4) loads 16 bytes of rows g and g + 8 at column 64 s + 16 t (streaming loads, U steps in
// flight). The dot product does not care which k slot of an MMA holds which column, as long as A (weights)
// and B (x) agree: MMA kk (0..3) of the step gives lane (g, t)'s k slots 2t, 2t + 1 the columns 64 s + 16 t +
// 4 kk + {0, 1} and slots 2t + 8, 2t + 9 the columns + {2, 3}, so a lane's 16 loaded bytes feed the four
// m16n8k16 MMAs of the step, and its B registers are 4 consecutive x values per MMA, read as 16-byte words
// from shared memory (lane's x row n = g; zero for g >= n).
//
// x in f16: the block forms x * 2^-e (e from the largest |x|, which lands in [2^13, 2^14)) as hi = f16(x')
// and lo = f16(x' - hi) in shared memory (22 significant bits; two MMAs per product), and the row sums are
// multiplied by 2^e and the row's scale at the end. The tensor cores' f32 accumulation is flushed into f32
// registers every U steps (long MMA accumulation chains lose accuracy), the 8 warps' partial sums are added
// in a fixed order (deterministic).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdlib>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace ultra::cuda {

using namespace detail;

namespace {

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kU = 4;              // steps of 64 columns in flight per warp
constexpr int kMaxXElems = 16384;  // n * cols: x's hi and lo parts take 4 bytes each in shared memory
constexpr int kMaxN = 8;           // the MMA's n
constexpr int kXPer = kMaxXElems / 4 / kThreads;  // float4 of x per thread at most

struct TcArgs {
  const uint8_t* w;  // [rows, row_bytes] device layout
  int64_t rows, row_bytes;
  int cols, n;
  const float* scale;  // [rows * scale_row_stride] (stride 0: [1])
  int64_t scale_row_stride;
  const float* x;  // [n, cols]
  float* y;        // [n, rows]
  const float* bias;
  bool accumulate;
  int tiles;  // T: 16-row tiles per block
};

__device__ __forceinline__ uint32_t e4m3x2_to_half2(uint32_t v16) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)v16, __NV_E4M3);
  return (uint32_t)h.x | ((uint32_t)h.y << 16);
}

__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__global__ void __launch_bounds__(kThreads) gemv_fp8_tc_kernel(TcArgs a) {
  extern __shared__ __align__(16) uint8_t sm[];
  __half* xh = reinterpret_cast<__half*>(sm);                        // [n, cols]
  __half* xl = xh + (size_t)a.n * a.cols;                            // [n, cols]
  float* red = reinterpret_cast<float*>(xl + (size_t)a.n * a.cols);  // [kWarps, 16, kMaxN]
  __shared__ float s_max[kWarps];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int tile = warp % a.tiles, group = warp / a.tiles, n_groups = kWarps / a.tiles;
  const int64_t row0 = ((int64_t)blockIdx.x * a.tiles + tile) * 16;
  const int64_t ra = row0 + g < a.rows ? row0 + g : a.rows - 1;  // rows past the end: loaded, not stored
  const int64_t rb = row0 + g + 8 < a.rows ? row0 + g + 8 : a.rows - 1;
  const uint8_t* wa = a.w + ra * a.row_bytes + 16 * t;
  const uint8_t* wb = a.w + rb * a.row_bytes + 16 * t;
  const int n_steps = a.cols / 64;

  // The first steps' weights before the wait (weights are never written by kernels).
  uint4 va[kU], vb[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const int s = group + n_groups * u;
    if (s < n_steps) {
      va[u] = ld_stream16(wa + 64 * s);
      vb[u] = ld_stream16(wb + 64 * s);
    }
  }
  pdl_trigger();
  pdl_wait();

  // x' = x * 2^-e in f16 hi / lo parts: x read once (float4, all loads issued before any is used: one L2
  // round trip), its largest |x| reduced, then converted from registers.
  const int nx4 = a.n * a.cols / 4;
  const float4* x4 = reinterpret_cast<const float4*>(a.x);
  float4 xv[kXPer];
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < kXPer; ++j) {
    const int i = tid + j * kThreads;
    xv[j] = i < nx4 ? __ldcg(x4 + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    m = fmaxf(m, fmaxf(fmaxf(fabsf(xv[j].x), fabsf(xv[j].y)), fmaxf(fabsf(xv[j].z), fabsf(xv[j].w))));
  }
  m = warp_max(m);
  if (lane == 0) s_max[warp] = m;
  __syncthreads();
  m = 0.0f;
#pragma unroll
  for (int i = 0; i < kWarps; ++i) m = fmaxf(m, s_max[i]);
  int e = 0;
  // m * 2^-e in [8192, 16384) (e >= -100: 2^-e stays finite); Inf / NaN: e = 0
  if (m > 0.0f && m <= 3.0e38f) frexpf(m / 16384.0f, &e);
  e = e < -100 ? -100 : e;
  const float down = ldexpf(1.0f, -e);
  auto split2 = [&](float u, float v, uint32_t& hi, uint32_t& lo) {
    u *= down, v *= down;
    const __half hu = __float2half_rn(u), hv = __float2half_rn(v);
    const __half lu = __float2half_rn(u - __half2float(hu)), lv = __float2half_rn(v - __half2float(hv));
    hi = (uint32_t)__half_as_ushort(hu) | ((uint32_t)__half_as_ushort(hv) << 16);
    lo = (uint32_t)__half_as_ushort(lu) | ((uint32_t)__half_as_ushort(lv) << 16);
  };
#pragma unroll
  for (int j = 0; j < kXPer; ++j) {
    const int i = tid + j * kThreads;
    if (i < nx4) {
      uint2 h, l;
      split2(xv[j].x, xv[j].y, h.x, l.x);
      split2(xv[j].z, xv[j].w, h.y, l.y);
      reinterpret_cast<uint2*>(xh)[i] = h;
      reinterpret_cast<uint2*>(xl)[i] = l;
    }
  }
  __syncthreads();

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // rows g, g (n = 2t, 2t + 1), g + 8, g + 8
  const bool has_x = g < a.n;
  const __half* xhr = xh + (size_t)(has_x ? g : 0) * a.cols + 16 * t;
  const __half* xlr = xl + (size_t)(has_x ? g : 0) * a.cols + 16 * t;
  for (int s0 = group; s0 < n_steps; s0 += n_groups * kU) {
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int s = s0 + n_groups * u;
      if (s >= n_steps) break;
      uint4 bh[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)}, bl[2] = {bh[0], bh[1]};
      if (has_x) {
        bh[0] = *reinterpret_cast<const uint4*>(xhr + 64 * s);
        bh[1] = *reinterpret_cast<const uint4*>(xhr + 64 * s + 8);
        bl[0] = *reinterpret_cast<const uint4*>(xlr + 64 * s);
        bl[1] = *reinterpret_cast<const uint4*>(xlr + 64 * s + 8);
      }
      const uint32_t wa4[4] = {va[u].x, va[u].y, va[u].z, va[u].w};
      const uint32_t wb4[4] = {vb[u].x, vb[u].y, vb[u].z, vb[u].w};
      // The loads of step s + n_groups * kU into this slot, before the MMAs of step s.
      const int sn = s + n_groups * kU;
      if (sn < n_steps) {
        va[u] = ld_stream16(wa + 64 * sn);
        vb[u] = ld_stream16(wb + 64 * sn);
      }
      const uint32_t h4[2][4] = {{bh[0].x, bh[0].y, bh[0].z, bh[0].w}, {bh[1].x, bh[1].y, bh[1].z, bh[1].w}};
      const uint32_t l4[2][4] = {{bl[0].x, bl[0].y, bl[0].z, bl[0].w}, {bl[1].x, bl[1].y, bl[1].z, bl[1].w}};
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint32_t af[4] = {e4m3x2_to_half2(wa4[kk] & 0xffffu), e4m3x2_to_half2(wb4[kk] & 0xffffu),
                                e4m3x2_to_half2(wa4[kk] >> 16), e4m3x2_to_half2(wb4[kk] >> 16)};
        // Columns 4 kk .. 4 kk + 3 of the lane's 16: x words 2 kk and 2 kk + 1 of its 8.
        const uint32_t hb0 = h4[kk >> 1][(2 * kk) & 3], hb1 = h4[kk >> 1][(2 * kk + 1) & 3];
        const uint32_t lb0 = l4[kk >> 1][(2 * kk) & 3], lb1 = l4[kk >> 1][(2 * kk + 1) & 3];
        mma_f16(d, af, hb0, hb1);
        mma_f16(d, af, lb0, lb1);
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] += d[i];
  }

  // The partial sums of each tile's warps, added in warp order.
  float* r = red + (size_t)warp * 16 * kMaxN;
  r[g * kMaxN + 2 * t] = acc[0];
  r[g * kMaxN + 2 * t + 1] = acc[1];
  r[(g + 8) * kMaxN + 2 * t] = acc[2];
  r[(g + 8) * kMaxN + 2 * t + 1] = acc[3];
  __syncthreads();
  for (int o = tid; o < a.tiles * 16 * kMaxN; o += kThreads) {
    const int tt = o / (16 * kMaxN), row = (o / kMaxN) % 16, col = o % kMaxN;
    const int64_t gr = ((int64_t)blockIdx.x * a.tiles + tt) * 16 + row;
    if (col < a.n && gr < a.rows) {
      float v = 0.0f;
      for (int w = tt; w < kWarps; w += a.tiles) v += red[(size_t)w * 16 * kMaxN + row * kMaxN + col];
      v = ldexpf(v, e) * __ldg(a.scale + gr * a.scale_row_stride);
      if (a.bias) v += a.bias[gr];
      float* yp = a.y + (int64_t)col * a.rows + gr;
      *yp = a.accumulate ? __ldcg(yp) + v : v;
    }
  }
}

}  // namespace

bool gemv_fp8_tc_ok(const WeightView& w, int n) {
  return w.type == GgmlType::F8_E4M3 && w.scale && (w.scale_group >= w.cols || w.scale_row_stride == 0) &&
         n >= 1 && n <= kMaxN && w.cols % 64 == 0 && (int64_t)n * w.cols <= kMaxXElems &&
         w.row_bytes % 16 == 0 && aligned16(w.data) && w.rows > 0;
}

cudaError_t gemv_fp8_tc(const WeightView& w, const float* x, int n, float* y, const float* bias,
                        bool accumulate, cudaStream_t stream) {
  if (!gemv_fp8_tc_ok(w, n) || !x || !y || !aligned16(x)) return cudaErrorNotSupported;
  TcArgs a{};
  a.w = static_cast<const uint8_t*>(w.data);
  a.rows = w.rows;
  a.row_bytes = (int64_t)w.row_bytes;
  a.cols = (int)w.cols;
  a.n = n;
  a.scale = w.scale;
  a.scale_row_stride = w.scale_row_stride;
  a.x = x;
  a.y = y;
  a.bias = bias;
  a.accumulate = accumulate;
  const size_t smem = (size_t)n * w.cols * 4 + (size_t)kWarps * 16 * kMaxN * sizeof(float);
  static const cudaError_t attr =
      cudaFuncSetAttribute(gemv_fp8_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           (int)(kMaxXElems * 4 + kWarps * 16 * kMaxN * 4));
  if (attr != cudaSuccess) return attr;
  // T: the most tiles per block that leave >= 132 blocks (one per SM of an H200), at least 1
  // (ULTRA_CUDA_FP8_TC_BLOCKS sets that number, for timing experiments: 396 and 264 measured the same or
  // slower on the 8B shapes, ffn up 28.1 us against 26.6 us at 132).
  static const int64_t min_blocks = [] {
    const char* v = std::getenv("ULTRA_CUDA_FP8_TC_BLOCKS");
    return v && std::atoi(v) > 0 ? (int64_t)std::atoi(v) : (int64_t)132;
  }();
  const int64_t n_tiles = (w.rows + 15) / 16;
  a.tiles = 1;
  while (a.tiles < kWarps && n_tiles / (2 * a.tiles) >= min_blocks) a.tiles *= 2;
  const int64_t blocks = (n_tiles + a.tiles - 1) / a.tiles;
  const cudaError_t e =
      launch_ex(gemv_fp8_tc_kernel, dim3((unsigned)blocks), dim3(kThreads), smem, stream, 1, kPdlAll, a);
  return e != cudaSuccess ? e : cudaGetLastError();
}

}  // namespace ultra::cuda
