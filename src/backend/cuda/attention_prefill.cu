// Tiled causal attention for prefill rows (flash-attention style); kernels.h states the contract.
//
// Block (128 threads = 4 warps) = a list of up to 64 rows, H query heads h0..h0+H-1 of one kv head, and that
// kv head's K/V. M-row m (0..63) of the block's MMAs is (row slot m / H, head m % H); warp w owns M-rows
// 16w..16w+15. One 1-D grid holds two kinds of blocks, told apart on the device:
//  * tile blocks, Y x n_tiles (Y = n_kv_heads x head chunks), tile i = rows [i R, i R + R) with R = 64 / H,
//    the last tiles (the longest rows of a causal chunk) first. A tile block works only when its tile is
//    uniform (tile_uniform: first row valid, last row of the same sequence at the position that makes the
//    run consecutive); otherwise it exits at once.
//  * fallback blocks, Y x F: fallback block f takes the rows f, f + F, f + 2F, ... that lie in non-uniform
//    tiles, 64 candidates at a time.
// So every row has exactly one owner per y, whatever the rows are. A block processes its list in passes:
// warp 0 picks the sequence of the first pending row and takes up to R pending rows of that sequence (list
// order) as the pass's row slots; padding rows (seq < 0, seq >= n_slots or pos < 0) get zero outputs.
// A pass:
//   Q of the slots' rows (zero for empty slots) as A fragments in registers, rounded to the cache type.
//   K and V tiles of 64 positions of [0, longest slot length) by cp.async into shared memory, 16-byte
//   chunk c of row r stored at chunk c ^ (r % 8) (ldmatrix without bank conflicts), rows past the length
//   zero-filled, two tiles in flight.
//   Per tile, each warp with a used M-row: S = Q K^T (m16n8k16, K by ldmatrix) in f32, scaled to the log2
//   domain, masked (position < length of the row) where the tile reaches past the shortest slot's length;
//   online softmax per M-row (running max and sum in f32, exp2f); P rounded to the cache type straight
//   from the S accumulators into A fragments; O += P V (V by ldmatrix.trans).
//   O / sum to out (float2 per lane).
// Empty slots compute on zero Q over the pass's longest length (finite values) and are never stored.
#include <climits>

#include "backend/cuda/attention_tiled.h"
#include "backend/cuda/common.cuh"
#include "backend/cuda/tuning.h"

