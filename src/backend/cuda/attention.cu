// Causal GQA attention over the slotted KV cache, split over positions (flash-decoding).
//
// Block (128 threads = 4 warps) = one row t, one kv head, up to 8 query heads of its group (heads h0..h0+7)
// and one chunk of positions. The chunk is a fixed fraction of the row's own length (len = pos[t] + 1
// split into n_splits chunks rounded up to 64 positions), so the grid is static and short rows leave the
// late splits empty. The K and V rows of a tile of 64 positions are contiguous in the cache, so one thread
// brings each into shared memory with a single bulk copy (cp.async.bulk, completing on an mbarrier); a
// ring of `stages` tiles is in flight, and K and V of a tile arrive together (one memory round trip per
// tile, none while the block computes). Per tile:
//   QK^T  on tensor cores as in gemv: warp w takes positions 16w..16w+15 (its MMA rows, K from shared
//         memory), the 8 heads are the MMA's n = 8 columns (q split hi + lo in TF32, kept in shared memory
//         as each lane's B fragments, one 16-byte read per MMA pair; K is exact in TF32 for F16 / BF16,
//         split for F32), scores in the log2 domain.
//   softmax  online (running max m, sum l per head), in f32 with exp2f.
//   P.V   SIMT: thread (position group, 8-wide chunk of head_dim) keeps HEADS (4 or 8) heads x 8 dims of
//         output, reads V chunks and the probabilities from shared memory.
// At the end the position groups are reduced in shared memory; with one split the block writes out / l,
// else the partial (m, l, unnormalised out) goes to the workspace and attn_combine merges the splits.
// Steps of many rows (prefill chunks) go to the tiled kernel of attention_prefill.cu instead when the plan
// allows it (attention_tiled).
// Both kernels are launched with programmatic dependent launch (AttentionTuning::pdl). The split kernel
// reads pos / seq and starts the copies of K / V tiles that this step cannot have written before its
// griddepcontrol.wait; it lets the next kernel launch only at its exit (AttentionTuning::trigger), and
// attn_combine only after its wait: a projection launched while the split kernel still ran made the decode
// step slower (measured on the H200, docs/CUDA.md), as did the split kernel launched during the QKV
// projection (RoPE + KV write, the kernel in between, therefore triggers after its wait).
#include "backend/cuda/attention_tiled.h"
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/tuning.h"

