// Low-bit decode GEMV on the tensor cores: y[n, rows] = x[n, cols] . (W * s)^T (+ bias) (+= y), 1 <= n <= 8,
// for F8_E4M3 and TERNARY with one scale per row (or per tensor), cols % 64 == 0, n * cols <= 16384
// (gemv_lowbit.h).
//
// Why: the SIMT kernel (gemv_lowbit.cu) pays ~5 integer / float ops per weight for the decode in f32 plus
// the FMA, which keeps F8_E4M3 near 35-45% of the read bandwidth and TERNARY (a quarter of the bytes) at
// 10-17%. Here the weights become exact f16 values in registers and the products run on the tensor cores:
//  * F8_E4M3: cvt.rn.f16x2.e4m3x2 converts two codes per instruction (every E4M3 value is an f16).
//  * TERNARY: two trits per f16x2 register in three instructions and no table: with the trit's +1 bit at
//    mantissa bit k of both halves of (w & mask) | M and its -1 bit at the same place of (w >> 1), where M
//    is 2^(10 - k) in each half, the halves are 2^(10 - k) + p and 2^(10 - k) + n, and their difference
//    (one HSUB2, exact) is the trit p - n. Register p of a 16-trit word holds trits p and p + 8 (bits 2p and
//    2p + 16; k = 2p for p <= 4, and 2p - 10 after a shift by 10 for p >= 5).
//
// Layout. A block (8 warps) owns T 16-row tiles (T = 1, 2, 4 or 8: as many as keep >= 1 block per SM, so
// that forming x, below, is paid once per T tiles); warp w works on tile w % T, and the 8 / T warps of a
// tile split its columns in steps (group c = w / T: steps c, c + 8 / T, ...). In a step, lane (g = lane / 4,
// t = lane % 4) loads 16 bytes of rows g and g + 8 at byte 64 s + 16 t of the row (streaming loads, kU
// steps in flight): 64 columns per step of F8_E4M3, 256 of TERNARY. The dot product does not care which k
// slot of an MMA holds which column, as long as A (weights) and B (x) agree, so the columns are assigned
// to suit the weights' registers and x is stored in that order:
//  * F8_E4M3: MMA kk (0..3) of the step gives lane (g, t)'s k slots 2t, 2t + 1 the columns 64 s + 16 t +
//    4 kk + {0, 1} and slots 2t + 8, 2t + 9 the columns + {2, 3}: the lane's 16 bytes feed the step's four
//    m16n8k16 MMAs and its B registers are 4 consecutive x values per MMA (x in natural order).
//  * TERNARY: word j (0..3) of the lane's 16 bytes holds columns c = 256 s + 64 t + 16 j + (0..15), and
//    feeds four MMAs; MMA q gives slots 2t, 2t + 1 the trits of register 2q (columns c + 2q, c + 2q + 8) and
//    slots 2t + 8, 2t + 9 those of register 2q + 1. x is stored with each 16-column group interleaved as
//    (x0, x8, x1, x9, ..., x7, x15), so B is again consecutive words.
//
// x in f16: the block forms x * 2^-e (e from the largest |x|, which lands in [2^13, 2^14)) as hi = f16(x')
// and lo = f16(x' - hi) in shared memory (22 significant bits). For n <= 4 the MMA's 8 columns carry both
// parts (column g: hi of x row g, column n + g: lo of row g) and one MMA does the product, the halves added
// at the end; for n > 4 two MMAs (hi, lo). The row sums are multiplied by 2^e and the row's scale at the
// end. The MMAs alternate between two accumulators (two dependency chains),
// flushed into f32 registers every 16 MMAs (long MMA accumulation chains lose accuracy); the 8 warps'
// partial sums are added in a fixed order (deterministic).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdlib>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/tuning.h"