namespace ultra::cuda {

using namespace detail;

namespace {

constexpr int kThreads = 128;      // 4 warps x 16 M-rows
constexpr int kM = 64;             // M-rows (row slot, head) per block
constexpr int kN = 64;             // positions per K/V tile
constexpr int kList = 64;          // rows of a block's list
constexpr int kMaxHeads = 16;      // query heads per block (R = 64 / H >= 4 rows)
constexpr int kFallbackPerSm = 2;  // fallback blocks: about this many per SM over all y

struct TArgs {
  KvLayerView kv;
  const float* q;      // [n, n_heads, hd]
  const int32_t* pos;  // [n]
  const int32_t* seq;  // [n]
  float* out;          // [n, n_heads, hd]
  int n;
  int n_heads;
  int group;           // n_heads / n_kv_heads
  int heads;           // H, a power of two dividing group
  int log2_heads;      // log2(H)
  int rows;            // R = 64 / H
  int head_chunks;     // group / H
  int ys;              // n_kv_heads * head_chunks
  int n_tiles;         // ceil(n / R)
  int fallback;        // F, 1..n
  float scale_log2;    // scale * log2(e)
  const float* sinks;  // [n_heads] or null: head h's sink logit in the softmax's denominator (gpt-oss)
};

template <int HD>
constexpr size_t smem_bytes() {
  return (size_t)2 * 2 * kN * HD * 2;  // 2 stages x (K tile, V tile) of 16-bit elements
}

int heads_per_block(int group) {
  int h = 1;
  while (h < kMaxHeads && group % (2 * h) == 0) h *= 2;
  return h;
}

__device__ __forceinline__ int row_len(const TArgs& a, int s, int p) {
  if (s < 0 || s >= a.kv.n_slots || p < 0) return 0;  // padding
  return p < a.kv.max_ctx ? p + 1 : a.kv.max_ctx;
}

// The tile's first row is valid and its last row (in [0, n)) is of the same sequence at the position that
// a run of consecutive positions would give it. Only a hint for speed: the tile block handles any rows.
__device__ __forceinline__ bool tile_uniform(const TArgs& a, int tile) {
  const int r0 = tile * a.rows;
  const int r1 = (r0 + a.rows < a.n ? r0 + a.rows : a.n) - 1;
  const int s0 = __ldcg(a.seq + r0), p0 = __ldcg(a.pos + r0);
  if (s0 < 0 || s0 >= a.kv.n_slots || p0 < 0) return false;
  const int s1 = __ldcg(a.seq + r1), p1 = __ldcg(a.pos + r1);
  return s1 == s0 && (int64_t)p1 - p0 == (int64_t)r1 - r0;
}

// One pass over the row slots p_row[0, R) (-1: empty) of sequence sq: lengths p_len, longest max_len,
// shortest min_len (over the used slots). Called by all threads; starts and ends with no copy in flight.
template <GgmlType KT, int HD>
__device__ __forceinline__ void tiled_pass(const TArgs& a, uint8_t* smem, const int* p_row, const int* p_len,
                                           int max_len, int min_len, int sq, int kvh, int h0) {
  constexpr int kCpr = HD / 8;  // 16-byte chunks per K / V row
  constexpr uint32_t kRowBytes = HD * 2;
  constexpr uint32_t kTileBytes = kN * kRowBytes;
  constexpr int kKs = HD / 16;  // k-steps of S = Q K^T
  constexpr int kDn = HD / 8;   // 8-column n-tiles of O
  constexpr int kCopies = kN * kCpr / kThreads;
  static_assert(kN * kCpr % kThreads == 0, "copy split");
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;

  const int m0 = warp * 16 + g, m1 = m0 + 8;  // this lane's M-rows (accumulator rows g and g + 8)
  const int sl0 = m0 >> a.log2_heads, sl1 = m1 >> a.log2_heads;
  const int row0 = p_row[sl0], row1 = p_row[sl1];
  const int lim0 = row0 >= 0 ? p_len[sl0] : max_len;
  const int lim1 = row1 >= 0 ? p_len[sl1] : max_len;
  const int hmask = a.heads - 1;
  const float* q0 = row0 >= 0 ? a.q + ((int64_t)row0 * a.n_heads + h0 + (m0 & hmask)) * HD : nullptr;
  const float* q1 = row1 >= 0 ? a.q + ((int64_t)row1 * a.n_heads + h0 + (m1 & hmask)) * HD : nullptr;
  const bool warp_used = __any_sync(kFullMask, row0 >= 0 || row1 >= 0);

  const int64_t slot_rows = ((int64_t)sq * a.kv.n_kv_heads + kvh) * a.kv.max_ctx;
  const uint8_t* kg = static_cast<const uint8_t*>(a.kv.k) + slot_rows * kRowBytes;
  const uint8_t* vg = static_cast<const uint8_t*>(a.kv.v) + slot_rows * kRowBytes;
  const uint32_t sbase = smem_addr(smem);
  const int n_kt = (max_len + kN - 1) / kN;
  // Copies: chunk ch = tid % kCpr of rows tid / kCpr + k * kRowStep (the same chunk and row % 8 for every k).
  constexpr int kRowStep = kThreads / kCpr;
  static_assert(kRowStep % 8 == 0, "swizzle period");
  const int cr = tid / kCpr, cch = tid % kCpr;
  const uint32_t c_soff = (uint32_t)cr * kRowBytes + ((uint32_t)(cch ^ (cr & 7)) << 4);
  const uint8_t* kg_t = kg + (int64_t)cr * kRowBytes + cch * 16;
  const uint8_t* vg_t = vg + (int64_t)cr * kRowBytes + cch * 16;
  auto issue = [&](int i) {  // K/V tile i -> stage i % 2 (all threads); rows past max_len zero-filled
    const int j0 = i * kN;
    const int np = max_len - j0;  // rows of the tile to read (>= 1; may exceed kN)
    const uint32_t kst = sbase + (uint32_t)(i & 1) * 2 * kTileBytes + c_soff, vst = kst + kTileBytes;
    const int64_t gofs = (int64_t)j0 * kRowBytes;
#pragma unroll
    for (int k = 0; k < kCopies; ++k) {
      const bool ok = cr + k * kRowStep < np;  // else nothing is read (src: the slot's first row)
      const int64_t go = gofs + (int64_t)k * kRowStep * kRowBytes;
      cp_async16(kst + k * kRowStep * kRowBytes, ok ? kg_t + go : kg, ok ? 16u : 0u);
      cp_async16(vst + k * kRowStep * kRowBytes, ok ? vg_t + go : vg, ok ? 16u : 0u);
    }
  };
  // ldmatrix addresses (relative to the stage): lane l gives row (l % 8) + 8 * (one bit of l) of the 16 rows
  // of a step and chunk 2c + (another bit of l) for c = 0..3 (+ 8 per 4 steps of c: the swizzle keeps bit 3),
  // swizzled with row % 8 = l % 8.
  uint32_t k_off[4], v_off[4];
  {
    const int x = lane & 7;
    const uint32_t kr = (uint32_t)(((lane >> 4) << 3) + x) * kRowBytes;  // K: rows +8 for lanes 16..31
    const uint32_t vr =
        (uint32_t)((((lane >> 3) & 1) << 3) + x) * kRowBytes;  // V: rows +8 for lanes 8..15, 24..31
    const int kb = (lane >> 3) & 1, vb = lane >> 4;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      k_off[c] = kr + ((uint32_t)((2 * c + kb) ^ x) << 4);
      v_off[c] = vr + ((uint32_t)((2 * c + vb) ^ x) << 4);
    }
  }
  issue(0);
  cp_async_commit();

