// Mixture-of-experts kernels (moe.h): routing, grouping by expert, the experts' FFN, the weighted sum.

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemv_lowbit.h"
#include "backend/cuda/lowbit.cuh"
#include "backend/cuda/moe.h"
#include "core/quants.h"

namespace ultra::cuda {

using namespace detail;

namespace {

constexpr int kRouteWarps = 4;  // rows per block of moe_route
constexpr int kGemvWarps = 8;   // weight rows per block of the expert GEMVs (a warp each)
constexpr int kCombineThreads = 256;

constexpr size_t kAlign = 256;
size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

// ---- Routing

// One row's grouping for the decode kernels (n == 1), written by lane j < k for slot j: pair j = slot j, a
// tile of its own (the k experts are distinct); lane 0 also writes the tile count.
__device__ __forceinline__ void write_decode_tile(const MoeScratch& tiles, int lane, int k, int expert) {
  if (!tiles.tiles) return;
  if (lane < k) {
    tiles.tiles[3 * lane] = expert;
    tiles.tiles[3 * lane + 1] = lane;
    tiles.tiles[3 * lane + 2] = 1;
    tiles.pair_row[lane] = 0;
    tiles.slot_pair[lane] = lane;
  }
  if (lane == 0) *tiles.n_tiles = k;
}

// The warp's arg-max over (key, expert) packed into one 64-bit word: key (larger wins), then the complement
// of the expert (a tie: the lower expert). Lane l holds experts l, l + 32, ...
template <int kPer>
__device__ __forceinline__ int warp_argmax(const uint32_t (&key)[kPer], int lane, uint32_t* best_key) {
  uint64_t best = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const uint64_t c = ((uint64_t)key[i] << 32) | (0xffffffffu - (uint32_t)(lane + 32 * i));
    best = c > best ? c : best;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t other = __shfl_xor_sync(kFullMask, best, o);
    best = other > best ? other : best;
  }
  *best_key = (uint32_t)(best >> 32);
  return (int)(0xffffffffu - (uint32_t)best);
}

// A float's bits made order-preserving as an unsigned number.
__device__ __forceinline__ uint32_t ordered_bits(float v) {
  const uint32_t bits = __float_as_uint(v);
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

// One warp per row: lane l holds experts l, l + 32, ... (at most 8). The selection's key of an expert not
// yet taken is its probability, -0.5 for a NaN (it loses to any number, as on the CPU) and -1 once taken.
__global__ void __launch_bounds__(kRouteWarps * 32)
    moe_route_kernel(float* logits, int n, int n_expert, int k, bool norm, int32_t* ids, float* w,
                     MoeScratch tiles) {
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.x * kRouteWarps + (threadIdx.x >> 5);
  if (r >= n) return;
  float* p = logits + (int64_t)r * n_expert;
  constexpr int kPer = kMoeMaxRouted / 32;
  float v[kPer];
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < n_expert ? p[e] : -INFINITY;
    m = fmaxf(m, v[i]);
  }
  m = warp_max(m);
  double sum = 0;  // in double, as ggml (model/moe.cpp)
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < n_expert ? expf(v[i] - m) : 0.0f;
    sum += v[i];
  }
  sum = warp_sum(sum);
  const float inv = (float)(1.0 / sum);
  float key[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    v[i] *= inv;
    if (e < n_expert) p[e] = v[i];
    key[i] = e >= n_expert ? -1.0f : isnan(v[i]) ? -0.5f : v[i];
  }
  // k rounds of a warp arg-max over (key, expert) packed into one 64-bit word: the key's bits made
  // order-preserving as an unsigned number, then the complement of the expert (a tie: the lower expert).
  // Lane j keeps slot j's pick, so that the k slots are written in parallel.
  float total = 0, my_v = 0.0f;
  int my_e = -1;
  for (int j = 0; j < k; ++j) {
    uint32_t ord_key[kPer], ord;
#pragma unroll
    for (int i = 0; i < kPer; ++i) ord_key[i] = ordered_bits(key[i]);
    const int be = warp_argmax(ord_key, lane, &ord);
    const float bk = __uint_as_float((ord & 0x80000000u) ? ord & 0x7fffffffu : ~ord);
    const float bv = bk == -0.5f ? __int_as_float(0x7fc00000) : bk;  // the key of a NaN probability
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (lane + 32 * i == be) key[i] = -1.0f;
    if (lane == j) my_e = be, my_v = bv;
    total += bv;
  }
  if (lane < k) {
    const int64_t at = (int64_t)r * k + lane;
    ids[at] = my_e;
    w[at] = norm ? my_v / fmaxf(total, 6.103515625e-5f) : my_v;
  }
  write_decode_tile(tiles, lane, k, my_e);
}