namespace ultra::cuda {

namespace {
AttentionTuning g_attention;  // the process-wide values tuning.h's set_attention_* set
}  // namespace

namespace tuning {
void set_attention_combine_pdl(bool on) {
  g_attention.combine_pdl = on;
}
void set_attention_trigger(int where) {
  g_attention.trigger = where;
}
void set_attention_tiled(int mode) {
  g_attention.tiled = mode;
}
void set_attention_pdl(bool on) {
  g_attention.pdl = on;
}
void set_attention_stage(int stage) {
  g_attention.stage = stage;
}
void set_attention_min_chunk(int positions) {
  g_attention.min_chunk = attention_min_chunk(positions);
}
void set_attention_stages(int stages) {
  g_attention.max_stages = stages;
}
}  // namespace tuning

using namespace detail;

namespace {

constexpr int kThreads = 128;  // 4 warps
constexpr int kTile = 64;      // positions per tile, 16 per warp
constexpr int kHeads = 8;      // query heads per block (the MMA's n)
constexpr int kMaxHd = 256;
constexpr int kMaxStages = 4;
constexpr size_t kStageBudget = 64 << 10;  // K + V tiles in flight per block (hd 128 F16: 2 stages)
constexpr int kMaxSplits = 256;
constexpr int kRedFloats = kThreads * 32;  // cross position-group reduction, 4 heads at a time

struct AttnArgs {
  KvLayerView kv;
  const float* q;  // [n, n_heads, hd]
  int n_heads;
  int group;        // n_heads / n_kv_heads
  int head_chunks;  // ceil(group / 8)
  int n_splits;
  int min_chunk;       // positions per split at least (a multiple of kTile)
  int stages;          // tiles in flight
  uint32_t row_bytes;  // head_dim * element size
  const int32_t* pos;  // [n]
  const int32_t* seq;  // [n]
  float scale_log2;    // scale * log2(e)
  float* out;          // [n, n_heads, hd]
  float* ws_acc;       // [n, n_heads, n_splits, hd]
  float* ws_ml;        // [n, n_heads, n_splits, 2]: max (log2 domain), sum
  int trigger;         // split kernel's pdl_trigger: 0 at the start, 1 after the tile loop, 2 never (at exit)
  float scale;         // scores: s = scale q.k, then softcap tanh(s / softcap) when softcap > 0 (Gemma 2)
  float softcap;
  int window;          // > 0: position j attends to j' > j - window only (sliding-window layers)
  const float* sinks;  // [n_heads] or null: head h's sink logit (natural log domain), in the denominator
};

// The sink's term of head h's softmax denominator relative to the running max m (log2 domain): 0 without
// sinks.
__device__ __forceinline__ float sink_term(const AttnArgs& a, int h, float m) {
  return a.sinks ? exp2f(__ldg(a.sinks + h) * 1.4426950408889634f - m) : 0.0f;
}

// Dynamic shared memory: the q fragments [ceil(hd / 32)][4][32 lanes] uint4 (qh0, qh1, ql0, ql1), the
// scores of a tile [64][8] (turned into probabilities in place), m / l / alpha [8], the stage barriers, then
// the stages (K tile, V tile) x stages, 128-byte aligned; the reduction buffer of the end reuses the stage
// area. head_dim 128 F16 with 2 stages: 74 KB, 3 blocks per SM.
struct AttnLayout {
  size_t p, ml, bars, stages, total;
  __host__ __device__ AttnLayout(int hd, int n_stages, uint32_t row_bytes) {
    p = (size_t)((hd + 31) / 32) * 4 * 32 * sizeof(uint4);
    ml = p + (size_t)kTile * kHeads * sizeof(float);
    bars = (ml + 3 * kHeads * sizeof(float) + 15) / 16 * 16;
    stages = (bars + kMaxStages * sizeof(uint64_t) + 127) / 128 * 128;
    size_t st = (size_t)n_stages * 2 * kTile * row_bytes;
    if (st < kRedFloats * sizeof(float)) st = kRedFloats * sizeof(float);
    total = stages + st;
  }
};

// Row length and chunk of positions per split; attn_combine uses the same formula.
__device__ __forceinline__ int row_len(const AttnArgs& a, int t) {
  const int s = __ldcg(a.seq + t), p = __ldcg(a.pos + t);
  if (s < 0 || s >= a.kv.n_slots || p < 0) return 0;  // padding
  return p + 1 < a.kv.max_ctx ? p + 1 : a.kv.max_ctx;
}
// First position the row attends to: 0, or the start of its sliding window.
__device__ __forceinline__ int row_lo(const AttnArgs& a, int t, int len) {
  if (a.window <= 0 || len == 0) return 0;
  const int lo = __ldcg(a.pos + t) - a.window + 1;
  return lo > 0 ? (lo < len ? lo : len) : 0;
}
// Positions per split: the row's length over the plan's splits, in whole tiles, at least min_chunk, so that
// short rows take one split (and no merge: the split kernel then writes the output itself).
__device__ __forceinline__ int split_chunk(int len, int n_splits, int min_chunk) {
  const int c = (len + n_splits - 1) / n_splits;
  const int r = (c + kTile - 1) / kTile * kTile;
  return r > min_chunk ? r : min_chunk;
}

template <GgmlType KT, int HEADS>
__global__ void __launch_bounds__(kThreads) attn_kernel(AttnArgs a) {
  using C8 = Chunk8<KT>;
  constexpr int kEB = KT == GgmlType::F32 ? 4 : 2;
  extern __shared__ __align__(128) uint8_t attn_smem[];
  const KvLayerView& kv = a.kv;
  const int hd = kv.head_dim;
  const AttnLayout L(hd, a.stages, a.row_bytes);
  uint4* qf = reinterpret_cast<uint4*>(attn_smem);         // [n_kb][4][32]
  float* p_s = reinterpret_cast<float*>(attn_smem + L.p);  // [kTile][8] scores, then probabilities
  float* m_s = reinterpret_cast<float*>(attn_smem + L.ml);
  float* l_s = m_s + kHeads;
  float* al_s = l_s + kHeads;
  uint64_t* bars = reinterpret_cast<uint64_t*>(attn_smem + L.bars);
  uint8_t* stage0 = attn_smem + L.stages;
  const uint32_t tile_bytes = kTile * a.row_bytes;

  const int t = blockIdx.z, kvh_hc = blockIdx.y, split = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int kvh = kvh_hc / a.head_chunks, hc = kvh_hc % a.head_chunks;
  const int h0 = kvh * a.group + hc * kHeads;
  const int nh = a.group - hc * kHeads < kHeads ? a.group - hc * kHeads : kHeads;  // <= HEADS

  if (a.trigger == 0) pdl_trigger();
  // pos and seq are step inputs (copied in before the step's first kernel; no kernel writes them), so they
  // are read before the wait.
  const int len = row_len(a, t);
  const int lo = row_lo(a, t, len), span = len - lo;  // the positions [lo, len) are attended to
  const int chunk = split_chunk(span > 0 ? span : 1, a.n_splits, a.min_chunk);
  const bool whole = a.n_splits == 1 || chunk >= span;  // one split covers the row: write the output here
  const int start = lo + split * chunk;
  const int end = start + chunk < len ? start + chunk : len;
  if (start >= end) {  // padding row or empty split: exits without writing, or waits first
    if (a.n_splits == 1) {
      pdl_wait();
      for (int i = tid; i < nh * hd; i += kThreads) a.out[((int64_t)t * a.n_heads + h0) * hd + i] = 0.0f;
    }
    return;  // with splits, attn_combine writes the padding rows and skips empty splits
  }
  const int n_tiles = (end - start + kTile - 1) / kTile;
  const int S = a.stages;

  const int64_t slot_base = ((int64_t)__ldcg(a.seq + t) * kv.n_kv_heads + kvh) * kv.max_ctx;  // rows
  const uint8_t* kbase = static_cast<const uint8_t*>(kv.k) + slot_base * a.row_bytes;
  const uint8_t* vbase = static_cast<const uint8_t*>(kv.v) + slot_base * a.row_bytes;
  auto issue = [&](int i) {  // tile i -> stage i % S (one thread)
    const int tile0 = start + i * kTile;
    const int np = end - tile0 < kTile ? end - tile0 : kTile;
    const uint32_t bytes = (uint32_t)np * a.row_bytes;
    uint8_t* ks = stage0 + (size_t)(i % S) * 2 * tile_bytes;
    uint64_t* bar = &bars[i % S];
    mbar_expect_tx(bar, 2 * bytes);
    bulk_copy_g2s(ks, kbase + (int64_t)tile0 * a.row_bytes, bytes, bar);
    bulk_copy_g2s(ks + tile_bytes, vbase + (int64_t)tile0 * a.row_bytes, bytes, bar);
  };
  if (tid == 0) {
    for (int i = 0; i < S; ++i) mbar_init(&bars[i], 1);
    mbar_init_fence();
  }
  __syncthreads();
  // This step writes the cache of this row's sequence only at its rows' positions, which are consecutive
  // and at most gridDim.z many: tiles wholly below pos[t] - gridDim.z + 1 hold K / V of earlier steps, and
  // their copies start before the wait (overlapping the previous kernel when launched programmatically).
  int issued = 0;
  if (tid == 0) {
    const int safe = __ldcg(a.pos + t) - (int)gridDim.z + 1;
    while (issued < S && issued < n_tiles &&
           (start + (issued + 1) * kTile < end ? start + (issued + 1) * kTile : end) <= safe)
      issue(issued++);
  }
  pdl_wait();
  if (tid == 0)
    for (int i = issued; i < S && i < n_tiles; ++i) issue(i);

  // q of the 8 heads (zero past the group) as the B fragments of each lane: entry (kb, s, lane (g, t4)) holds
  // q[g][c + 2s], q[g][c + 2s + 1] split into TF32 hi + lo, c = 32 kb + 8 t4 (zero past head_dim).
  const int n_kb = (hd + 31) / 32;  // 32-column blocks of head_dim (the last one may be partial)
  {
    constexpr int kB = 4;  // loads in flight per thread
    for (int e0 = tid; e0 < n_kb * 128; e0 += kB * kThreads) {
      float2 v[kB];
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        const int e = e0 + b * kThreads;
        const int kb = e >> 7, s = (e >> 5) & 3, ln = e & 31;
        const int h = ln >> 2, c = kb * 32 + (ln & 3) * 8 + 2 * s;
        v[b] = make_float2(0.0f, 0.0f);
        if (e < n_kb * 128 && h < nh && c < hd)
          v[b] = __ldcg(reinterpret_cast<const float2*>(a.q + ((int64_t)t * a.n_heads + h0 + h) * hd + c));
      }
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        const int e = e0 + b * kThreads;
        if (e >= n_kb * 128) break;
        uint4 f;
        split_tf32(v[b].x, f.x, f.z);
        split_tf32(v[b].y, f.y, f.w);
        qf[e] = f;
      }
    }
  }
  if (tid < kHeads) m_s[tid] = -INFINITY, l_s[tid] = 0.0f;