namespace ultra::cuda {

using namespace detail;

namespace {

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kU = 4;              // steps in flight per warp
constexpr int kMaxXElems = 16384;  // n * cols: x's hi and lo parts take 4 bytes each in shared memory
constexpr int kMaxN = 8;           // the MMA's n
constexpr int kXPer = kMaxXElems / 8 / kThreads;  // 8-column units of x per thread at most

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
  int tiles;            // T: 16-row tiles per block
  uint32_t tern_magic;  // 0x64006400 (TritMagic)
  int slots;            // bulk variant: ring slots per warp (kSlotSteps steps of 16 rows each)
};

// The bulk-copy variant's ring: a slot holds kSlotSteps steps (64 bytes each) of a tile's 16 rows, row g at
// byte g * kRowStride (256 bytes of codes, 64 of padding: lanes (g, t) of a quarter warp then read 16 bytes
// at g * 320 + 16 t + 64 j, words 16 g + 4 t + 16 j mod 32, all different banks).
constexpr int kSlotSteps = 4, kRowStride = 320, kSlotBytes = 16 * kRowStride;
constexpr int kMaxSlots = 8;
constexpr int kRedBytes = kWarps * 16 * kMaxN * sizeof(float);

// Dynamic shared memory: x's hi and lo parts [n, xs] each, the warps' partial sums, then (bulk) the warps'
// rings and their mbarriers.
__host__ __device__ inline size_t x_bytes(int n, int xs) {
  return ((size_t)n * xs * 4 + 127) / 128 * 128;
}
__host__ __device__ inline size_t tc_smem_bytes(int n, int xs, int slots) {
  return x_bytes(n, xs) + kRedBytes + (size_t)kWarps * slots * (kSlotBytes + sizeof(uint64_t));
}

__device__ __forceinline__ uint32_t e4m3x2_to_half2(uint32_t v16) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)v16, __NV_E4M3);
  return (uint32_t)h.x | ((uint32_t)h.y << 16);
}

// The magic numbers 2^(10 - k) in both f16 halves for k = 0, 2, 4, 6, 8 ((25 - k) << 10 each), kept in
// registers: computed from a kernel argument (0x64006400) so that the compiler cannot fold them into
// immediates, which would split each (w & mask) | magic into two LOP3 (one immediate per instruction).
struct TritMagic {
  uint32_t m[5];
  __device__ explicit TritMagic(uint32_t m0) {
#pragma unroll
    for (int i = 0; i < 5; ++i) m[i] = m0 - (uint32_t)i * 0x08000800u;
  }
};

// Trits p and p + 8 of the word (bits 2p, 2p + 1 and 2p + 16, 2p + 17) as an f16 pair, for register p
// of w (p <= 4: w and w >> 1; p >= 5: w >> 10 and w >> 11, and k = 2p - 10).
template <int k>
__device__ __forceinline__ uint32_t trit_pair(uint32_t plus, uint32_t minus, const TritMagic& mg) {
  constexpr uint32_t mask = 0x00010001u << k;
  const uint32_t magic = mg.m[k / 2];
  const uint32_t a = (plus & mask) | magic, b = (minus & mask) | magic;  // 2^(10-k) + p, 2^(10-k) + n
  const __half2 d = __hsub2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
  return *reinterpret_cast<const uint32_t*>(&d);
}

__device__ __forceinline__ void trits_to_half2(uint32_t w, uint32_t (&r)[8], const TritMagic& mg) {
  const uint32_t w1 = w >> 1, wh = w >> 10, wh1 = w >> 11;
  r[0] = trit_pair<0>(w, w1, mg);
  r[1] = trit_pair<2>(w, w1, mg);
  r[2] = trit_pair<4>(w, w1, mg);
  r[3] = trit_pair<6>(w, w1, mg);
  r[4] = trit_pair<8>(w, w1, mg);
  r[5] = trit_pair<0>(wh, wh1, mg);
  r[6] = trit_pair<2>(wh, wh1, mg);
  r[7] = trit_pair<4>(wh, wh1, mg);
}