// gpt-oss's routing, one warp per row as moe_route_kernel: the selection's key of an expert is its logit's
// ordered bits, 1 for a NaN (it loses to any number, as on the CPU) and 0 once taken (or past n_expert).
// Lane j keeps slot j's pick; the weights are the softmax of the k picked logits, their exponentials summed
// in slot order in f32 (model/moe.cpp's order and roundings).
__global__ void __launch_bounds__(kRouteWarps * 32)
    moe_route_topk_softmax_kernel(const float* logits, int n, int n_expert, int k, int32_t* ids, float* w,
                                  MoeScratch tiles) {
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.x * kRouteWarps + (threadIdx.x >> 5);
  if (r >= n) return;
  const float* p = logits + (int64_t)r * n_expert;
  constexpr int kPer = kMoeMaxRouted / 32;
  uint32_t key[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane + 32 * i;
    const float v = e < n_expert ? p[e] : 0.0f;
    // -0 and +0 are one key (the CPU's strict > keeps the lower expert of the two).
    key[i] = e >= n_expert ? 0u : isnan(v) ? 1u : ordered_bits(v == 0.0f ? 0.0f : v);
  }
  int my_e = -1;
  for (int j = 0; j < k; ++j) {
    uint32_t bk;
    const int be = warp_argmax(key, lane, &bk);
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (lane + 32 * i == be) key[i] = 0u;
    if (lane == j) my_e = be;
  }
  const float my_l = lane < k ? p[my_e] : 0.0f;
  const float mx = __shfl_sync(kFullMask, my_l, 0);
  const float ex = lane < k ? expf(__fsub_rn(my_l, mx)) : 0.0f;
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) sum = __fadd_rn(sum, __shfl_sync(kFullMask, ex, j));
  if (lane < k) {
    const int64_t at = (int64_t)r * k + lane;
    ids[at] = my_e;
    w[at] = __fdiv_rn(ex, sum);
  }
  write_decode_tile(tiles, lane, k, my_e);
}

// ---- Grouping: one block, thread e counts and places expert e's pairs (rows ascending).

__global__ void moe_group_kernel(const int32_t* ids, int n_pairs, int k, int n_expert, int tile_pairs,
                                 int32_t* tiles, int32_t* n_tiles, int32_t* pair_row, int32_t* slot_pair) {
  extern __shared__ int32_t sh[];
  int32_t* cnt = sh;                       // [n_expert]
  int32_t* start = sh + n_expert;          // [n_expert + 1]
  int32_t* tstart = start + n_expert + 1;  // [n_expert + 1]
  const int e = threadIdx.x;
  if (e < n_expert) {
    int c = 0;
    for (int i = 0; i < n_pairs; ++i) c += __ldg(ids + i) == e;
    cnt[e] = c;
  }
  for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) {
    const int id = ids[i];
    if (id < 0 || id >= n_expert) slot_pair[i] = -1;  // not placed: adds nothing
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    start[0] = tstart[0] = 0;
    for (int x = 0; x < n_expert; ++x) {
      start[x + 1] = start[x] + cnt[x];
      tstart[x + 1] = tstart[x] + (cnt[x] + tile_pairs - 1) / tile_pairs;
    }
    *n_tiles = tstart[n_expert];
  }
  __syncthreads();
  if (e >= n_expert) return;
  int p = start[e];
  for (int i = 0; i < n_pairs; ++i)
    if (__ldg(ids + i) == e) {
      pair_row[p] = i / k;
      slot_pair[i] = p;
      ++p;
    }
  for (int t = tstart[e]; t < tstart[e + 1]; ++t) {
    const int first = start[e] + (t - tstart[e]) * tile_pairs;
    tiles[3 * t] = e;
    tiles[3 * t + 1] = first;
    tiles[3 * t + 2] = min(tile_pairs, start[e + 1] - first);
  }
}

// ---- Expert GEMVs

// Columns c0 .. c0 + 7 of a weight row (c0 a multiple of 8; the row 16-byte aligned): loaded raw (load_raw,
// the loads of several chunks issued before any is used), then decoded to f32 (decode8).
template <GgmlType T>
struct Raw {
  uint4 v;  // F16 / BF16: 8 values
};
template <>
struct Raw<GgmlType::F32> {
  uint4 a, b;
};
template <>
struct Raw<GgmlType::Q8_0> {
  uint2 q;     // 8 codes
  uint32_t d;  // the f16 scale of their block
};
template <>
struct Raw<GgmlType::MXFP4> {
  uint32_t q;  // 8 E2M1 codes, column c0 + i in bits 4i..4i+3
  uint32_t e;  // the E8M0 exponent of their block
};

template <GgmlType T>
__device__ __forceinline__ void load_raw(const uint8_t* row, int64_t c0, int64_t cols, Raw<T>& r) {
  if constexpr (T == GgmlType::F32) {
    r.a = ld_stream16(row + c0 * 4), r.b = ld_stream16(row + c0 * 4 + 16);
  } else if constexpr (T == GgmlType::F16 || T == GgmlType::BF16) {
    r.v = ld_stream16(row + c0 * 2);
  } else if constexpr (T == GgmlType::MXFP4) {  // codes [cols / 2], then the exponents (moe.h)
    r.q = __ldg(reinterpret_cast<const uint32_t*>(row + c0 / 2));
    r.e = __ldg(row + cols / 2 + c0 / 32);
  } else {
    static_assert(T == GgmlType::Q8_0);  // codes [cols], then the f16 block scales (gemv_lowbit.h)
    r.q = __ldg(reinterpret_cast<const uint2*>(row + c0));
    r.d = __ldg(reinterpret_cast<const uint16_t*>(row + cols) + c0 / 32);
  }
}

template <GgmlType T>
__device__ __forceinline__ void decode8(const Raw<T>& r, float (&f)[8]) {
  if constexpr (T == GgmlType::F32) {
    f[0] = __uint_as_float(r.a.x), f[1] = __uint_as_float(r.a.y), f[2] = __uint_as_float(r.a.z);
    f[3] = __uint_as_float(r.a.w), f[4] = __uint_as_float(r.b.x), f[5] = __uint_as_float(r.b.y);
    f[6] = __uint_as_float(r.b.z), f[7] = __uint_as_float(r.b.w);
  } else if constexpr (T == GgmlType::F16) {
    const uint32_t u[4] = {r.v.x, r.v.y, r.v.z, r.v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 h = __half22float2(*reinterpret_cast<const __half2*>(&u[i]));
      f[2 * i] = h.x, f[2 * i + 1] = h.y;
    }
  } else if constexpr (T == GgmlType::BF16) {
    const uint32_t u[4] = {r.v.x, r.v.y, r.v.z, r.v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i)
      f[2 * i] = __uint_as_float(u[i] << 16), f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  } else if constexpr (T == GgmlType::MXFP4) {
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = moe_mxfp4_value(r.q, r.e, i);
  } else {
    const float d = __half2float(__ushort_as_half((unsigned short)r.d));
    float a[4], b[4];
    decode4_q8(r.q.x, a);
    decode4_q8(r.q.y, b);
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = a[i] * d, f[4 + i] = b[i] * d;
  }
}