  // Q as A fragments: qa[ks] = Q[m0][c, c+1], Q[m1][c, c+1], Q[m0][c+8, c+9], Q[m1][c+8, c+9], c = 16 ks + 2
  // t4
  uint32_t qa[kKs][4];
#pragma unroll
  for (int ks = 0; ks < kKs; ++ks) {
    const int c = 16 * ks + 2 * t4;
    const float2 z = make_float2(0.0f, 0.0f);
    const float2 x00 = q0 ? __ldcg(reinterpret_cast<const float2*>(q0 + c)) : z;
    const float2 x01 = q0 ? __ldcg(reinterpret_cast<const float2*>(q0 + c + 8)) : z;
    const float2 x10 = q1 ? __ldcg(reinterpret_cast<const float2*>(q1 + c)) : z;
    const float2 x11 = q1 ? __ldcg(reinterpret_cast<const float2*>(q1 + c + 8)) : z;
    qa[ks][0] = pack2<KT>(x00.x, x00.y);
    qa[ks][1] = pack2<KT>(x10.x, x10.y);
    qa[ks][2] = pack2<KT>(x01.x, x01.y);
    qa[ks][3] = pack2<KT>(x11.x, x11.y);
  }

  float o[kDn][4];
#pragma unroll
  for (int d = 0; d < kDn; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  float mrun[2] = {-INFINITY, -INFINITY},
        lrun[2] = {0.0f, 0.0f};  // per M-row m0, m1 (lrun: this lane's part)

  for (int i = 0; i < n_kt; ++i) {
    if (i + 1 < n_kt) issue(i + 1);
    cp_async_commit();   // possibly empty: keeps one group per iteration
    cp_async_wait<1>();  // this thread's copies of tile i landed
    __syncthreads();     // everyone's did
    if (warp_used) {
      const uint32_t kst = sbase + (uint32_t)(i & 1) * 2 * kTileBytes, vst = kst + kTileBytes;
      // ---- S = Q K^T: n-tile j = positions 8j..8j+7 of the tile; s[j] = S[g][8j + 2t4, +1], S[g+8][...]
      float s[8][4];
#pragma unroll
      for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < kKs; ++ks)
#pragma unroll
        for (int jp = 0; jp < 4; ++jp) {
          // matrices: rows 16jp + (0..7 | 8..15) x chunks 2ks, 2ks + 1 -> b0, b1 of n-tiles 2jp, 2jp + 1
          uint32_t bk[4];
          ldsm_x4(bk, kst + k_off[ks & 3] + (uint32_t)(16 * jp) * kRowBytes + (uint32_t)(ks >> 2) * 128);
          mma_16816<KT>(s[2 * jp], qa[ks], bk[0], bk[1]);
          mma_16816<KT>(s[2 * jp + 1], qa[ks], bk[2], bk[3]);
        }
      // ---- scale, causal mask, online softmax
      const int j0 = i * kN;
      const bool need_mask = j0 + kN > min_len;  // block-uniform
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float v = s[j][e] * a.scale_log2;
          if (need_mask && j0 + 8 * j + 2 * t4 + (e & 1) >= (e < 2 ? lim0 : lim1)) v = -INFINITY;
          s[j][e] = v;
          mx[e >> 1] = fmaxf(mx[e >> 1], v);
        }
      float alpha[2], mu[2];
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        mx[x] = fmaxf(mx[x], __shfl_xor_sync(kFullMask, mx[x], 1));
        mx[x] = fmaxf(mx[x], __shfl_xor_sync(kFullMask, mx[x], 2));
        const float m_new = fmaxf(mrun[x], mx[x]);
        mu[x] = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing unmasked yet (not after tile 0)
        alpha[x] = exp2f(mrun[x] - mu[x]);          // 0 on the first tile
        mrun[x] = m_new;
      }
      float rs[2] = {0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float p = exp2f(s[j][e] - mu[e >> 1]);
          s[j][e] = p;
          rs[e >> 1] += p;
        }
      lrun[0] = lrun[0] * alpha[0] + rs[0];
      lrun[1] = lrun[1] * alpha[1] + rs[1];
#pragma unroll
      for (int d = 0; d < kDn; ++d) {
        o[d][0] *= alpha[0];
        o[d][1] *= alpha[0];
        o[d][2] *= alpha[1];
        o[d][3] *= alpha[1];
      }
      // ---- O += P V: k-step kk = positions 16kk..16kk+15 (the S accumulators of n-tiles 2kk, 2kk + 1)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        uint32_t pa[4];
        pa[0] = pack2<KT>(s[2 * kk][0], s[2 * kk][1]);
        pa[1] = pack2<KT>(s[2 * kk][2], s[2 * kk][3]);
        pa[2] = pack2<KT>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[3] = pack2<KT>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int dp = 0; dp < kDn / 2; ++dp) {
          // matrices: rows 16kk + (0..7 | 8..15) x chunks 2dp, 2dp + 1, transposed -> b0, b1 of n-tiles
          // 2dp, 2dp + 1 (columns 16dp..16dp+15 of head_dim)
          uint32_t bv[4];
          ldsm_x4_trans(bv,
                        vst + v_off[dp & 3] + (uint32_t)(16 * kk) * kRowBytes + (uint32_t)(dp >> 2) * 128);
          mma_16816<KT>(o[2 * dp], pa, bv[0], bv[1]);
          mma_16816<KT>(o[2 * dp + 1], pa, bv[2], bv[3]);
        }
      }
    }
    __syncthreads();  // stage i % 2 is free for tile i + 2
  }

  if (warp_used) {
    float inv[2];
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      float l = lrun[x];
      l += __shfl_xor_sync(kFullMask, l, 1);
      l += __shfl_xor_sync(kFullMask, l, 2);
      if (a.sinks)  // the sink's exp(sink - m) in the log2 domain of the scores, m the row's final max
        l += exp2f(__ldg(a.sinks + h0 + ((x == 0 ? m0 : m1) & hmask)) * 1.4426950408889634f - mrun[x]);
      inv[x] = 1.0f / l;
    }
    if (row0 >= 0) {
      float* d0 = a.out + ((int64_t)row0 * a.n_heads + h0 + (m0 & hmask)) * HD + 2 * t4;
#pragma unroll
      for (int d = 0; d < kDn; ++d)
        *reinterpret_cast<float2*>(d0 + 8 * d) = make_float2(o[d][0] * inv[0], o[d][1] * inv[0]);
    }
    if (row1 >= 0) {
      float* d1 = a.out + ((int64_t)row1 * a.n_heads + h0 + (m1 & hmask)) * HD + 2 * t4;
#pragma unroll
      for (int d = 0; d < kDn; ++d)
        *reinterpret_cast<float2*>(d1 + 8 * d) = make_float2(o[d][2] * inv[1], o[d][3] * inv[1]);
    }
  }
}