  // P.V thread layout: nchunk 8-wide chunks of head_dim, n_pg position groups.
  const int nchunk = hd / 8, n_pg = kThreads / nchunk;
  const int my_chunk = tid % nchunk, my_pg = tid / nchunk;
  const bool pv_active = my_pg < n_pg;
  float o[HEADS][8];
#pragma unroll
  for (int h = 0; h < HEADS; ++h)
#pragma unroll
    for (int d = 0; d < 8; ++d) o[h][d] = 0.0f;

  __syncthreads();

  for (int i = 0; i < n_tiles; ++i) {
    const int tile0 = start + i * kTile;
    const int n_tile = end - tile0 < kTile ? end - tile0 : kTile;
    const uint8_t* ks = stage0 + (size_t)(i % S) * 2 * tile_bytes;
    const uint8_t* vs = ks + tile_bytes;
    mbar_wait(&bars[i % S], (uint32_t)(i / S) & 1u);

    // ---- scores of tile positions l0 = 16 warp + g and l1 = l0 + 8 for the 8 heads (rows past n_tile hold
    // stale data: their scores are replaced by -inf, and MMA rows do not mix)
    {
      const int l0 = 16 * warp + g, l1 = l0 + 8;
      const uint8_t* k0 = ks + (size_t)l0 * a.row_bytes;
      const uint8_t* k1 = ks + (size_t)l1 * a.row_bytes;
      float sc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int kb0 = 0; kb0 < n_kb; kb0 += 4) {
        C8 ka[4], kc[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int c = (kb0 + j) * 32 + t4 * 8;
          if (kb0 + j < n_kb && c < hd) {
            ka[j].load_shared(k0 + c * kEB);
            kc[j].load_shared(k1 + c * kEB);
          } else {
            ka[j].zero();
            kc[j].zero();
          }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int c = (kb0 + j) * 32 + t4 * 8;
          const bool ok = kb0 + j < n_kb && c < hd;
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            const uint4 qv = ok ? qf[((kb0 + j) * 4 + s) * 32 + lane] : make_uint4(0, 0, 0, 0);
            const uint32_t qh0 = qv.x, qh1 = qv.y, ql0 = qv.z, ql1 = qv.w;
            const float2 r0 = ka[j].pair(s), r1 = kc[j].pair(s);
            if constexpr (KT == GgmlType::F32) {
              uint32_t a0, a1, a2, a3, e0, e1, e2, e3;
              split_tf32(r0.x, a0, e0);
              split_tf32(r1.x, a1, e1);
              split_tf32(r0.y, a2, e2);
              split_tf32(r1.y, a3, e3);
              mma_tf32(sc, a0, a1, a2, a3, qh0, qh1);
              mma_tf32(sc, a0, a1, a2, a3, ql0, ql1);
              mma_tf32(sc, e0, e1, e2, e3, qh0, qh1);
            } else {
              const uint32_t a0 = __float_as_uint(r0.x), a1 = __float_as_uint(r1.x);
              const uint32_t a2 = __float_as_uint(r0.y), a3 = __float_as_uint(r1.y);
              mma_tf32(sc, a0, a1, a2, a3, qh0, qh1);
              mma_tf32(sc, a0, a1, a2, a3, ql0, ql1);
            }
          }
        }
      }
      // sc[0] = S[l0][2 t4], sc[1] = S[l0][2 t4 + 1], sc[2] = S[l1][2 t4], sc[3] = S[l1][2 t4 + 1]
      if (a.softcap > 0.0f) {  // uniform: softcap tanh(scale s / softcap), in the log2 domain
        const float inv = 1.0f / a.softcap, c = a.softcap * 1.4426950408889634f;
#pragma unroll
        for (int j = 0; j < 4; ++j) sc[j] = c * tanhf(sc[j] * a.scale * inv);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) sc[j] *= a.scale_log2;
      }
      *reinterpret_cast<float2*>(p_s + l0 * kHeads + 2 * t4) =
          l0 < n_tile ? make_float2(sc[0], sc[1]) : make_float2(-INFINITY, -INFINITY);
      *reinterpret_cast<float2*>(p_s + l1 * kHeads + 2 * t4) =
          l1 < n_tile ? make_float2(sc[2], sc[3]) : make_float2(-INFINITY, -INFINITY);
    }
    __syncthreads();

    // ---- online softmax: warp w updates heads 2w and 2w + 1 (the tile has at least one valid position)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int h = 2 * warp + hh;
      if (h >= HEADS) break;  // warp-uniform
      const float v0 = p_s[lane * kHeads + h], v1 = p_s[(lane + 32) * kHeads + h];
      const float m_old = m_s[h];
      const float m_new = fmaxf(m_old, warp_max(fmaxf(v0, v1)));
      const float e0 = exp2f(v0 - m_new), e1 = exp2f(v1 - m_new);
      p_s[lane * kHeads + h] = e0;
      p_s[(lane + 32) * kHeads + h] = e1;
      const float sum = warp_sum(e0 + e1);
      if (lane == 0) {
        const float alpha = exp2f(m_old - m_new);  // 0 on the first tile (m_old = -inf)
        al_s[h] = alpha;
        l_s[h] = l_s[h] * alpha + sum;
        m_s[h] = m_new;
      }
    }
    __syncthreads();

    // ---- o = o * alpha + P.V
    if (pv_active) {
#pragma unroll
      for (int h = 0; h < HEADS; ++h) {
        const float al = al_s[h];
#pragma unroll
        for (int d = 0; d < 8; ++d) o[h][d] *= al;
      }
      const uint8_t* vcol = vs + my_chunk * 8 * kEB;
      for (int pl0 = my_pg; pl0 < n_tile; pl0 += 4 * n_pg) {
        C8 vv[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int pl = pl0 + j * n_pg;
          if (pl < n_tile)
            vv[j].load_shared(vcol + (size_t)pl * a.row_bytes);
          else
            vv[j].zero();
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int pl = pl0 + j * n_pg;
          if (pl >= n_tile) break;
          float vf[8];
#pragma unroll
          for (int e = 0; e < 8; ++e) vf[e] = vv[j].elem(e);
          float pr[HEADS];
          *reinterpret_cast<float4*>(pr) = *reinterpret_cast<const float4*>(p_s + pl * kHeads);
          if constexpr (HEADS == 8)
            *reinterpret_cast<float4*>(pr + 4) = *reinterpret_cast<const float4*>(p_s + pl * kHeads + 4);
#pragma unroll
          for (int h = 0; h < HEADS; ++h)
#pragma unroll
            for (int d = 0; d < 8; ++d) o[h][d] += pr[h] * vf[d];
        }
      }
    }
    __syncthreads();  // every thread is done with this stage and with the scores
    if (tid == 0 && i + S < n_tiles) {
      fence_proxy_async();
      issue(i + S);
    }
  }

  if (a.trigger == 1) pdl_trigger();

  // ---- reduce the position groups, 4 heads at a time, and write (red reuses the drained stage area)
  float* red = reinterpret_cast<float*>(stage0);