// Block (row tile blockIdx.x, pair tile blockIdx.y): warp w computes weight row r = 8 blockIdx.x + w of the
// tile's expert against each of the tile's pairs' inputs. GATED: out[p, r] = silu(A[r] . x_p) * (B[r] . x_p)
// with x_p the row x_row[p] of x (the normed input); else out[p, r] = A[r] . x_p with x_p row p of x.
// tiles == null (the router): one expert, tile blockIdx.y = rows 8 blockIdx.y .. of x and out, n_rows rows.
// Lane l reads columns 8 l + 256 i; U such chunks per matrix are loaded before any is used, so that a warp
// has that many 16-byte loads in flight (U = 8 for one pair per tile, 4 for eight: registers).
template <int NP>
constexpr int kUnrollOf = NP == 1 ? 8 : 4;

template <GgmlType T, bool GATED, int NP, int U = kUnrollOf<NP>>
__device__ __forceinline__ void moe_dot_chunks(const uint8_t* ra, const uint8_t* rb, int64_t c0, int64_t cols,
                                               const float* const (&xs)[NP], int np, float (&acc_a)[NP],
                                               float (&acc_b)[NP], int n_chunks) {
  Raw<T> wa[U], wb[U];
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (u < n_chunks) {
      load_raw<T>(ra, c0 + 256 * u, cols, wa[u]);
      if constexpr (GATED) load_raw<T>(rb, c0 + 256 * u, cols, wb[u]);
    }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (u >= n_chunks) break;
    float fa[8], fb[8];
    decode8<T>(wa[u], fa);
    if constexpr (GATED) decode8<T>(wb[u], fb);
#pragma unroll
    for (int q = 0; q < NP; ++q) {
      if (q >= np) break;
      const float4 x0 = *reinterpret_cast<const float4*>(xs[q] + c0 + 256 * u);
      const float4 x1 = *reinterpret_cast<const float4*>(xs[q] + c0 + 256 * u + 4);
      const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        acc_a[q] = fmaf(fa[i], xv[i], acc_a[q]);
        if constexpr (GATED) acc_b[q] = fmaf(fb[i], xv[i], acc_b[q]);
      }
    }
  }
}

// Blocks per SM the register budget is set for: the unroll U bounds the raw loads held per lane.
template <bool GATED, int U>
constexpr int kMinBlocksOf = GATED&& U <= 2   ? 4
                             : GATED&& U <= 4 ? 3
                                              : 1;

// The experts' activation: swiglu_oai with limit > 0 (gpt-oss), else silu(g) * u.
__device__ __forceinline__ float moe_act(float g, float u, float limit) {
  return limit > 0.0f ? swiglu_oai_f(g, u, limit) : silu_f(g) * u;
}

// Row r of expert e's product plus its bias, when the weights have one (w.bias [n_expert, rows]).
__device__ __forceinline__ float add_bias(const ExpertWeights& w, int e, int64_t r, float v) {
  return w.bias ? __fadd_rn(v, __ldg(w.bias + (int64_t)e * w.rows + r)) : v;
}

template <GgmlType T, bool GATED, int NP = kMoeTilePairs, int U = kUnrollOf<NP>>
__global__ void __launch_bounds__(kGemvWarps * 32, (kMinBlocksOf<GATED, U>))
    moe_gemv_kernel(ExpertWeights a, ExpertWeights b, const float* x, const int32_t* x_row, int64_t x_stride,
                    float* out, int64_t out_stride, const int32_t* tiles, const int32_t* n_tiles, int n_rows,
                    float limit) {
  const int tile = blockIdx.y;
  int e = 0, p0 = tile * kMoeTilePairs, np = min(kMoeTilePairs, n_rows - p0);
  if (tiles) {
    if (tile >= *n_tiles) return;
    e = tiles[3 * tile], p0 = tiles[3 * tile + 1], np = tiles[3 * tile + 2];
  }
  const int lane = threadIdx.x & 31;
  const int64_t r = (int64_t)blockIdx.x * kGemvWarps + (threadIdx.x >> 5);
  if (r >= a.rows) return;
  np = min(np, NP);  // NP < kMoeTilePairs only where no tile has more (a one-row step)
  const float* xs[NP];
#pragma unroll
  for (int q = 0; q < NP; ++q) {
    const int p = p0 + (q < np ? q : 0);
    xs[q] = x + (int64_t)(x_row ? x_row[p] : p) * x_stride;
  }
  const uint8_t* ra =
      static_cast<const uint8_t*>(a.data) + (size_t)e * a.expert_bytes + (size_t)r * a.row_bytes;
  const uint8_t* rb = nullptr;
  if constexpr (GATED)
    rb = static_cast<const uint8_t*>(b.data) + (size_t)e * b.expert_bytes + (size_t)r * b.row_bytes;
  float acc_a[NP] = {}, acc_b[NP] = {};
  const int64_t n_chunks = (a.cols - lane * 8 + 255) / 256;  // this lane's chunks (cols % 8 == 0)
  int64_t c0 = lane * 8, i = 0;
  for (; i + U <= n_chunks; i += U, c0 += 256 * U)
    moe_dot_chunks<T, GATED, NP, U>(ra, rb, c0, a.cols, xs, np, acc_a, acc_b, U);
  if (i < n_chunks)
    moe_dot_chunks<T, GATED, NP, U>(ra, rb, c0, a.cols, xs, np, acc_a, acc_b, (int)(n_chunks - i));
#pragma unroll
  for (int q = 0; q < NP; ++q) {
    if (q >= np) break;
    const float sa = add_bias(a, e, r, warp_sum(acc_a[q]));
    if constexpr (GATED) {
      const float sb = add_bias(b, e, r, warp_sum(acc_b[q]));
      if (lane == 0) out[(int64_t)(p0 + q) * out_stride + r] = moe_act(sa, sb, limit);
    } else {
      if (lane == 0) out[(int64_t)(p0 + q) * out_stride + r] = sa;
    }
  }
}