template <GgmlType KT, int HD>
__global__ void __launch_bounds__(kThreads, 2) tiled_attn_kernel(TArgs a) {
  extern __shared__ __align__(128) uint8_t tiled_smem[];
  __shared__ int l_row[kList], l_seq[kList], l_len[kList];  // the block's list of rows
  __shared__ int p_row[kList], p_len[kList];                // the pass's row slots (R of them used)
  __shared__ int s_info[5];      // list length; pass: slots used (0: done), max len, min len, sequence
  __shared__ uint32_t s_pad[2];  // padding entries of the list
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint32_t lt_mask = (1u << lane) - 1;

  pdl_trigger();
  pdl_wait();

  const int n_tile_blocks = a.ys * a.n_tiles;
  const int b = blockIdx.x;
  const bool tile_mode = b < n_tile_blocks;
  int y, tile = 0, f = 0;
  if (tile_mode) {
    y = b % a.ys;
    tile = a.n_tiles - 1 - b / a.ys;
    if (!tile_uniform(a, tile)) return;  // its rows belong to the fallback blocks (block-uniform exit)
  } else {
    y = (b - n_tile_blocks) % a.ys;
    f = (b - n_tile_blocks) / a.ys;
  }
  const int kvh = y / a.head_chunks;
  const int h0 = kvh * a.group + (y % a.head_chunks) * a.heads;
  const int n_cand = tile_mode ? 1 : (a.n - f + a.fallback - 1) / a.fallback;  // rows f + c F < n

  for (int c0 = 0; c0 < n_cand; c0 += kList) {
    uint32_t pend[2] = {0u, 0u};  // warp 0: list entries not yet processed
    if (warp == 0) {
      int nl;
      if (tile_mode) {
        const int r0 = tile * a.rows;
        nl = a.n - r0 < a.rows ? a.n - r0 : a.rows;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int e = lane + 32 * h;
          if (e < nl) {
            const int t = r0 + e, s = __ldcg(a.seq + t);
            l_row[e] = t;
            l_seq[e] = s;
            l_len[e] = row_len(a, s, __ldcg(a.pos + t));
          }
        }
      } else {
        uint32_t m[2];
        int tr[2];
        bool ok[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int c = c0 + lane + 32 * h;
          ok[h] = c < n_cand;
          tr[h] = ok[h] ? f + c * a.fallback : 0;
          ok[h] = ok[h] && !tile_uniform(a, tr[h] / a.rows);
          m[h] = __ballot_sync(kFullMask, ok[h]);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h)
          if (ok[h]) {
            const int e = (h ? __popc(m[0]) : 0) + __popc(m[h] & lt_mask);
            const int t = tr[h], s = __ldcg(a.seq + t);
            l_row[e] = t;
            l_seq[e] = s;
            l_len[e] = row_len(a, s, __ldcg(a.pos + t));
          }
        nl = __popc(m[0]) + __popc(m[1]);
      }
      __syncwarp();
      uint32_t pad[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int e = lane + 32 * h;
        const int len = e < nl ? l_len[e] : -1;
        pend[h] = __ballot_sync(kFullMask, len > 0);
        pad[h] = __ballot_sync(kFullMask, len == 0);
      }
      if (lane == 0) s_info[0] = nl, s_pad[0] = pad[0], s_pad[1] = pad[1];
    }
    __syncthreads();

    // padding rows: zero outputs for this block's heads
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t pm = s_pad[h];
      while (pm) {
        const int e = 32 * h + __ffs(pm) - 1;
        pm &= pm - 1;
        float* o = a.out + ((int64_t)l_row[e] * a.n_heads + h0) * (int64_t)a.kv.head_dim;
        for (int i = tid; i < a.heads * a.kv.head_dim; i += kThreads) o[i] = 0.0f;
      }
    }

    for (;;) {
      if (warp == 0) {  // next pass: up to R pending rows of the first pending row's sequence
        if ((pend[0] | pend[1]) == 0) {
          if (lane == 0) s_info[1] = 0;
        } else {
          const int first = pend[0] ? __ffs(pend[0]) - 1 : 32 + __ffs(pend[1]) - 1;
          const int cur = l_seq[first];
          uint32_t mt[2];
#pragma unroll
          for (int h = 0; h < 2; ++h)
            mt[h] = __ballot_sync(kFullMask, ((pend[h] >> lane) & 1u) && l_seq[lane + 32 * h] == cur);
          const int n0 = __popc(mt[0]);
          const int used = n0 + __popc(mt[1]) < a.rows ? n0 + __popc(mt[1]) : a.rows;
          for (int j = lane; j < a.rows; j += 32)
            if (j >= used) p_row[j] = -1;
          int mx = 0, mn = INT_MAX;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int rank = (h ? n0 : 0) + __popc(mt[h] & lt_mask);
            const bool take = ((mt[h] >> lane) & 1u) && rank < a.rows;
            if (take) {
              const int e = lane + 32 * h, len = l_len[e];
              p_row[rank] = l_row[e];
              p_len[rank] = len;
              mx = len > mx ? len : mx;
              mn = len < mn ? len : mn;
            }
            pend[h] &= ~__ballot_sync(kFullMask, take);
          }
          mx = __reduce_max_sync(kFullMask, mx);
          mn = __reduce_min_sync(kFullMask, mn);
          if (lane == 0) s_info[1] = used, s_info[2] = mx, s_info[3] = mn, s_info[4] = cur;
        }
      }
      __syncthreads();
      if (s_info[1] == 0) break;  // block-uniform
      tiled_pass<KT, HD>(a, tiled_smem, p_row, p_len, s_info[2], s_info[3], s_info[4], kvh, h0);
      __syncthreads();  // p_row / p_len / s_info are rewritten next
    }
  }
}