#pragma unroll
  for (int half = 0; half < HEADS / 4; ++half) {
    if (pv_active)
#pragma unroll
      for (int hl = 0; hl < 4; ++hl)
#pragma unroll
        for (int d = 0; d < 8; ++d) red[(my_pg * 4 + hl) * hd + my_chunk * 8 + d] = o[half * 4 + hl][d];
    __syncthreads();
    for (int i = tid; i < 4 * hd; i += kThreads) {
      const int hl = i / hd, d = i % hd, h = half * 4 + hl;
      if (h >= nh) continue;
      float acc = 0.0f;
      for (int pg = 0; pg < n_pg; ++pg) acc += red[(pg * 4 + hl) * hd + d];
      const int64_t row = (int64_t)t * a.n_heads + h0 + h;  // [n, n_heads]
      if (whole) {
        a.out[row * hd + d] = acc / (l_s[h] + sink_term(a, h0 + h, m_s[h]));
      } else {
        a.ws_acc[(row * a.n_splits + split) * hd + d] = acc;
        if (d == 0) {
          a.ws_ml[(row * a.n_splits + split) * 2] = m_s[h];
          a.ws_ml[(row * a.n_splits + split) * 2 + 1] = l_s[h];
        }
      }
    }
    __syncthreads();
  }
}