// x[r] += sum_j w[r, j] * y[slot_pair[r, j]] in slot order; block r, threads over the columns.
__global__ void __launch_bounds__(kCombineThreads)
    moe_combine_kernel(const float* y, const int32_t* slot_pair, const float* w, int k, int dim, float* x) {
  const int64_t r = blockIdx.x;
  for (int d = threadIdx.x; d < dim; d += kCombineThreads) {
    float s = 0;
    for (int j = 0; j < k; ++j) {
      const int p = slot_pair[r * k + j];
      if (p >= 0)
        s = j == 0 ? w[r * k] * y[(int64_t)p * dim + d] : fmaf(w[r * k + j], y[(int64_t)p * dim + d], s);
    }
    x[r * dim + d] += s;
  }
}

__global__ void __launch_bounds__(128)
    sigmoid_gate_add_kernel(const float* y, const float* gate_w, const float* xn, int n, int dim, float* x) {
  const int lane = threadIdx.x & 31;
  const int64_t r = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
  if (r >= n) return;
  double dot = 0;  // as the CPU (cpu_backend.cpp)
  for (int d = lane; d < dim; d += 32) dot += (double)gate_w[d] * xn[r * dim + d];
  dot = warp_sum(dot);
  const float g = 1.0f / (1.0f + expf(-(float)dot));
  for (int d = lane; d < dim; d += 32) x[r * dim + d] += g * y[r * dim + d];
}

// ---- Prefill (more than 32 rows): tensor cores

// Block (row tile blockIdx.x of 64 weight rows, pair tile blockIdx.y of up to 64 pairs of one expert), 4
// warps of 16 pairs x 64 rows each: mma.sync m16n8k16 BF16 with f32 accumulation over K steps of 32, both
// operands rounded to BF16 in shared memory (activations as the dense prefill path rounds them for cuBLASLt;
// weights decoded from their type). GATED / x_row / out as moe_gemv_kernel. Needs cols % 32 == 0.
constexpr int kMmaM = 64, kMmaN = 64, kMmaK = 32, kMmaThreads = 128;
constexpr int kMmaLd = kMmaK + 8;  // bf16 per shared row: 80 bytes, rows on different banks

template <GgmlType T>
__device__ __forceinline__ void load16_bf16(const uint8_t* row, int64_t c0, int64_t cols, uint32_t (&pk)[8]) {
  if (!row) {
#pragma unroll
    for (int i = 0; i < 8; ++i) pk[i] = 0;
    return;
  }
  Raw<T> r0, r1;
  load_raw<T>(row, c0, cols, r0);
  load_raw<T>(row, c0 + 8, cols, r1);
  if constexpr (T == GgmlType::BF16) {
    pk[0] = r0.v.x, pk[1] = r0.v.y, pk[2] = r0.v.z, pk[3] = r0.v.w;
    pk[4] = r1.v.x, pk[5] = r1.v.y, pk[6] = r1.v.z, pk[7] = r1.v.w;
  } else {
    float f[8];
    decode8<T>(r0, f);
#pragma unroll
    for (int i = 0; i < 4; ++i) pk[i] = pack_bf16x2(f[2 * i], f[2 * i + 1]);
    decode8<T>(r1, f);
#pragma unroll
    for (int i = 0; i < 4; ++i) pk[4 + i] = pack_bf16x2(f[2 * i], f[2 * i + 1]);
  }
}

