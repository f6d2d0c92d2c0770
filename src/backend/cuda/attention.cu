// Causal GQA attention over the slotted KV cache, split over positions (flash-decoding).
//
// Block (128 threads = 4 warps) = one row t, one kv head, up to 8 query heads of its group (heads h0..h0+7)
// and one chunk of positions. The chunk is a fixed fraction of the row's own length (len = pos[t] + 1
// split into n_splits chunks rounded up to 64 positions), so the grid is static and short rows leave the
// late splits empty. Per tile of 64 positions:
//   QK^T  on tensor cores as in gemv: warp w takes positions 16w..16w+15 (its MMA rows, K read with 16-byte
//         streaming loads), the 8 heads are the MMA's n = 8 columns (q split hi + lo in TF32, from shared
//         memory; K is exact in TF32 for F16 / BF16, split for F32), scores in the log2 domain.
//   softmax  online (running max m, sum l per head), in f32 with exp2f.
//   P.V   SIMT: thread (position group, 8-wide chunk of head_dim) keeps 8 heads x 8 dims of output, reads
//         V chunks with 16-byte loads and the 8 probabilities of a position from shared memory.
// At the end the position groups are reduced in shared memory; with one split the block writes out / l,
// else the partial (m, l, unnormalised out) goes to the workspace and attn_combine merges the splits.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace ultra::cuda {

using namespace detail;