__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16 f16 of x (8 words) from shared memory.
__device__ __forceinline__ void load_x16(const __half* p, uint32_t (&b)[8]) {
  const uint4 u0 = *reinterpret_cast<const uint4*>(p), u1 = *reinterpret_cast<const uint4*>(p + 8);
  b[0] = u0.x, b[1] = u0.y, b[2] = u0.z, b[3] = u0.w, b[4] = u1.x, b[5] = u1.y, b[6] = u1.z, b[7] = u1.w;
}

// One step's MMAs for this lane's 16 bytes of rows g (va) and g + 8 (vb). x1: the lane's B row at the
// step's first column of the lane; x2: the lo part's row when two MMAs run (dual, n > 4).
template <bool kTern>
__device__ __forceinline__ void step_mma(float (&d)[2][4], const uint4& va, const uint4& vb, const __half* x1,
                                         const __half* x2, bool dual, int t, const TritMagic& mg) {
  const uint32_t wa4[4] = {va.x, va.y, va.z, va.w}, wb4[4] = {vb.x, vb.y, vb.z, vb.w};
  if constexpr (!kTern) {
    uint32_t b1[8], b2[8];
    load_x16(x1, b1);
    if (dual) load_x16(x2, b2);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t af[4] = {e4m3x2_to_half2(wa4[kk] & 0xffffu), e4m3x2_to_half2(wb4[kk] & 0xffffu),
                              e4m3x2_to_half2(wa4[kk] >> 16), e4m3x2_to_half2(wb4[kk] >> 16)};
      mma_f16(d[kk & 1], af, b1[2 * kk], b1[2 * kk + 1]);  // columns 4 kk .. 4 kk + 3 of the lane's 16
      if (dual) mma_f16(d[kk & 1], af, b2[2 * kk], b2[2 * kk + 1]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t b1[8], b2[8], ra[8], rb[8];
      const int slot = 16 * (j ^ t);  // the group's place in shared memory (see the kernel)
      load_x16(x1 + slot, b1);
      if (dual) load_x16(x2 + slot, b2);
      trits_to_half2(wa4[j], ra, mg);
      trits_to_half2(wb4[j], rb, mg);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint32_t af[4] = {ra[2 * q], rb[2 * q], ra[2 * q + 1], rb[2 * q + 1]};
        mma_f16(d[q & 1], af, b1[2 * q], b1[2 * q + 1]);
        if (dual) mma_f16(d[q & 1], af, b2[2 * q], b2[2 * q + 1]);
      }
    }
  }
}

// step_mma into d; TERNARY's 16 MMAs of a step are then flushed into acc (long MMA chains lose accuracy).
template <bool kTern>
__device__ __forceinline__ void step_acc(float (&acc)[4], float (&d)[2][4], const uint4& ca, const uint4& cb,
                                         const __half* x1, const __half* x2, bool dual, int t,
                                         const TritMagic& mg) {
  step_mma<kTern>(d, ca, cb, x1, x2, dual, t, mg);
  if (kTern) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] += d[0][i] + d[1][i], d[0][i] = d[1][i] = 0.0f;
  }
}