template <GgmlType T, bool GATED>
__global__ void __launch_bounds__(kMmaThreads)
    moe_mma_kernel(ExpertWeights a, ExpertWeights b, const float* x, const int32_t* x_row, int64_t x_stride,
                   float* out, int64_t out_stride, const int32_t* tiles, const int32_t* n_tiles,
                   float limit) {
  const int tile = blockIdx.y;
  if (tile >= *n_tiles) return;
  const int e = tiles[3 * tile], p0 = tiles[3 * tile + 1], np = tiles[3 * tile + 2];
  const int64_t n0 = (int64_t)blockIdx.x * kMmaN;
  __shared__ __align__(16) uint32_t As[kMmaM][kMmaLd / 2];
  __shared__ __align__(16) uint32_t Ba[kMmaN][kMmaLd / 2];
  __shared__ __align__(16) uint32_t Bb[GATED ? kMmaN : 1][kMmaLd / 2];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int lr = tid >> 1, lk = (tid & 1) * 16;  // this thread's loads: row lr, k lk .. lk + 15 of a step
  const float* xa = lr < np ? x + (int64_t)(x_row ? x_row[p0 + lr] : p0 + lr) * x_stride : nullptr;
  const int64_t wn = n0 + lr;
  const uint8_t* wa = wn < a.rows ? static_cast<const uint8_t*>(a.data) + (size_t)e * a.expert_bytes +
                                        (size_t)wn * a.row_bytes
                                  : nullptr;
  const uint8_t* wb = nullptr;
  if constexpr (GATED)
    wb = wn < b.rows
             ? static_cast<const uint8_t*>(b.data) + (size_t)e * b.expert_bytes + (size_t)wn * b.row_bytes
             : nullptr;
  float acc_a[8][4] = {}, acc_b[GATED ? 8 : 1][4] = {};
  for (int64_t k0 = 0; k0 < a.cols; k0 += kMmaK) {
    uint32_t pk[8];
    if (xa) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 v = *reinterpret_cast<const float4*>(xa + k0 + lk + 4 * i);
        pk[2 * i] = pack_bf16x2(v.x, v.y), pk[2 * i + 1] = pack_bf16x2(v.z, v.w);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) pk[i] = 0;
    }
    *reinterpret_cast<uint4*>(&As[lr][lk / 2]) = make_uint4(pk[0], pk[1], pk[2], pk[3]);
    *reinterpret_cast<uint4*>(&As[lr][lk / 2 + 4]) = make_uint4(pk[4], pk[5], pk[6], pk[7]);
    load16_bf16<T>(wa, k0 + lk, a.cols, pk);
    *reinterpret_cast<uint4*>(&Ba[lr][lk / 2]) = make_uint4(pk[0], pk[1], pk[2], pk[3]);
    *reinterpret_cast<uint4*>(&Ba[lr][lk / 2 + 4]) = make_uint4(pk[4], pk[5], pk[6], pk[7]);
    if constexpr (GATED) {
      load16_bf16<T>(wb, k0 + lk, b.cols, pk);
      *reinterpret_cast<uint4*>(&Bb[lr][lk / 2]) = make_uint4(pk[0], pk[1], pk[2], pk[3]);
      *reinterpret_cast<uint4*>(&Bb[lr][lk / 2 + 4]) = make_uint4(pk[4], pk[5], pk[6], pk[7]);
    }
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < kMmaK / 2; ks += 8) {  // word offsets of the two k16 steps
      const int m = warp * 16 + g;
      const uint32_t a0 = As[m][ks + t], a1 = As[m + 8][ks + t], a2 = As[m][ks + t + 4],
                     a3 = As[m + 8][ks + t + 4];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        mma_bf16(acc_a[j], a0, a1, a2, a3, Ba[j * 8 + g][ks + t], Ba[j * 8 + g][ks + t + 4]);
        if constexpr (GATED)
          mma_bf16(acc_b[j], a0, a1, a2, a3, Bb[j * 8 + g][ks + t], Bb[j * 8 + g][ks + t + 4]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int m = warp * 16 + g + 8 * half;
      if (m >= np) continue;
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int64_t nn = n0 + j * 8 + 2 * t + q;
        if (nn >= a.rows) continue;
        float v = add_bias(a, e, nn, acc_a[j][2 * half + q]);
        if constexpr (GATED) v = moe_act(v, add_bias(b, e, nn, acc_b[j][2 * half + q]), limit);
        out[(int64_t)(p0 + m) * out_stride + nn] = v;
      }
    }
}

template <GgmlType T>
cudaError_t launch_ffn_mma(const ExpertWeights& gate, const ExpertWeights& up, const ExpertWeights& down,
                           const float* xn, const MoeScratch& s, int64_t max_tiles, float limit,
                           cudaStream_t stream) {
  const int ffn = (int)gate.rows, dim = (int)down.rows;
  moe_mma_kernel<T, true>
      <<<dim3((unsigned)((ffn + kMmaN - 1) / kMmaN), (unsigned)max_tiles), kMmaThreads, 0, stream>>>(
          gate, up, xn, s.pair_row, gate.cols, s.h, ffn, s.tiles, s.n_tiles, limit);
  moe_mma_kernel<T, false>
      <<<dim3((unsigned)((dim + kMmaN - 1) / kMmaN), (unsigned)max_tiles), kMmaThreads, 0, stream>>>(
          down, down, s.h, nullptr, ffn, s.y, dim, s.tiles, s.n_tiles, 0.0f);
  return cudaGetLastError();
}