namespace {

constexpr int kThreads = 128;  // 4 warps
constexpr int kTile = 64;      // positions per iteration, 16 per warp
constexpr int kHeads = 8;      // query heads per block (the MMA's n)
constexpr int kMaxHd = 256;
constexpr int kQPad = 4;  // row padding of q in shared memory (floats)

struct AttnArgs {
  KvLayerView kv;
  const float* q;  // [n, n_heads, hd]
  int n_heads;
  int group;        // n_heads / n_kv_heads
  int head_chunks;  // ceil(group / 8)
  int n_splits;
  const int32_t* pos;  // [n]
  const int32_t* seq;  // [n]
  float scale_log2;    // scale * log2(e)
  float* out;          // [n, n_heads, hd]
  float* ws_acc;       // [n, n_heads, n_splits, hd]
  float* ws_ml;        // [n, n_heads, n_splits, 2]: max (log2 domain), sum
};

struct AttnSmem {
  float q_hi[kHeads][kMaxHd + kQPad];  // TF32 bit patterns (as float)
  float q_lo[kHeads][kMaxHd + kQPad];
  float s[kHeads][kTile];  // scores, then probabilities, of the current tile
  float alpha[kHeads];     // rescale of the running output for the current tile
  float m[kHeads], l[kHeads];
  float red[kThreads * 32];  // cross position-group reduction, 4 heads at a time
};

// Row length and chunk of positions per split; attn_combine uses the same formula.
__device__ __forceinline__ int row_len(const AttnArgs& a, int t) {
  const int s = a.seq[t], p = a.pos[t];
  if (s < 0 || s >= a.kv.n_slots || p < 0) return 0;  // padding
  return p + 1 < a.kv.max_ctx ? p + 1 : a.kv.max_ctx;
}
__device__ __forceinline__ int split_chunk(int len, int n_splits) {
  const int c = (len + n_splits - 1) / n_splits;
  return (c + kTile - 1) / kTile * kTile;
}

template <GgmlType KT>
__device__ __forceinline__ void attn_tile(const AttnArgs& a, int t, int kvh_hc, int split, AttnSmem& sm) {
  using C8 = Chunk8<KT>;
  constexpr int kEB = KT == GgmlType::F32 ? 4 : 2;
  const KvLayerView& kv = a.kv;
  const int hd = kv.head_dim;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int kvh = kvh_hc / a.head_chunks, hc = kvh_hc % a.head_chunks;
  const int h0 = kvh * a.group + hc * kHeads;
  const int nh = a.group - hc * kHeads < kHeads ? a.group - hc * kHeads : kHeads;

  const int len = row_len(a, t);
  const int chunk = split_chunk(len > 0 ? len : 1, a.n_splits);
  const int start = split * chunk;
  const int end = start + chunk < len ? start + chunk : len;
  if (start >= end) {  // padding row or empty split
    if (a.n_splits == 1)
      for (int i = tid; i < nh * hd; i += kThreads) a.out[((int64_t)t * a.n_heads + h0) * hd + i] = 0.0f;
    return;  // with splits, attn_combine writes the padding rows and skips empty splits
  }

  // q of the 8 heads (zero past the group), split into TF32 hi + lo.
  for (int i = tid; i < kHeads * hd; i += kThreads) {
    const int h = i / hd, d = i % hd;
    const float v = h < nh ? a.q[((int64_t)t * a.n_heads + h0 + h) * hd + d] : 0.0f;
    uint32_t hi, lo;
    split_tf32(v, hi, lo);
    sm.q_hi[h][d] = __uint_as_float(hi);
    sm.q_lo[h][d] = __uint_as_float(lo);
  }
  if (tid < kHeads) sm.m[tid] = -INFINITY, sm.l[tid] = 0.0f;

  const int64_t slot_base = ((int64_t)a.seq[t] * kv.n_kv_heads + kvh) * kv.max_ctx;  // position 0, in rows
  const uint8_t* kbase = static_cast<const uint8_t*>(kv.k) + slot_base * hd * kEB;
  const uint8_t* vbase = static_cast<const uint8_t*>(kv.v) + slot_base * hd * kEB;

  // P.V thread layout: nchunk 8-wide chunks of head_dim, n_pg position groups.
  const int nchunk = hd / 8, n_pg = kThreads / nchunk;
  const int my_chunk = tid % nchunk, my_pg = tid / nchunk;
  const bool pv_active = my_pg < n_pg;
  float o[kHeads][8];
#pragma unroll
  for (int h = 0; h < kHeads; ++h)
#pragma unroll
    for (int d = 0; d < 8; ++d) o[h][d] = 0.0f;

  const int n_kb = (hd + 31) / 32;  // 32-column blocks of head_dim (the last one may be partial)
  __syncthreads();

  for (int tile0 = start; tile0 < end; tile0 += kTile) {
    // ---- scores of positions p0 = tile0 + 16 warp + g and p1 = p0 + 8 for the 8 heads
    {
      const int p0 = tile0 + 16 * warp + g, p1 = p0 + 8;
      const uint8_t* k0 = kbase + (int64_t)(p0 < end ? p0 : end - 1) * hd * kEB;
      const uint8_t* k1 = kbase + (int64_t)(p1 < end ? p1 : end - 1) * hd * kEB;
      float sc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int kb0 = 0; kb0 < n_kb; kb0 += 4) {
        C8 ka[4], kc[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int c = (kb0 + i) * 32 + t4 * 8;
          if (kb0 + i < n_kb && c < hd) {
            ka[i].load(k0 + c * kEB);
            kc[i].load(k1 + c * kEB);
          } else {
            ka[i].zero();
            kc[i].zero();
          }
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int c = (kb0 + i) * 32 + t4 * 8;
          const bool ok = kb0 + i < n_kb && c < hd;
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            const uint32_t qh0 = ok ? __float_as_uint(sm.q_hi[g][c + 2 * s]) : 0u;
            const uint32_t qh1 = ok ? __float_as_uint(sm.q_hi[g][c + 2 * s + 1]) : 0u;
            const uint32_t ql0 = ok ? __float_as_uint(sm.q_lo[g][c + 2 * s]) : 0u;
            const uint32_t ql1 = ok ? __float_as_uint(sm.q_lo[g][c + 2 * s + 1]) : 0u;
            const float2 r0 = ka[i].pair(s), r1 = kc[i].pair(s);
            if constexpr (KT == GgmlType::F32) {
              uint32_t a0, a1, a2, a3, l0, l1, l2, l3;
              split_tf32(r0.x, a0, l0);
              split_tf32(r1.x, a1, l1);
              split_tf32(r0.y, a2, l2);
              split_tf32(r1.y, a3, l3);
              mma_tf32(sc, a0, a1, a2, a3, qh0, qh1);
              mma_tf32(sc, a0, a1, a2, a3, ql0, ql1);
              mma_tf32(sc, l0, l1, l2, l3, qh0, qh1);
            } else {
              const uint32_t a0 = __float_as_uint(r0.x), a1 = __float_as_uint(r1.x);
              const uint32_t a2 = __float_as_uint(r0.y), a3 = __float_as_uint(r1.y);
              mma_tf32(sc, a0, a1, a2, a3, qh0, qh1);
              mma_tf32(sc, a0, a1, a2, a3, ql0, ql1);
            }
          }
        }
      }
      // sc[0] = S[p0][2 t4], sc[1] = S[p0][2 t4 + 1], sc[2] = S[p1][2 t4], sc[3] = S[p1][2 t4 + 1]
      const int l0 = 16 * warp + g, l1 = l0 + 8;
      sm.s[2 * t4][l0] = p0 < end ? sc[0] * a.scale_log2 : -INFINITY;
      sm.s[2 * t4 + 1][l0] = p0 < end ? sc[1] * a.scale_log2 : -INFINITY;
      sm.s[2 * t4][l1] = p1 < end ? sc[2] * a.scale_log2 : -INFINITY;
      sm.s[2 * t4 + 1][l1] = p1 < end ? sc[3] * a.scale_log2 : -INFINITY;
    }
    __syncthreads();