// Merges the splits of one (row, head): out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s. Warp w adds
// the splits s = w mod 8 for all of head_dim (float4 per lane, 4 loads in flight), then the warps' sums are
// added in warp order: a fixed order, so results are deterministic.
constexpr int kCThreads = 256;
__global__ void __launch_bounds__(kCThreads) attn_combine_kernel(AttnArgs a) {
  __shared__ float w_s[kMaxSplits], l_s[kMaxSplits];
  __shared__ __align__(16) float red[kCThreads / 32][kMaxHd];
  __shared__ float wmax[kCThreads / 32];
  __shared__ float inv_s;
  // The output projection follows: it may launch once the split kernel is done, not earlier (a projection
  // launched during the split kernel slowed the decode step: docs/CUDA.md, "Attention launch").
  pdl_wait();
  pdl_trigger();
  const int t = blockIdx.y, h = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int hd = a.kv.head_dim;
  const int64_t row = (int64_t)t * a.n_heads + h;
  float* o = a.out + row * hd;
  const int len = row_len(a, t);
  if (len == 0) {
    for (int d = tid; d < hd; d += kCThreads) o[d] = 0.0f;
    return;
  }
  const int span = len - row_lo(a, t, len);
  const int chunk = split_chunk(span, a.n_splits, a.min_chunk);
  if (chunk >= span) return;  // one split: attn_kernel wrote the output
  const int n_valid = (span + chunk - 1) / chunk;
  const float* ml = a.ws_ml + row * a.n_splits * 2;
  float mx = -INFINITY;
  for (int s = tid; s < n_valid; s += kCThreads) {
    const float2 v = __ldcg(reinterpret_cast<const float2*>(ml + 2 * s));
    w_s[s] = v.x;
    l_s[s] = v.y;
    mx = fmaxf(mx, v.x);
  }
  mx = warp_max(mx);
  if (lane == 0) wmax[warp] = mx;
  __syncthreads();
  mx = wmax[0];
  for (int w = 1; w < kCThreads / 32; ++w) mx = fmaxf(mx, wmax[w]);
  for (int s = tid; s < n_valid; s += kCThreads) w_s[s] = exp2f(w_s[s] - mx);
  __syncthreads();
  if (tid == 0) {
    float l = 0.0f;
    for (int s = 0; s < n_valid; ++s) l += w_s[s] * l_s[s];
    inv_s = 1.0f / (l + sink_term(a, h, mx));
  }
  const float* acc = a.ws_acc + row * a.n_splits * hd;
  for (int d4 = lane; d4 < hd / 4; d4 += 32) {
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    constexpr int kB = 4;
    for (int s0 = warp; s0 < n_valid; s0 += kB * (kCThreads / 32)) {
      float4 v[kB];
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        const int s = s0 + b * (kCThreads / 32);
        v[b] = s < n_valid ? __ldcg(reinterpret_cast<const float4*>(acc + (int64_t)s * hd) + d4)
                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        const int s = s0 + b * (kCThreads / 32);
        if (s >= n_valid) break;
        const float w = w_s[s];
        sum.x += w * v[b].x, sum.y += w * v[b].y, sum.z += w * v[b].z, sum.w += w * v[b].w;
      }
    }
    *reinterpret_cast<float4*>(&red[warp][4 * d4]) = sum;
  }
  __syncthreads();
  const float inv = inv_s;
  for (int d = tid; d < hd; d += kCThreads) {
    float v = red[0][d];
    for (int w = 1; w < kCThreads / 32; ++w) v += red[w][d];
    o[d] = v * inv;
  }
}