// x' = x * 2^-e in f16 hi / lo parts into xh / xl [n, xs] (zeros past cols); returns e. x read once
// (8-column units of two float4, all loads issued before any is used: one L2 round trip), its largest |x|
// reduced, then converted from registers. Unit i of a row is columns 8i .. 8i + 7 (F8_E4M3) or, TERNARY,
// columns 16 (i / 2) + 4 (i % 2) + {0..3} and the same + 8, interleaved; TERNARY also stores group j (0..3)
// of each 64-column chunk c at place j ^ (c % 4), so that the four lanes t of a step (chunks 4s + t) read
// different banks. Ends with a block barrier.
template <bool kTern>
__device__ __forceinline__ int form_x(const TcArgs& a, int xs, __half* xh, __half* xl, float* s_max, int tid,
                                      int lane, int warp) {
  const int n_units = a.n * a.cols / 8, units_per_row = a.cols / 8;
  const float4* x4 = reinterpret_cast<const float4*>(a.x);
  float4 xv[kXPer][2];
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < kXPer; ++j) {
    const int i = tid + j * kThreads;
    xv[j][0] = xv[j][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < n_units) {
      int f0 = 2 * i, f1 = 2 * i + 1;  // float4 indices
      if (kTern) {
        const int r = i / units_per_row, u = i % units_per_row;
        f0 = r * (a.cols / 4) + 4 * (u / 2) + u % 2;
        f1 = f0 + 2;
      }
      xv[j][0] = __ldcg(x4 + f0);
      xv[j][1] = __ldcg(x4 + f1);
    }
    for (const float4& v : xv[j])
      m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
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
    if (i < n_units) {
      const float4 p = xv[j][0], q = xv[j][1];
      uint4 h, l;
      if (kTern) {
        split2(p.x, q.x, h.x, l.x);
        split2(p.y, q.y, h.y, l.y);
        split2(p.z, q.z, h.z, l.z);
        split2(p.w, q.w, h.w, l.w);
      } else {
        split2(p.x, p.y, h.x, l.x);
        split2(p.z, p.w, h.y, l.y);
        split2(q.x, q.y, h.z, l.z);
        split2(q.z, q.w, h.w, l.w);
      }
      const int r = i / units_per_row, u = i % units_per_row;
      int o = r * (xs / 8) + u;
      if (kTern) {
        const int grp = u / 2, c = grp / 4;
        o = r * (xs / 8) + 2 * (4 * c + ((grp % 4) ^ (c % 4))) + u % 2;
      }
      reinterpret_cast<uint4*>(xh)[o] = h;
      reinterpret_cast<uint4*>(xl)[o] = l;
    }
  }
  if (xs > a.cols)  // the padding: (xs - cols) / 8 units per row
    for (int i = tid, pad = (xs - a.cols) / 8; i < a.n * pad; i += kThreads) {
      const int o = i / pad * (xs / 8) + units_per_row + i % pad;
      reinterpret_cast<uint4*>(xh)[o] = reinterpret_cast<uint4*>(xl)[o] = make_uint4(0, 0, 0, 0);
    }
  __syncthreads();
  return e;
}