// One row (decode), k dividing 8: warp w of block b takes slot j = w % k and the R output elements
// d = R (G b + w / k) + i (i < R, G = 8 / k element groups per block) of slot j's expert, the dot products
// W_down[ids[j]][d] . h[slot_pair[j]] (the R rows' loads issued together); then thread i of each element
// group adds sum_j w[j] * dot_j to x[d] in slot order (the down projection and moe_combine in one pass).
template <GgmlType T, int R>
__global__ void __launch_bounds__(kGemvWarps * 32)
    moe_down1_kernel(ExpertWeights down, const float* h, int64_t ffn, const int32_t* ids,
                     const int32_t* slot_pair, const float* w, int k, float* x) {
  __shared__ float part[kGemvWarps][R];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int groups = kGemvWarps / k, j = warp % k;
  const int64_t d0 = ((int64_t)blockIdx.x * groups + warp / k) * R;
  const int e = ids[j], p = slot_pair[j];
  const bool ok = e >= 0 && e < down.n_expert && p >= 0;
  float acc[R];
#pragma unroll
  for (int i = 0; i < R; ++i) acc[i] = 0.0f;
  if (ok && d0 < down.rows) {
    const uint8_t* rows[R];
#pragma unroll
    for (int i = 0; i < R; ++i)
      rows[i] = static_cast<const uint8_t*>(down.data) + (size_t)e * down.expert_bytes +
                (size_t)(d0 + i < down.rows ? d0 + i : d0) * down.row_bytes;
    const float* xs = h + (int64_t)p * ffn;
    constexpr int U = R >= 4 ? 2 : R >= 2 ? 4 : 8;  // chunks of each row in flight
    const int64_t n_chunks = (down.cols - lane * 8 + 255) / 256;
    for (int64_t i0 = 0; i0 < n_chunks; i0 += U) {
      Raw<T> raw[U][R];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (i0 + u < n_chunks)
#pragma unroll
          for (int i = 0; i < R; ++i) load_raw<T>(rows[i], lane * 8 + 256 * (i0 + u), down.cols, raw[u][i]);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (i0 + u >= n_chunks) break;
        const int64_t c0 = lane * 8 + 256 * (i0 + u);
        const float4 x0 = *reinterpret_cast<const float4*>(xs + c0);
        const float4 x1 = *reinterpret_cast<const float4*>(xs + c0 + 4);
        const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int i = 0; i < R; ++i) {
          float f[8];
          decode8<T>(raw[u][i], f);
#pragma unroll
          for (int c = 0; c < 8; ++c) acc[i] = fmaf(f[c], xv[c], acc[i]);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const float v = warp_sum(acc[i]);
    if (lane == 0) part[warp][i] = ok && d0 + i < down.rows ? add_bias(down, e, d0 + i, v) : v;
  }
  __syncthreads();
  if (threadIdx.x >= groups * R) return;
  const int g = threadIdx.x / R, i = threadIdx.x % R;
  const int64_t d = ((int64_t)blockIdx.x * groups + g) * R + i;
  if (d >= down.rows) return;
  float s = 0.0f;
  bool first = true;
  for (int jj = 0; jj < k; ++jj) {
    const int ej = ids[jj];
    if (ej < 0 || ej >= down.n_expert || slot_pair[jj] < 0) continue;
    s = first ? w[jj] * part[g * k + jj][i] : fmaf(w[jj], part[g * k + jj][i], s);
    first = false;
  }
  x[d] += s;
}

// The one-row step's tiles: gate / up chunks in flight per lane and down output elements per warp. Chosen by
// test_cuda_moe --bench-only on an H100 (Qwen3-30B-A3B shape, 8 of 128 experts; docs/CUDA.md): 4 and 2 took
// BF16 experts from 25.1 to 22.1 us and Q8_0 from 36.5 to 22.6 us against the earlier 8 and 1.
constexpr int kDecodeGateUnroll = 4, kDecodeDownRows = 2;
int g_gate_u = 0, g_down_r = 0;  // set_moe_decode_tiles (0: the defaults above)

template <GgmlType T, int U>
void launch_gate_up1(const ExpertWeights& gate, const ExpertWeights& up, const float* xn, int k,
                     const MoeScratch& s, float limit, cudaStream_t stream) {
  const int ffn = (int)gate.rows;
  moe_gemv_kernel<T, true, 1, U>
      <<<dim3((unsigned)((ffn + kGemvWarps - 1) / kGemvWarps), (unsigned)k), kGemvWarps * 32, 0, stream>>>(
          gate, up, xn, s.pair_row, gate.cols, s.h, ffn, s.tiles, s.n_tiles, 0, limit);
}

template <GgmlType T, int R>
void launch_down1(const ExpertWeights& down, const int32_t* ids, const float* w, int k, float* x,
                  const MoeScratch& s, cudaStream_t stream) {
  const int64_t per_block = (int64_t)(kGemvWarps / k) * R;
  moe_down1_kernel<T, R><<<(unsigned)((down.rows + per_block - 1) / per_block), kGemvWarps * 32, 0, stream>>>(
      down, s.h, down.cols, ids, s.slot_pair, w, k, x);
}

template <GgmlType T>
cudaError_t launch_ffn1(const ExpertWeights& gate, const ExpertWeights& up, const ExpertWeights& down,
                        const float* xn, const int32_t* ids, const float* w, int k, float* x,
                        const MoeScratch& s, float limit, cudaStream_t stream) {
  const int ffn = (int)gate.rows, dim = (int)down.rows;
  switch (g_gate_u) {
    case 2:
      launch_gate_up1<T, 2>(gate, up, xn, k, s, limit, stream);
      break;
    case 8:
      launch_gate_up1<T, 8>(gate, up, xn, k, s, limit, stream);
      break;
    default:  // 4
      launch_gate_up1<T, kDecodeGateUnroll>(gate, up, xn, k, s, limit, stream);
      break;
  }
  if (kGemvWarps % k == 0) {
    switch (g_down_r) {
      case 1:
        launch_down1<T, 1>(down, ids, w, k, x, s, stream);
        break;
      case 4:
        launch_down1<T, 4>(down, ids, w, k, x, s, stream);
        break;
      default:  // 2
        launch_down1<T, kDecodeDownRows>(down, ids, w, k, x, s, stream);
        break;
    }
  } else {  // down per slot into y, then the weighted sum
    moe_gemv_kernel<T, false, 1>
        <<<dim3((unsigned)((dim + kGemvWarps - 1) / kGemvWarps), (unsigned)k), kGemvWarps * 32, 0, stream>>>(
            down, down, s.h, nullptr, ffn, s.y, dim, s.tiles, s.n_tiles, 0, 0.0f);
    moe_combine_kernel<<<1, kCombineThreads, 0, stream>>>(s.y, s.slot_pair, w, k, dim, x);
  }
  return cudaGetLastError();
}

template <GgmlType T>
cudaError_t launch_ffn(const ExpertWeights& gate, const ExpertWeights& up, const ExpertWeights& down,
                       const float* xn, const MoeScratch& s, int64_t max_tiles, float limit,
                       cudaStream_t stream) {
  const int ffn = (int)gate.rows, dim = (int)down.rows;
  moe_gemv_kernel<T, true>
      <<<dim3((unsigned)((ffn + kGemvWarps - 1) / kGemvWarps), (unsigned)max_tiles), kGemvWarps * 32, 0,
         stream>>>(gate, up, xn, s.pair_row, gate.cols, s.h, ffn, s.tiles, s.n_tiles, 0, limit);
  moe_gemv_kernel<T, false>
      <<<dim3((unsigned)((dim + kGemvWarps - 1) / kGemvWarps), (unsigned)max_tiles), kGemvWarps * 32, 0,
         stream>>>(down, down, s.h, nullptr, ffn, s.y, dim, s.tiles, s.n_tiles, 0, 0.0f);
  return cudaGetLastError();
}

// f(std::integral_constant<GgmlType, T>{}) for the expert kernels' weight type t (F32, F16, BF16, MXFP4, else
// Q8_0: moe_weights_ok has refused the others).
template <class F>
cudaError_t with_type(GgmlType t, F&& f) {
  switch (t) {
    case GgmlType::F32:
      return f(std::integral_constant<GgmlType, GgmlType::F32>{});
    case GgmlType::F16:
      return f(std::integral_constant<GgmlType, GgmlType::F16>{});
    case GgmlType::BF16:
      return f(std::integral_constant<GgmlType, GgmlType::BF16>{});
    case GgmlType::MXFP4:
      return f(std::integral_constant<GgmlType, GgmlType::MXFP4>{});
    default:
      return f(std::integral_constant<GgmlType, GgmlType::Q8_0>{});
  }
}

}  // namespace