size_t round_up(size_t v, size_t to) {
  return (v + to - 1) / to * to;
}

// K/V tiles in flight per block: as many as kStageBudget holds (at most kMaxStages), or max_stages (> 0).
int stages_for(uint32_t row_bytes, int max_stages) {
  int st = (int)(kStageBudget / (2 * (size_t)kTile * row_bytes));
  if (max_stages > 0 && max_stages < st) st = max_stages;
  return st < 1 ? 1 : st > kMaxStages ? kMaxStages : st;
}

// Blocks of the split kernel one SM holds (shared memory bound; registers allow 4-6 for 128 threads).
int blocks_per_sm(const DeviceInfo& dev, int hd, uint32_t row_bytes, int max_stages) {
  const size_t smem = AttnLayout(hd, stages_for(row_bytes, max_stages), row_bytes).total + 1024;  // + reserve
  const size_t sm_total = dev.smem_optin_bytes ? dev.smem_optin_bytes + 1024 : 228 << 10;
  const int b = (int)(sm_total / smem);
  return b < 1 ? 1 : b > 4 ? 4 : b;
}

template <GgmlType KT, int HEADS>
cudaError_t launch_attn(const AttnArgs& a, dim3 grid, size_t smem, bool pdl, cudaStream_t stream) {
  // The limit once, for the largest head_dim of this cache type and the most stages.
  static const cudaError_t attr = [] {
    const uint32_t rb = kMaxHd * (KT == GgmlType::F32 ? 4 : 2);
    return cudaFuncSetAttribute(attn_kernel<KT, HEADS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)AttnLayout(kMaxHd, stages_for(rb, 0), rb).total);
  }();
  if (attr != cudaSuccess) return attr;
  return launch_ex(attn_kernel<KT, HEADS>, grid, dim3(kThreads), smem, stream, 1, pdl, a);
}

}  // namespace