// kBulk: the weights reach shared memory through bulk copies (the copy engine) instead of the lanes' loads
// into registers. Each group of warps then takes a contiguous range of a tile's steps (not every
// n_groups-th step), streamed through the warp's own ring of a.slots slots: lanes 0..15 each copy their
// row's part of a slot (cp.async.bulk, completing on the slot's mbarrier), the first slots before
// griddepcontrol.wait, a slot refilled once every lane has read it.
template <bool kTern, bool kBulk>
__global__ void __launch_bounds__(kThreads) gemv_lowbit_tc_kernel(TcArgs a) {
  constexpr int kStepCols = kTern ? 256 : 64;
  extern __shared__ __align__(128) uint8_t sm[];
  // x rows padded with zeros to whole steps (xs columns), so that every lane reads x without a condition.
  const int n_steps = (a.cols + kStepCols - 1) / kStepCols, xs = n_steps * kStepCols;
  __half* xh = reinterpret_cast<__half*>(sm);                    // [n, xs]
  __half* xl = xh + (size_t)a.n * xs;                            // [n, xs]
  float* red = reinterpret_cast<float*>(sm + x_bytes(a.n, xs));  // [kWarps, 16, kMaxN]
  uint8_t* rings = sm + x_bytes(a.n, xs) + kRedBytes;            // [kWarps, slots, kSlotBytes]
  uint64_t* bars = reinterpret_cast<uint64_t*>(rings + (size_t)kWarps * a.slots * kSlotBytes);
  __shared__ float s_max[kWarps];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int tile = warp % a.tiles, group = warp / a.tiles, n_groups = kWarps / a.tiles;
  const int64_t row0 = ((int64_t)blockIdx.x * a.tiles + tile) * 16;
  // Bytes of codes per row: the lane's 16 bytes of a step are all inside or all past them (cols % 64 == 0).
  const int code_bytes = kTern ? a.cols / 4 : a.cols;
  auto in_row = [&](int s) { return s < n_steps && 64 * s + 16 * t < code_bytes; };
  auto clamp_row = [&](int64_t r) { return r < a.rows ? r : a.rows - 1; };  // rows past the end: read, not
                                                                            // stored
  uint4 va[kU], vb[kU];
  const uint8_t *wa = nullptr, *wb = nullptr;
  // Bulk: this group's steps [s_begin, s_end), in items of kSlotSteps steps; the warp's ring and barriers.
  const int spg = (n_steps + n_groups - 1) / n_groups;
  const int s_begin = min(group * spg, n_steps), s_end = min(s_begin + spg, n_steps);
  const int items = (s_end - s_begin + kSlotSteps - 1) / kSlotSteps;
  uint8_t* ring = rings + (size_t)warp * a.slots * kSlotBytes;
  uint64_t* wbar = bars + warp * a.slots;
  const uint8_t* wrow = a.w + clamp_row(row0 + (lane & 15)) * a.row_bytes;
  const int end_byte = min(64 * s_end, code_bytes);
  auto issue = [&](int k) {  // item k into slot k % slots: lanes 0..15 copy their row's part
    const int b0 = 64 * (s_begin + kSlotSteps * k);
    const uint32_t bytes = (uint32_t)min(64 * kSlotSteps, end_byte - b0);  // > 0, a multiple of 16
    uint64_t* bar = &wbar[k % a.slots];
    if (lane == 0) mbar_expect_tx(bar, 16 * bytes);
    if (lane < 16)
      bulk_copy_g2s(ring + (size_t)(k % a.slots) * kSlotBytes + lane * kRowStride, wrow + b0, bytes, bar);
  };

  if constexpr (kBulk) {
    if (lane == 0) {
      for (int i = 0; i < a.slots; ++i) mbar_init(&wbar[i], 1);
      mbar_init_fence();
    }
    __syncwarp();
    for (int k = 0; k < a.slots && k < items; ++k) issue(k);
  } else {
    // The first steps' weights before the wait (weights are never written by kernels).
    wa = a.w + clamp_row(row0 + g) * a.row_bytes + 16 * t;
    wb = a.w + clamp_row(row0 + g + 8) * a.row_bytes + 16 * t;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int s = group + n_groups * u;
      va[u] = vb[u] = make_uint4(0, 0, 0, 0);
      if (in_row(s)) {
        va[u] = ld_stream16(wa + 64 * s);
        vb[u] = ld_stream16(wb + 64 * s);
      }
    }
  }
  pdl_trigger();
  pdl_wait();
  const int e = form_x<kTern>(a, xs, xh, xl, s_max, tid, lane, warp);

  // B rows of this lane: n <= 4, one MMA (column g: hi of x row g, column n + g: lo of row g - n); n > 4,
  // two (hi and lo of row g).
  const bool dual = a.n > 4;
  // Lanes of no x row read row 0: their MMA columns (>= 2n, or >= n for two MMAs) are never stored.
  const __half* x1 = xh;
  const __half* x2 = xl;
  if (g < a.n) {
    x1 = xh + g * xs;
    x2 = xl + g * xs;
  } else if (!dual && g < 2 * a.n) {
    x1 = xl + (g - a.n) * xs;
  }
  const TritMagic mg(a.tern_magic);
  const int lane_col = kStepCols / 4 * t;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // rows g, g (MMA columns 2t, 2t + 1), g + 8, g + 8
  if constexpr (kBulk) {
    for (int k = 0; k < items; ++k) {
      const int slot = k % a.slots;
      mbar_wait(&wbar[slot], (uint32_t)(k / a.slots) & 1u);
      const uint8_t* sa = ring + (size_t)slot * kSlotBytes + g * kRowStride + 16 * t;
      const uint8_t* sb = sa + 8 * kRowStride;
      float d[2][4] = {};
#pragma unroll
      for (int j = 0; j < kSlotSteps; ++j) {
        const int s = s_begin + kSlotSteps * k + j;
        if (s >= s_end) break;
        // A lane past the row's codes (TERNARY's last step) reads stale or unwritten bytes of the slot: any
        // bits are finite trits, and x there is the zero padding.
        const uint4 ca = *reinterpret_cast<const uint4*>(sa + 64 * j);
        const uint4 cb = *reinterpret_cast<const uint4*>(sb + 64 * j);
        const int c = kStepCols * s + lane_col;
        step_acc<kTern>(acc, d, ca, cb, x1 + c, x2 + c, dual, t, mg);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i] += d[0][i] + d[1][i];
      __syncwarp();  // every lane is done with the slot
      if (k + a.slots < items) {
        if (lane < 16) fence_proxy_async();
        issue(k + a.slots);
      }
    }
  } else {
    for (int s0 = group; s0 < n_steps; s0 += n_groups * kU) {
      float d[2][4] = {};  // two MMA accumulators, alternating (two dependency chains)
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int s = s0 + n_groups * u;
        if (s >= n_steps) break;
        // Past the row's codes (TERNARY's last step: in_row false), va / vb hold an earlier step's codes
        // (finite) and x there is the zero padding.
        const uint4 ca = va[u], cb = vb[u];
        // The loads of step s + n_groups * kU into this slot, before the MMAs of step s.
        const int sn = s + n_groups * kU;
        if (in_row(sn)) {
          va[u] = ld_stream16(wa + 64 * sn);
          vb[u] = ld_stream16(wb + 64 * sn);
        }
        const int c = kStepCols * s + lane_col;
        step_acc<kTern>(acc, d, ca, cb, x1 + c, x2 + c, dual, t, mg);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i] += d[0][i] + d[1][i];
    }
  }

  // The partial sums of each tile's warps, added in warp order (and, one MMA, the lo columns after the hi).
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
      if (!dual)
        for (int w = tt; w < kWarps; w += a.tiles) v += red[(size_t)w * 16 * kMaxN + row * kMaxN + a.n + col];
      v = ldexpf(v, e) * __ldg(a.scale + gr * a.scale_row_stride);
      if (a.bias) v += a.bias[gr];
      float* yp = a.y + (int64_t)col * a.rows + gr;
      *yp = a.accumulate ? __ldcg(yp) + v : v;
    }
  }
}

}  // namespace