    // ---- online softmax: warp w updates heads 2w and 2w + 1 (the tile has at least one valid position)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int h = 2 * warp + hh;
      const float v0 = sm.s[h][lane], v1 = sm.s[h][lane + 32];
      const float m_old = sm.m[h];
      const float m_new = fmaxf(m_old, warp_max(fmaxf(v0, v1)));
      const float e0 = exp2f(v0 - m_new), e1 = exp2f(v1 - m_new);
      sm.s[h][lane] = e0;
      sm.s[h][lane + 32] = e1;
      const float sum = warp_sum(e0 + e1);
      if (lane == 0) {
        const float alpha = exp2f(m_old - m_new);  // 0 on the first tile (m_old = -inf)
        sm.alpha[h] = alpha;
        sm.l[h] = sm.l[h] * alpha + sum;
        sm.m[h] = m_new;
      }
    }
    __syncthreads();

    // ---- o = o * alpha + P.V
    if (pv_active) {
#pragma unroll
      for (int h = 0; h < kHeads; ++h) {
        const float al = sm.alpha[h];
#pragma unroll
        for (int d = 0; d < 8; ++d) o[h][d] *= al;
      }
      const int n_tile = end - tile0 < kTile ? end - tile0 : kTile;
      for (int pl0 = my_pg; pl0 < n_tile; pl0 += 4 * n_pg) {
        C8 vv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int pl = pl0 + i * n_pg;
          if (pl < n_tile)
            vv[i].load(vbase + ((int64_t)(tile0 + pl) * hd + my_chunk * 8) * kEB);
          else
            vv[i].zero();
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int pl = pl0 + i * n_pg;
          if (pl >= n_tile) break;
          float vf[8];
#pragma unroll
          for (int e = 0; e < 8; ++e) vf[e] = vv[i].elem(e);
#pragma unroll
          for (int h = 0; h < kHeads; ++h) {
            const float p = sm.s[h][pl];
#pragma unroll
            for (int d = 0; d < 8; ++d) o[h][d] += p * vf[d];
          }
        }
      }
    }
    __syncthreads();
  }

  // ---- reduce the position groups, 4 heads at a time, and write
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (pv_active)
#pragma unroll
      for (int hl = 0; hl < 4; ++hl)
#pragma unroll
        for (int d = 0; d < 8; ++d) sm.red[(my_pg * 4 + hl) * hd + my_chunk * 8 + d] = o[half * 4 + hl][d];
    __syncthreads();
    for (int i = tid; i < 4 * hd; i += kThreads) {
      const int hl = i / hd, d = i % hd, h = half * 4 + hl;
      if (h >= nh) continue;
      float acc = 0.0f;
      for (int pg = 0; pg < n_pg; ++pg) acc += sm.red[(pg * 4 + hl) * hd + d];
      const int64_t row = (int64_t)t * a.n_heads + h0 + h;  // [n, n_heads]
      if (a.n_splits == 1) {
        a.out[row * hd + d] = acc / sm.l[h];
      } else {
        a.ws_acc[(row * a.n_splits + split) * hd + d] = acc;
        if (d == 0) {
          a.ws_ml[(row * a.n_splits + split) * 2] = sm.m[h];
          a.ws_ml[(row * a.n_splits + split) * 2 + 1] = sm.l[h];
        }
      }
    }
    __syncthreads();
  }
}

template <GgmlType KT>
__global__ void __launch_bounds__(kThreads) attn_kernel(AttnArgs a) {
  __shared__ AttnSmem sm;
  attn_tile<KT>(a, blockIdx.z, blockIdx.y, blockIdx.x, sm);
}