int attention_min_chunk(int positions) {
  return positions < 64 ? 64 : (positions + 63) / 64 * 64;
}

AttentionTuning process_attention_tuning() {
  return g_attention;
}

AttentionPlan plan_attention(const DeviceInfo& dev, const KvLayerView& kv, int n_heads, int max_rows,
                             int force_splits) {
  return plan_attention(dev, kv, n_heads, max_rows, force_splits, process_attention_tuning());
}

AttentionPlan plan_attention(const DeviceInfo& dev, const KvLayerView& kv, int n_heads, int max_rows,
                             int force_splits, const AttentionTuning& tuning) {
  AttentionPlan p;
  p.tuning = tuning;
  p.n_heads = n_heads;
  p.max_rows = max_rows;
  if (n_heads <= 0 || max_rows <= 0 || kv.n_kv_heads <= 0 || n_heads % kv.n_kv_heads != 0) return p;
  const int group = n_heads / kv.n_kv_heads;
  const int head_chunks = (group + kHeads - 1) / kHeads;
  int splits = force_splits;
  if (splits <= 0) {
    // About one wave of blocks (3 per SM for head_dim 128 F16) over max_rows rows; each split at least one
    // tile of a full context.
    const int64_t per_split = (int64_t)max_rows * kv.n_kv_heads * head_chunks;
    const uint32_t rb = (uint32_t)kv.head_dim * (kv.type == GgmlType::F32 ? 4 : 2);
    const int64_t slots =
        (int64_t)blocks_per_sm(dev, kv.head_dim, rb, tuning.max_stages) * (dev.n_sms > 0 ? dev.n_sms : 132);
    const int64_t want = slots / per_split > 1 ? slots / per_split : 1;
    const int64_t by_ctx = kv.max_ctx / kTile > 1 ? kv.max_ctx / kTile : 1;
    splits = (int)(want < by_ctx ? want : by_ctx);
  }
  if (splits > kMaxSplits) splits = kMaxSplits;
  if (splits < 1) splits = 1;
  p.n_splits = splits;
  p.workspace_bytes =
      splits > 1
          ? round_up((size_t)max_rows * n_heads * splits * ((size_t)kv.head_dim + 2) * sizeof(float), 256)
          : 0;
  p.tiled = tiled_attention_setup(dev, kv, n_heads, max_rows, &p.tiled_fallback_blocks);
  return p;
}