template <GgmlType KT, int HD>
cudaError_t set_limits(const DeviceInfo& dev) {
  if (dev.smem_optin_bytes && smem_bytes<HD>() > dev.smem_optin_bytes) return cudaErrorInvalidValue;
  cudaError_t e = cudaFuncSetAttribute(tiled_attn_kernel<KT, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)smem_bytes<HD>());
  if (e != cudaSuccess) return e;
  return cudaFuncSetAttribute(tiled_attn_kernel<KT, HD>, cudaFuncAttributePreferredSharedMemoryCarveout,
                              (int)cudaSharedmemCarveoutMaxShared);
}

template <GgmlType KT, int HD>
cudaError_t launch(const TArgs& a, int blocks, bool pdl, cudaStream_t stream) {
  return launch_ex(tiled_attn_kernel<KT, HD>, dim3(blocks), dim3(kThreads), smem_bytes<HD>(), stream, 1, pdl,
                   a);
}

bool supported(const KvLayerView& kv) {
  return (kv.type == GgmlType::F16 || kv.type == GgmlType::BF16) && (kv.head_dim == 64 || kv.head_dim == 128);
}

}  // namespace

namespace detail {

bool tiled_attention_setup(const DeviceInfo& dev, const KvLayerView& kv, int n_heads, int max_rows,
                           int* fallback_blocks) {
  *fallback_blocks = 0;
  if (!supported(kv) || kv.n_kv_heads <= 0 || n_heads <= 0 || n_heads % kv.n_kv_heads != 0 || max_rows <= 0)
    return false;
  const bool f16 = kv.type == GgmlType::F16;
  const cudaError_t e =
      kv.head_dim == 64 ? (f16 ? set_limits<GgmlType::F16, 64>(dev) : set_limits<GgmlType::BF16, 64>(dev))
                        : (f16 ? set_limits<GgmlType::F16, 128>(dev) : set_limits<GgmlType::BF16, 128>(dev));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: keep it from surfacing in a later launcher's status
    return false;
  }
  const int group = n_heads / kv.n_kv_heads;
  const int64_t ys = (int64_t)kv.n_kv_heads * (group / heads_per_block(group));
  const int64_t slots = (int64_t)(dev.n_sms > 0 ? dev.n_sms : 132) * kFallbackPerSm;
  int64_t fb = (slots + ys - 1) / ys;
  if (fb > max_rows) fb = max_rows;
  *fallback_blocks = fb < 1 ? 1 : (int)fb;
  return true;
}