bool lowbit_tc_on() {
  return kernel_tuning().lowbit_tc;
}

// The current device's attribute, 0 if it cannot be read.
static int device_attr(cudaDeviceAttr attr) {
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess) return 0;
  return v;
}

bool gemv_lowbit_tc_ok(const WeightView& w, int n) {
  return (w.type == GgmlType::F8_E4M3 || w.type == GgmlType::TERNARY) && lowbit_scale_per_row_or_tensor(w) &&
         n >= 1 && n <= kMaxN && w.cols % 64 == 0 && (int64_t)n * w.cols <= kMaxXElems &&
         w.row_bytes % 16 == 0 && aligned16(w.data) && w.rows > 0 && lowbit_tc_on();
}

int lowbit_tc_bulk_slots() {
  const int k = kernel_tuning().lowbit_bulk;
  return k < -1 ? -1 : k > kMaxSlots ? kMaxSlots : k;
}

cudaError_t gemv_lowbit_tc(const WeightView& w, const float* x, int n, float* y, const float* bias,
                           bool accumulate, cudaStream_t stream, int bulk_slots) {
  if (!gemv_lowbit_tc_ok(w, n) || !x || !y || !aligned16(x)) return cudaErrorNotSupported;
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
  a.tern_magic = 0x64006400u;
  const bool tern = w.type == GgmlType::TERNARY;
  const int step_cols = tern ? 256 : 64, xs = (int)((w.cols + step_cols - 1) / step_cols * step_cols);
  // Every instance may take the device's opt-in shared memory less the static part (s_max).
  static const int optin = device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin) > 0
                               ? device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin) - 1024
                               : 48 << 10;
  static const cudaError_t attr[4] = {
      cudaFuncSetAttribute(gemv_lowbit_tc_kernel<false, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           optin),
      cudaFuncSetAttribute(gemv_lowbit_tc_kernel<true, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           optin),
      cudaFuncSetAttribute(gemv_lowbit_tc_kernel<false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           optin),
      cudaFuncSetAttribute(gemv_lowbit_tc_kernel<true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           optin)};
  for (cudaError_t e : attr)
    if (e != cudaSuccess) return e;
  // T: the most tiles per block that leave >= 132 blocks (one per SM of an H200), at least 1
  // (ULTRA_CUDA_LOWBIT_TC_BLOCKS sets that number, for timing experiments; larger ones measured the same or
  // slower: docs/CUDA.md, "Tuning switches").
  const int64_t min_blocks = kernel_tuning().lowbit_tc_blocks;
  const int64_t n_tiles = (w.rows + 15) / 16;
  a.tiles = 1;
  while (a.tiles < kWarps && n_tiles / (2 * a.tiles) >= min_blocks) a.tiles *= 2;
  const int64_t blocks = (n_tiles + a.tiles - 1) / a.tiles;
  // Bulk: no more slots than the busiest warp has items, nor than shared memory holds.
  const int n_steps = xs / step_cols, n_groups = kWarps / a.tiles;
  const int spg = (n_steps + n_groups - 1) / n_groups, max_items = (spg + kSlotSteps - 1) / kSlotSteps;
  int slots = bulk_slots < 0 ? lowbit_tc_bulk_slots() : bulk_slots > kMaxSlots ? kMaxSlots : bulk_slots;
  if (bulk_slots < 0 && lowbit_tc_bulk_slots() < 0) {
    // Automatic (measured on the H200, docs/BENCHMARKS.md): F8_E4M3 takes 2 slots where two blocks still
    // fit on an SM (or the grid has no more blocks than SMs), else 1 where a warp has at most 8 items (a
    // slot each: its copies and MMAs overlap with the other warps'), else its register loads; TERNARY, whose
    // unpacking and not the memory sets its pace, its register loads (the bulk variant measured 0-35%
    // slower).
    static const int sm_bytes = device_attr(cudaDevAttrMaxSharedMemoryPerMultiprocessor);
    static const int n_sms = device_attr(cudaDevAttrMultiProcessorCount);
    auto two_fit = [&](int sl) { return 2 * (tc_smem_bytes(n, xs, sl) + 2048) <= (size_t)sm_bytes; };
    slots = 0;
    if (!tern && sm_bytes > 0) {
      if (blocks <= n_sms || two_fit(2))
        slots = 2;
      else if (max_items <= 8 && two_fit(1))
        slots = 1;
    }
  }
  if (slots > 0) {
    slots = slots < max_items ? slots : max_items;
    while (slots > 1 && tc_smem_bytes(n, xs, slots) > (size_t)optin) --slots;
  }
  a.slots = slots;
  const size_t smem = tc_smem_bytes(n, xs, slots);
  auto kern = tern ? (slots > 0 ? gemv_lowbit_tc_kernel<true, true> : gemv_lowbit_tc_kernel<true, false>)
                   : (slots > 0 ? gemv_lowbit_tc_kernel<false, true> : gemv_lowbit_tc_kernel<false, false>);
  const cudaError_t e = launch_ex(kern, dim3((unsigned)blocks), dim3(kThreads), smem, stream, 1, kPdlAll, a);
  return e != cudaSuccess ? e : cudaGetLastError();
}

}  // namespace ultra::cuda