bool attention_tiled(const AttentionPlan& plan, int n) {
  if (!plan.tiled || n <= 0 || plan.tuning.tiled == 1) return false;
  return plan.tuning.tiled == 2 || n >= kAttentionTiledMinRows;
}

cudaError_t attention(const AttentionPlan& plan, const KvLayerView& kv, const float* q, int n,
                      const int32_t* pos, const int32_t* seq, float scale, float* out, void* workspace,
                      cudaStream_t stream, float softcap, int window, const float* sinks) {
  const int hd = kv.head_dim;
  if (n < 0 || n > plan.max_rows || plan.n_splits < 1 || plan.n_splits > kMaxSplits || kv.n_kv_heads <= 0 ||
      plan.n_heads % kv.n_kv_heads != 0 || hd <= 0 || hd % 8 != 0 || hd > kMaxHd || kv.max_ctx <= 0 ||
      !aligned16(kv.k) || !aligned16(kv.v) || (plan.n_splits > 1 && !workspace))
    return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (softcap < 0 || window < 0) return cudaErrorInvalidValue;
  // The tiled kernel has neither soft-capping nor windows: such layers take the per-row kernel.
  if (softcap == 0 && window == 0 && attention_tiled(plan, n) && aligned16(q) && aligned16(out) &&
      (kv.type == GgmlType::F16 || kv.type == GgmlType::BF16) && (hd == 64 || hd == 128))
    return tiled_attention(plan, kv, q, n, pos, seq, scale, out, stream, sinks);
  AttnArgs a;
  a.kv = kv;
  a.q = q;
  a.n_heads = plan.n_heads;
  a.group = plan.n_heads / kv.n_kv_heads;
  a.head_chunks = (a.group + kHeads - 1) / kHeads;
  a.n_splits = plan.n_splits;
  a.min_chunk = plan.tuning.min_chunk;
  a.pos = pos;
  a.seq = seq;
  a.scale_log2 = scale * 1.4426950408889634f;
  a.scale = scale;
  a.softcap = softcap;
  a.window = window;
  a.sinks = sinks;
  a.out = out;
  a.ws_acc = static_cast<float*>(workspace);
  a.ws_ml = a.ws_acc ? a.ws_acc + (size_t)plan.max_rows * plan.n_heads * plan.n_splits * hd : nullptr;
  a.trigger = plan.tuning.trigger;
  const uint32_t eb = kv.type == GgmlType::F32 ? 4 : 2;
  a.row_bytes = (uint32_t)hd * eb;
  a.stages = stages_for(a.row_bytes, plan.tuning.max_stages);
  const size_t smem = AttnLayout(hd, a.stages, a.row_bytes).total;
  const dim3 grid(plan.n_splits, kv.n_kv_heads * a.head_chunks, n);
  const bool h4 = a.group <= 4;
  cudaError_t e = cudaSuccess;
  const bool pdl = plan.tuning.pdl;
  if (plan.tuning.stage != 2) switch (kv.type) {
      case GgmlType::F32:
        e = h4 ? launch_attn<GgmlType::F32, 4>(a, grid, smem, pdl, stream)
               : launch_attn<GgmlType::F32, 8>(a, grid, smem, pdl, stream);
        break;
      case GgmlType::F16:
        e = h4 ? launch_attn<GgmlType::F16, 4>(a, grid, smem, pdl, stream)
               : launch_attn<GgmlType::F16, 8>(a, grid, smem, pdl, stream);
        break;
      case GgmlType::BF16:
        e = h4 ? launch_attn<GgmlType::BF16, 4>(a, grid, smem, pdl, stream)
               : launch_attn<GgmlType::BF16, 8>(a, grid, smem, pdl, stream);
        break;
      default:
        return cudaErrorInvalidValue;
    }
  if (e != cudaSuccess) return e;
  if (plan.n_splits > 1 && plan.tuning.stage != 1) {
    e = launch_ex(attn_combine_kernel, dim3(plan.n_heads, n), dim3(kCThreads), 0, stream, 1,
                  pdl || plan.tuning.combine_pdl, a);
    if (e != cudaSuccess) return e;
  }
  return cudaGetLastError();
}

}  // namespace ultra::cuda