// Merges the splits of one (row, head): out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s.
__device__ __forceinline__ void attn_combine_head(const AttnArgs& a, int t, int h) {
  const int hd = a.kv.head_dim;
  const int64_t row = (int64_t)t * a.n_heads + h;
  float* o = a.out + row * hd;
  const int len = row_len(a, t);
  if (len == 0) {
    for (int d = threadIdx.x; d < hd; d += blockDim.x) o[d] = 0.0f;
    return;
  }
  const int n_valid = (len + split_chunk(len, a.n_splits) - 1) / split_chunk(len, a.n_splits);
  const float* ml = a.ws_ml + row * a.n_splits * 2;
  float mx = -INFINITY;
  for (int s = 0; s < n_valid; ++s) mx = fmaxf(mx, ml[2 * s]);
  float l = 0.0f;
  for (int s = 0; s < n_valid; ++s) l += exp2f(ml[2 * s] - mx) * ml[2 * s + 1];
  const float inv = 1.0f / l;
  const float* acc = a.ws_acc + row * a.n_splits * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float v = 0.0f;
    for (int s = 0; s < n_valid; ++s) v += exp2f(ml[2 * s] - mx) * acc[(int64_t)s * hd + d];
    o[d] = v * inv;
  }
}

__global__ void __launch_bounds__(kThreads) attn_combine_kernel(AttnArgs a) {
  attn_combine_head(a, blockIdx.y, blockIdx.x);
}

size_t round_up(size_t v, size_t to) {
  return (v + to - 1) / to * to;
}

}  // namespace

AttentionPlan plan_attention(const DeviceInfo& dev, const KvLayerView& kv, int n_heads, int max_rows,
                             int force_splits) {
  AttentionPlan p;
  p.n_heads = n_heads;
  p.max_rows = max_rows;
  if (n_heads <= 0 || max_rows <= 0 || kv.n_kv_heads <= 0 || n_heads % kv.n_kv_heads != 0) return p;
  const int group = n_heads / kv.n_kv_heads;
  const int head_chunks = (group + kHeads - 1) / kHeads;
  int splits = force_splits;
  if (splits <= 0) {
    const int64_t per_split = (int64_t)max_rows * kv.n_kv_heads * head_chunks;
    const int64_t want = (4 * (int64_t)(dev.n_sms > 0 ? dev.n_sms : 132) + per_split - 1) / per_split;
    const int64_t by_ctx = kv.max_ctx / 256 > 1 ? kv.max_ctx / 256 : 1;
    splits = (int)(want < by_ctx ? want : by_ctx);
    if (splits > 128) splits = 128;
    if (splits < 1) splits = 1;
  }
  p.n_splits = splits;
  p.workspace_bytes =
      splits > 1
          ? round_up((size_t)max_rows * n_heads * splits * ((size_t)kv.head_dim + 2) * sizeof(float), 256)
          : 0;
  return p;
}

cudaError_t attention(const AttentionPlan& plan, const KvLayerView& kv, const float* q, int n,
                      const int32_t* pos, const int32_t* seq, float scale, float* out, void* workspace,
                      cudaStream_t stream) {
  const int hd = kv.head_dim;
  if (n < 0 || n > plan.max_rows || plan.n_splits < 1 || kv.n_kv_heads <= 0 ||
      plan.n_heads % kv.n_kv_heads != 0 || hd <= 0 || hd % 8 != 0 || hd > kMaxHd || kv.max_ctx <= 0 ||
      !aligned16(kv.k) || !aligned16(kv.v) || (plan.n_splits > 1 && !workspace))
    return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  AttnArgs a;
  a.kv = kv;
  a.q = q;
  a.n_heads = plan.n_heads;
  a.group = plan.n_heads / kv.n_kv_heads;
  a.head_chunks = (a.group + kHeads - 1) / kHeads;
  a.n_splits = plan.n_splits;
  a.pos = pos;
  a.seq = seq;
  a.scale_log2 = scale * 1.4426950408889634f;
  a.out = out;
  a.ws_acc = static_cast<float*>(workspace);
  a.ws_ml = a.ws_acc ? a.ws_acc + (size_t)plan.max_rows * plan.n_heads * plan.n_splits * hd : nullptr;
  const dim3 grid(plan.n_splits, kv.n_kv_heads * a.head_chunks, n);
  switch (kv.type) {
    case GgmlType::F32:
      attn_kernel<GgmlType::F32><<<grid, kThreads, 0, stream>>>(a);
      break;
    case GgmlType::F16:
      attn_kernel<GgmlType::F16><<<grid, kThreads, 0, stream>>>(a);
      break;
    case GgmlType::BF16:
      attn_kernel<GgmlType::BF16><<<grid, kThreads, 0, stream>>>(a);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (plan.n_splits > 1) {
    attn_combine_kernel<<<dim3(plan.n_heads, n), kThreads, 0, stream>>>(a);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

}  // namespace ultra::cuda