void set_moe_decode_tiles(int gate_unroll, int down_rows) {
  g_gate_u = gate_unroll;
  g_down_r = down_rows;
}

bool moe_weights_ok(const ExpertWeights& w) {
  if (!w.data || w.rows <= 0 || w.cols <= 0 || w.n_expert <= 0 || w.cols % 8 != 0 || w.row_bytes % 16 != 0 ||
      !aligned16(w.data) || w.expert_bytes < (size_t)w.rows * w.row_bytes || w.expert_bytes % 16 != 0)
    return false;
  switch (w.type) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
      return w.row_bytes >= (size_t)(w.cols * dense_elem_bytes(w.type));
    case GgmlType::Q8_0:
      return w.cols % 32 == 0 && w.row_bytes >= lowbit_row_bytes(w.type, w.cols);
    case GgmlType::MXFP4:
      return w.cols % 32 == 0 && w.row_bytes >= moe_mxfp4_row_bytes(w.cols);
    default:
      return false;
  }
}

size_t moe_mxfp4_row_bytes(int64_t cols) {
  if (cols <= 0 || cols % kQK4 != 0) return 0;
  return ((size_t)cols / 2 + (size_t)cols / kQK4 + 15) / 16 * 16;
}

bool moe_pack_mxfp4_rows(const WeightView& w, int64_t r0, int64_t r1, void* out) {
  const size_t rb = moe_mxfp4_row_bytes(w.cols);
  if (w.type != GgmlType::MXFP4 || !rb || r0 < 0 || r1 > w.rows || r0 > r1) return false;
  const int64_t nb = w.cols / kQK4;
  for (int64_t r = r0; r < r1; ++r) {
    uint8_t* o = static_cast<uint8_t*>(out) + (size_t)(r - r0) * rb;
    std::memset(o, 0, rb);
    const auto* blocks =
        reinterpret_cast<const BlockMXFP4*>(static_cast<const uint8_t*>(w.data) + (size_t)r * w.row_bytes);
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t code[kQK4];  // ggml's block: element j in the low nibble of qs[j], j + 16 in the high one
      for (int j = 0; j < 16; ++j) code[j] = blocks[b].qs[j] & 0xF, code[j + 16] = blocks[b].qs[j] >> 4;
      for (int j = 0; j < 16; ++j) o[b * 16 + j] = (uint8_t)(code[2 * j] | (code[2 * j + 1] << 4));
      o[w.cols / 2 + b] = blocks[b].e;
    }
  }
  return true;
}

int64_t moe_max_tiles(int n_pairs, int n_expert, int tile_pairs) {
  return std::min<int64_t>(n_pairs, (n_pairs + tile_pairs - 1) / tile_pairs + n_expert);
}

size_t moe_scratch_bytes(int n_rows, int k, int n_expert, int ffn, int dim) {
  const size_t np = (size_t)n_rows * k;
  return align_up(3 * sizeof(int32_t) * (size_t)moe_max_tiles((int)np, n_expert)) +
         align_up(sizeof(int32_t)) + 2 * align_up(np * sizeof(int32_t)) + align_up(np * ffn * sizeof(float)) +
         align_up(np * dim * sizeof(float));
}

MoeScratch moe_scratch(void* mem, int n_rows, int k, int n_expert, int ffn, int dim) {
  const size_t np = (size_t)n_rows * k;
  uint8_t* p = static_cast<uint8_t*>(mem);
  auto take = [&](size_t bytes) {
    uint8_t* at = p;
    p += align_up(bytes);
    return at;
  };
  MoeScratch s;
  s.tiles = reinterpret_cast<int32_t*>(take(3 * sizeof(int32_t) * (size_t)moe_max_tiles((int)np, n_expert)));
  s.n_tiles = reinterpret_cast<int32_t*>(take(sizeof(int32_t)));
  s.pair_row = reinterpret_cast<int32_t*>(take(np * sizeof(int32_t)));
  s.slot_pair = reinterpret_cast<int32_t*>(take(np * sizeof(int32_t)));
  s.h = reinterpret_cast<float*>(take(np * ffn * sizeof(float)));
  s.y = reinterpret_cast<float*>(take(np * dim * sizeof(float)));
  return s;
}