cudaError_t tiled_attention(const AttentionPlan& plan, const KvLayerView& kv, const float* q, int n,
                            const int32_t* pos, const int32_t* seq, float scale, float* out,
                            cudaStream_t stream, const float* sinks) {
  if (!plan.tiled || plan.tiled_fallback_blocks <= 0 || n <= 0 || !supported(kv) || kv.n_kv_heads <= 0 ||
      plan.n_heads % kv.n_kv_heads != 0 || !aligned16(q) || !aligned16(out))
    return cudaErrorInvalidValue;
  TArgs a;
  a.kv = kv;
  a.q = q;
  a.pos = pos;
  a.seq = seq;
  a.out = out;
  a.sinks = sinks;
  a.n = n;
  a.n_heads = plan.n_heads;
  a.group = plan.n_heads / kv.n_kv_heads;
  a.heads = heads_per_block(a.group);
  a.log2_heads = 0;
  while ((1 << a.log2_heads) < a.heads) ++a.log2_heads;
  a.rows = kM / a.heads;
  a.head_chunks = a.group / a.heads;
  a.ys = kv.n_kv_heads * a.head_chunks;
  a.n_tiles = (n + a.rows - 1) / a.rows;
  a.fallback = plan.tiled_fallback_blocks < n ? plan.tiled_fallback_blocks : n;
  a.scale_log2 = scale * 1.4426950408889634f;
  const int64_t blocks = (int64_t)a.ys * (a.n_tiles + a.fallback);
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  const bool f16 = kv.type == GgmlType::F16;
  const cudaError_t e = kv.head_dim == 64
                            ? (f16 ? launch<GgmlType::F16, 64>(a, (int)blocks, plan.tuning.pdl, stream)
                                   : launch<GgmlType::BF16, 64>(a, (int)blocks, plan.tuning.pdl, stream))
                            : (f16 ? launch<GgmlType::F16, 128>(a, (int)blocks, plan.tuning.pdl, stream)
                                   : launch<GgmlType::BF16, 128>(a, (int)blocks, plan.tuning.pdl, stream));
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}

}  // namespace detail

}  // namespace ultra::cuda