cudaError_t moe_router(const ExpertWeights& r, const float* xn, int n, float* logits, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (!moe_weights_ok(r)) return cudaErrorInvalidValue;
  const dim3 grid((unsigned)((r.rows + kGemvWarps - 1) / kGemvWarps),
                  (unsigned)((n + kMoeTilePairs - 1) / kMoeTilePairs));
  return with_type(r.type, [&](auto t) {
    moe_gemv_kernel<decltype(t)::value, false><<<grid, kGemvWarps * 32, 0, stream>>>(
        r, r, xn, nullptr, r.cols, logits, r.rows, nullptr, nullptr, n, 0.0f);
    return cudaGetLastError();
  });
}

namespace {
bool route_shape_ok(int n_expert, int k) {
  return n_expert > 0 && n_expert <= kMoeMaxRouted && k >= 1 && k <= n_expert && k <= kMoeMaxUsed;
}
}  // namespace

cudaError_t moe_route(float* logits, int n, int n_expert, int k, bool norm, int32_t* ids, float* w,
                      cudaStream_t stream, const MoeScratch* decode_tiles) {
  if (n <= 0) return cudaSuccess;
  if (!route_shape_ok(n_expert, k)) return cudaErrorInvalidValue;
  moe_route_kernel<<<(n + kRouteWarps - 1) / kRouteWarps, kRouteWarps * 32, 0, stream>>>(
      logits, n, n_expert, k, norm, ids, w, n == 1 && decode_tiles ? *decode_tiles : MoeScratch{});
  return cudaGetLastError();
}

cudaError_t moe_route_topk_softmax(const float* logits, int n, int n_expert, int k, int32_t* ids, float* w,
                                   cudaStream_t stream, const MoeScratch* decode_tiles) {
  if (n <= 0) return cudaSuccess;
  if (!route_shape_ok(n_expert, k)) return cudaErrorInvalidValue;
  moe_route_topk_softmax_kernel<<<(n + kRouteWarps - 1) / kRouteWarps, kRouteWarps * 32, 0, stream>>>(
      logits, n, n_expert, k, ids, w, n == 1 && decode_tiles ? *decode_tiles : MoeScratch{});
  return cudaGetLastError();
}

cudaError_t moe_ffn(const ExpertWeights& gate, const ExpertWeights& up, const ExpertWeights& down,
                    const float* xn, int n, const int32_t* ids, const float* w, int k, float* x,
                    const MoeScratch& s, cudaStream_t stream, bool tiles_ready, float swiglu_limit) {
  if (n <= 0) return cudaSuccess;
  const int n_expert = gate.n_expert;
  if (!moe_weights_ok(gate) || !moe_weights_ok(up) || !moe_weights_ok(down) || up.type != gate.type ||
      down.type != gate.type || up.rows != gate.rows || up.cols != gate.cols || down.cols != gate.rows ||
      down.rows != gate.cols || up.n_expert != n_expert || down.n_expert != n_expert ||
      n_expert > kMoeMaxExperts || k < 1 || k > n_expert || !(swiglu_limit >= 0.0f))
    return cudaErrorInvalidValue;
  if (n == 1 && tiles_ready) {  // decode: moe_route made a tile per slot
    return with_type(gate.type, [&](auto t) {
      return launch_ffn1<decltype(t)::value>(gate, up, down, xn, ids, w, k, x, s, swiglu_limit, stream);
    });
  }
  const int n_pairs = n * k, dim = (int)down.rows;
  // More than 32 rows: tensor cores over tiles of up to 64 pairs (BF16 operands, as the dense prefill).
  const bool mma = n > kMoeExactMaxRows && gate.cols % kMmaK == 0 && down.cols % kMmaK == 0;
  const int tile_pairs = mma ? kMmaM : kMoeTilePairs;
  const int64_t max_tiles = moe_max_tiles(n_pairs, n_expert, tile_pairs);
  const int threads = (n_expert + 31) / 32 * 32;
  moe_group_kernel<<<1, threads, (3 * n_expert + 2) * sizeof(int32_t), stream>>>(
      ids, n_pairs, k, n_expert, tile_pairs, s.tiles, s.n_tiles, s.pair_row, s.slot_pair);
  const cudaError_t e = with_type(gate.type, [&](auto t) {
    constexpr GgmlType T = decltype(t)::value;
    return mma ? launch_ffn_mma<T>(gate, up, down, xn, s, max_tiles, swiglu_limit, stream)
               : launch_ffn<T>(gate, up, down, xn, s, max_tiles, swiglu_limit, stream);
  });
  if (e != cudaSuccess) return e;
  moe_combine_kernel<<<n, kCombineThreads, 0, stream>>>(s.y, s.slot_pair, w, k, dim, x);
  return cudaGetLastError();
}

cudaError_t sigmoid_gate_add(const float* y, const float* gate_w, const float* xn, int n, int dim, float* x,
                             cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  sigmoid_gate_add_kernel<<<(n + 3) / 4, 128, 0, stream>>>(y, gate_w, xn, n, dim, x);
  return cudaGetLastError();
}

}  // namespace ultra::cuda
