// Token sampler, two kernels per launch (the function is specified in kernels.h):
//  * sampler_part_kernel: greedy and top_k <= 1024 rows only. Each row's vocabulary is split into segments
//    (one block of 256 threads each, as many as one wave of blocks over all rows allows, at most 64 per
//    row and at most 16384 / K): NaN / Inf check, the segment's penalties, its K best keys (radix select
//    in shared memory) and, for greedy, its log-sum-exp partial (max, sum of expf(l - max) in double).
//  * sampler_kernel, one block of 1024 threads per row: merges the segments' candidates (greedy, top_k) and
//    finishes in shared memory, or runs the all-tokens path over the vocabulary itself.
// Both use programmatic dependent launch (they wait before reading anything).
//
// Candidates are 64-bit keys (order-preserving bits of the penalised logit << 32 | ~id): one unsigned
// compare orders them by (logit desc, id asc), and the id comes back from the key.
//
// Candidate streams (the segments' keys, or pass 1 of the all-tokens path over the row: NaN / Inf check,
// penalties (tokens of the window are marked in a shared-memory bitmap and stand in the stream through
// their precomputed override values)) go through a threshold filter that keeps the K best keys in a shared
// buffer: a key enters when it is >= the current threshold; whenever the buffer may overflow, a block-wide
// radix select finds the K-th key, the buffer is compacted to the K best and the threshold raised to it.
// The sorted (bitonic) K best then either finish the row in shared memory (greedy, top_k <= 1024) or seed
// the all-tokens path (see kernels.h and docs/CUDA.md for its passes).
//
// Penalty counts use a per-row u32 array over the vocabulary in the workspace: atomicAdd per window token,
// then atomicExch(0) hands each distinct token's count to exactly one thread, which leaves the array zero
// for the next launch.
#include <cfloat>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/tuning.h"
#include "sampling/philox.h"

namespace ultra::cuda {

using namespace detail;

namespace {

using u64 = unsigned long long;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBuf = 16384;                         // candidate buffer (keys)
constexpr int kSub = 8;                             // elements per thread between two compaction checks
constexpr int kCompactAt = kBuf - kThreads * kSub;  // compact when the buffer holds more than this
constexpr int kCollect = kBuf;                      // largest candidate set finished in shared memory
constexpr int kMaxK = kSamplerMaxTopK;
constexpr double kFxOne = 17592186044416.0;  // 2^44: fixed-point unit of bucket masses (weights <= 1)

static_assert(kCompactAt >= kMaxK, "a compaction must leave room for a sub-step");

// Pass 1 of the greedy and top_k <= 1024 rows runs over many blocks per row (sampler_part_kernel): block b
// of a row takes a segment of at most kSegCap tokens and keeps its K best keys (K = top_k, or n_probs for
// greedy, at least 1) plus the partial log-sum-exp (greedy); the row's block of sampler_kernel merges them.
constexpr int kPThreads = 256;
constexpr int kSegCap = 8192;         // tokens per segment (their keys fill 64 KB of shared memory)
constexpr int kPartBlocksMin = 64;    // segments per row when K allows (plan: at least vocab / kSegCap)
constexpr int kMaxPartBlocks = 1024;  // vocabularies up to 8M tokens
constexpr unsigned kCandCap = 16384;  // candidates per row that the merge takes in one buffer's worth

struct Smem {
  u64 buf[kBuf];                  // candidates
  unsigned pcnt[kMaxPartBlocks];  // candidates per segment (greedy / top_k rows)
  double pterm[kMaxPartBlocks];   // greedy: the segments' log-sum-exp terms
  u64 keep[kMaxK];                // compaction output
  u64 top[kSamplerMaxProbs];
  unsigned hist_cnt[256];
  u64 hist_fx[256];
  double red_d[kWarps];
  float red_f[kWarps];
  unsigned count;  // entries in buf
  unsigned kcount;
  u64 thr;  // admission threshold: a key enters buf when key >= thr
  int n_ovr;
  int sel_digit;
  unsigned sel_cnt, sel_above_cnt;
  u64 sel_above_fx;
  double target_fx;
  int i0, i1;
  double d0;
  // followed by the penalty bitmap [ceil(vocab / 32)] u32
};

struct RowCtx {
  const float* logits;  // [n]
  int n;                // n_sample
  const uint32_t* bitmap;
  const int32_t* ovr_tok;  // [n_ovr]
  const float* ovr_val;    // [n_ovr]
  int n_ovr;
  SamplerRow p;
};

// ---- keys

__device__ __forceinline__ uint32_t ord_bits(float v) {
  const uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);  // -0 and +0 compare equal: one key
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ u64 make_key(float v, int id) {
  return ((u64)ord_bits(v) << 32) | (u64)(0xffffffffu - (uint32_t)id);
}
__device__ __forceinline__ float key_val(u64 k) {
  const uint32_t o = (uint32_t)(k >> 32);
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}
__device__ __forceinline__ int key_id(u64 k) {
  return (int)(0xffffffffu - (uint32_t)k);
}
__device__ __forceinline__ u64 hi_mask(int shift) {  // bits above the digit at `shift`
  return shift >= 56 ? 0ull : (~0ull << (shift + 8));
}

__device__ __forceinline__ float penalise(float l, unsigned c, const SamplerRow& p) {
  l = l <= 0.0f ? __fmul_rn(l, p.repeat_penalty) : __fdiv_rn(l, p.repeat_penalty);
  return __fsub_rn(l, __fadd_rn(__fmul_rn((float)c, p.frequency_penalty), p.presence_penalty));
}

// e = exp((l - l0) / T) in f32, 1 for l == l0.
__device__ __forceinline__ float e_of(float l, float l0, float T) {
  return l == l0 ? 1.0f : expf(__fdiv_rn(__fsub_rn(l, l0), T));
}

// The largest key of the warp, in every lane.
__device__ __forceinline__ u64 warp_max_key(u64 k) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const u64 y = __shfl_xor_sync(kFullMask, k, o);
    k = y > k ? y : k;
  }
  return k;
}

__device__ __forceinline__ unsigned lanemask_lt() {
  unsigned m;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
  return m;
}

// Appends key to s.buf when ok (warp-uniform call). Returns the slot taken, or -1.
__device__ __forceinline__ int append(Smem& s, u64 key, bool ok) {
  const unsigned m = __ballot_sync(kFullMask, ok);
  if (m == 0) return -1;
  const int lane = threadIdx.x & 31, leader = __ffs(m) - 1;
  unsigned base = 0;
  if (lane == leader) base = atomicAdd(&s.count, (unsigned)__popc(m));
  base = __shfl_sync(kFullMask, base, leader);
  if (!ok) return -1;
  const int slot = (int)(base + __popc(m & lanemask_lt()));
  s.buf[slot] = key;
  return slot;
}

// Adds (1, w) to bucket d for the lanes with ok (warp-uniform call): one atomic per distinct bucket.
template <bool with_mass, class S>
__device__ __forceinline__ void hist_add(S& s, int d, bool ok, u64 w) {
  unsigned todo = __ballot_sync(kFullMask, ok);
  const int lane = threadIdx.x & 31;
  while (todo) {
    const int leader = __ffs(todo) - 1;
    const int dl = __shfl_sync(kFullMask, d, leader);
    const bool mine = ok && d == dl;
    const unsigned mm = __ballot_sync(kFullMask, mine);
    if constexpr (with_mass) {
      const u64 ws = warp_sum<u64>(mine ? w : 0ull);
      if (lane == leader) atomicAdd(&s.hist_fx[dl], ws);
    }
    if (lane == leader) atomicAdd(&s.hist_cnt[dl], (unsigned)__popc(mm));
    todo &= ~mm;
  }
}

__device__ __forceinline__ void hist_clear(Smem& s) {
  for (int i = threadIdx.x; i < 256; i += kThreads) s.hist_cnt[i] = 0, s.hist_fx[i] = 0;
}
template <class S>
__device__ __forceinline__ void hist_clear_cnt(S& s) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x) s.hist_cnt[i] = 0;
}

// Exclusive prefix sum over the block in a fixed order; total returned through *total.
__device__ __forceinline__ double block_excl_scan(Smem& s, double v, double* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(kFullMask, x, o);
    if (lane >= o) x += y;
  }
  double ex = __shfl_up_sync(kFullMask, x, 1);
  if (lane == 0) ex = 0.0;
  if (lane == 31) s.red_d[warp] = x;
  __syncthreads();
  if (warp == 0) {
    double w = s.red_d[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const double y = __shfl_up_sync(kFullMask, w, o);
      if (lane >= o) w += y;
    }
    s.red_d[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  const double r = (warp == 0 ? 0.0 : s.red_d[warp - 1]) + ex;
  *total = s.red_d[kWarps - 1];
  __syncthreads();
  return r;
}

__device__ __forceinline__ double block_sum_d(Smem& s, double v) {
  return block_sum(v, s.red_d);
}

// ---- streaming over the candidates of a row: the vocabulary (penalised tokens skipped) + the overrides.
// f(value, id, ok) is called by every thread the same number of times (warp-uniform).
template <class F>
__device__ __forceinline__ void for_each_elem(const RowCtx& r, F&& f) {
  constexpr int E = 8;
  for (int base = 0; base < r.n; base += kThreads * E) {
    float v[E];
    bool ok[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int id = base + e * kThreads + (int)threadIdx.x;
      ok[e] = id < r.n;
      v[e] = ok[e] ? __ldcg(r.logits + id) : 0.0f;
    }
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int id = base + e * kThreads + (int)threadIdx.x;
      const bool pen = ok[e] && ((r.bitmap[id >> 5] >> (id & 31)) & 1u);
      f(v[e], id, ok[e] && !pen);
    }
  }
  for (int base = 0; base < r.n_ovr; base += kThreads) {
    const int i = base + (int)threadIdx.x;
    const bool ok = i < r.n_ovr;
    f(ok ? r.ovr_val[i] : 0.0f, ok ? r.ovr_tok[i] : 0, ok);
  }
}

// ---- radix select over keys[0, cnt) (shared memory): a key L such that exactly k entries are >= L
// (1 <= k <= cnt; keys distinct). Early exit when the bucket holding the k-th key is kept whole. S: shared
// state with hist_cnt[256], sel_digit, sel_cnt, sel_above_cnt; any block size (a multiple of 32).
template <class S>
__device__ u64 radix_kth(S& s, const u64* keys, unsigned cnt, unsigned k) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  u64 prefix = 0;
  unsigned need = k;
  for (int shift = 56; shift >= 0; shift -= 8) {
    hist_clear_cnt(s);
    __syncthreads();
    const u64 hm = hi_mask(shift);
    for (unsigned i = threadIdx.x; i < cnt; i += blockDim.x) {  // shared-memory atomics: no warp-wide rounds
      const u64 key = keys[i];
      if ((key & hm) == prefix) atomicAdd(&s.hist_cnt[(key >> shift) & 255], 1u);
    }
    __syncthreads();
    if (warp == 0) {  // the digit whose bucket holds the need-th largest, counting from the top
      unsigned c[8], sum = 0;
#pragma unroll
      for (int b = 0; b < 8; ++b) sum += (c[b] = s.hist_cnt[lane * 8 + b]);
      unsigned x = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned y = __shfl_down_sync(kFullMask, x, o);
        if (lane + o < 32) x += y;
      }
      unsigned acc = x - sum;  // entries in higher lanes' digits
#pragma unroll
      for (int b = 7; b >= 0; --b) {
        if (acc < need && acc + c[b] >= need) {
          s.sel_digit = lane * 8 + b;
          s.sel_above_cnt = acc;
          s.sel_cnt = c[b];
        }
        acc += c[b];
      }
    }
    __syncthreads();
    need -= s.sel_above_cnt;
    prefix |= (u64)s.sel_digit << shift;
    if (s.sel_cnt == need) return prefix;
  }
  return prefix;
}

// Keeps the k best of s.buf[0, s.count) and raises the threshold to the k-th key. Block-wide.
__device__ void compact(Smem& s, unsigned k) {
  const unsigned cnt = s.count;
  if (cnt <= k) return;
  const u64 lo = radix_kth(s, s.buf, cnt, k);
  if (threadIdx.x == 0) s.kcount = 0;
  __syncthreads();
  const int lane = threadIdx.x & 31;
  for (unsigned base = 0; base < cnt; base += kThreads) {
    const unsigned i = base + threadIdx.x;
    const u64 key = i < cnt ? s.buf[i] : 0ull;
    const bool ok = i < cnt && key >= lo;
    const unsigned m = __ballot_sync(kFullMask, ok);
    if (m) {
      const int leader = __ffs(m) - 1;
      unsigned b = 0;
      if (lane == leader) b = atomicAdd(&s.kcount, (unsigned)__popc(m));
      b = __shfl_sync(kFullMask, b, leader);
      if (ok) s.keep[b + __popc(m & lanemask_lt())] = key;
    }
  }
  __syncthreads();
  for (unsigned i = threadIdx.x; i < k; i += kThreads) s.buf[i] = s.keep[i];
  if (threadIdx.x == 0) {
    s.count = k;
    s.thr = lo;
  }
  __syncthreads();
}

// Sorts s.buf[0, cnt) descending (bitonic over the next power of two, padded with 0 keys).
__device__ void sort_desc(Smem& s, unsigned cnt) {
  unsigned p = 1;
  while (p < cnt) p <<= 1;
  for (unsigned i = cnt + threadIdx.x; i < p; i += kThreads) s.buf[i] = 0ull;
  __syncthreads();
  for (unsigned k = 2; k <= p; k <<= 1) {
    for (unsigned j = k >> 1; j > 0; j >>= 1) {
      for (unsigned i = threadIdx.x; i < p; i += kThreads) {
        const unsigned ij = i ^ j;
        if (ij > i) {
          const u64 a = s.buf[i], b = s.buf[ij];
          const bool desc = (i & k) == 0;
          if (desc ? a < b : a > b) s.buf[i] = b, s.buf[ij] = a;
        }
      }
      __syncthreads();
    }
  }
}

// ---- outputs

struct OutPtrs {
  int32_t* token;
  float* logprob;
  int32_t* top_token;  // [kSamplerMaxProbs] of this row, or null
  float* top_lp;
  int32_t* error;
};

// Top-n entries j < n_top from key(j) and lp(j); the rest of the 20 slots -1 / -inf.
template <class KeyF, class LpF>
__device__ __forceinline__ void write_top(const OutPtrs& o, int n_top, KeyF key, LpF lp) {
  if (!o.top_token) return;
  for (int j = threadIdx.x; j < kSamplerMaxProbs; j += kThreads) {
    if (j < n_top) {
      o.top_token[j] = key_id(key(j));
      o.top_lp[j] = lp(j);
    } else {
      o.top_token[j] = -1;
      o.top_lp[j] = -INFINITY;
    }
  }
}

__device__ __forceinline__ void write_simple(const OutPtrs& o, int token, float lp, int err) {
  if (threadIdx.x == 0) {
    *o.token = token;
    *o.logprob = lp;
    *o.error = err;
  }
  write_top(
      o, 0, [](int) { return 0ull; }, [](int) { return 0.0f; });
}

// A draw over the weights w_of(j) (float), j in [0, m), each thread owning the chunk [j0, j0 + ch): the
// first j whose running sum (the block's exclusive scan of the chunks' sums, then the chunk's own, in double)
// exceeds u times the total; if none (rounding), the last j with a non-zero weight; else 0. Used by finish()
// (the token's draw) and verify_pick (the residual's).
template <class WF>
__device__ int draw_cumulative(Smem& s, int m, int j0, int ch, double u, WF w_of) {
  double loc = 0.0;
  for (int j = j0; j < j0 + ch && j < m; ++j) loc += (double)w_of(j);
  double total;
  const double ex = block_excl_scan(s, loc, &total);
  const double target = u * total;
  if (threadIdx.x == 0) s.i0 = m, s.i1 = -1;
  __syncthreads();
  double run = ex;
  bool found = false;
  for (int j = j0; j < j0 + ch && j < m; ++j) {
    const float wj = w_of(j);
    run += (double)wj;
    if (!found && target < run) {
      atomicMin(&s.i0, j);
      found = true;
    }
    if (wj > 0.0f) atomicMax(&s.i1, j);
  }
  __syncthreads();
  return s.i0 < m ? s.i0 : (s.i1 >= 0 ? s.i1 : 0);
}

// ---- speculative verification (SamplerRow::x): the index in s.buf[0, m2) of the row's token. The host's
// rule (engine/speculative.cpp): keep x when u_accept * q(x) < p(x) (q(x) > 0), else draw from the residual
// max(0, p - q) over p's kept set, best first, by u_residual * total < cumulative sum (double), else the last
// non-zero entry. q goes to s.keep as (id << 32 | float bits of q).
template <class PF>
__device__ int verify_pick(Smem& s, const SamplerRow& p, int m2, PF p_of) {
  __syncthreads();  // every thread has read finish()'s pick from s.i0
  const int x = __ldcg(p.x);
  const int nq = p.q ? (int)__ldcg(&p.q->n) : 1;
  const int nq_c = nq < 0 ? 0 : (nq > kMaxK ? kMaxK : nq);
  for (int i = threadIdx.x; i < nq_c; i += kThreads) {
    const int id = p.q ? __ldcg(&p.q->id[i]) : x;
    const float qv = p.q ? __ldcg(&p.q->p[i]) : 1.0f;
    s.keep[i] = ((u64)(uint32_t)id << 32) | (u64)__float_as_uint(qv);
  }
  if (threadIdx.x == 0) s.i0 = -1, s.i1 = -1, s.d0 = 0.0;
  __syncthreads();
  auto q_of = [&](int id) {  // q(id), 0 when id is not in q's kept set
    for (int i = 0; i < nq_c; ++i)
      if ((int)(s.keep[i] >> 32) == id) return __uint_as_float((uint32_t)s.keep[i]);
    return 0.0f;
  };
  for (int j = threadIdx.x; j < m2; j += kThreads)
    if (key_id(s.buf[j]) == x) s.i0 = j;  // ids are distinct: one writer at most
  if (threadIdx.x == 0) s.d0 = (double)q_of(x);
  __syncthreads();
  const int jx = s.i0;
  const double px = jx >= 0 ? (double)p_of(jx) : 0.0, qx = s.d0;
  if (qx > 0.0 && philox_uniform(p.seed, p.position, DrawStream::accept) * qx < px) return jx;
  // The residual r_j = (float)max(0, p_j - q(id_j)); contiguous chunks per thread, as finish() draws.
  const int ch = (m2 + kThreads - 1) / kThreads;
  const int j0 = threadIdx.x * ch;
  auto r_of = [&](int j) { return (float)fmax(0.0, (double)p_of(j) - (double)q_of(key_id(s.buf[j]))); };
  return draw_cumulative(s, m2, j0, ch, philox_uniform(p.seed, p.position, DrawStream::residual), r_of);
}

// ---- finishing a sorted candidate list s.buf[0, m) in shared memory (m >= 1). With filters, min-p and
// top-p are applied here (top-k already is: m <= k); without, the list is the kept set as is.
__device__ void finish(Smem& s, const RowCtx& r, int m, bool filters, int n_probs, const OutPtrs& o) {
  const SamplerRow& p = r.p;
  const float T = p.temperature;
  const float l0 = key_val(s.buf[0]);
  const int ch = (m + kThreads - 1) / kThreads;  // contiguous chunk per thread
  const int j0 = threadIdx.x * ch;

  int m1 = m;
  if (filters && p.min_p > 0.0f) {  // the first j >= 1 with !(e_j >= min_p) ends the prefix
    if (threadIdx.x == 0) s.i0 = m;
    __syncthreads();
    for (int j = 1 + (int)threadIdx.x; j < m; j += kThreads)
      if (!(e_of(key_val(s.buf[j]), l0, T) >= p.min_p)) atomicMin(&s.i0, j);
    __syncthreads();
    m1 = s.i0;
  }
  // e sums over [0, m1)
  double loc = 0.0;
  for (int j = j0; j < j0 + ch && j < m1; ++j) loc += (double)e_of(key_val(s.buf[j]), l0, T);
  double sum1;
  const double ex = block_excl_scan(s, loc, &sum1);
  int m2 = m1;
  double sum = sum1;
  if (filters && p.top_p < 1.0f) {  // smallest prefix with cumsum >= top_p * sum1
    const double target = (double)p.top_p * sum1;
    if (threadIdx.x == 0) s.i0 = m1;
    __syncthreads();
    double run = ex;
    for (int j = j0; j < j0 + ch && j < m1; ++j) {
      run += (double)e_of(key_val(s.buf[j]), l0, T);
      if (run >= target) {
        atomicMin(&s.i0, j);
        break;
      }
    }
    __syncthreads();
    m2 = s.i0 < m1 ? s.i0 + 1 : m1;
    run = ex;
    for (int j = j0; j < j0 + ch && j < m2; ++j) {
      run += (double)e_of(key_val(s.buf[j]), l0, T);
      if (j == m2 - 1) s.d0 = run;
    }
    __syncthreads();
    sum = s.d0;
    __syncthreads();
  }
  // p_j = (float)(e_j * (1 / sum)); draw u * total < cumsum
  const double inv = 1.0 / sum;
  auto p_of = [&](int j) { return (float)((double)e_of(key_val(s.buf[j]), l0, T) * inv); };
  int pick = draw_cumulative(s, m2, j0, ch, philox_uniform(p.seed, p.position, DrawStream::token), p_of);
  if (p.propose && filters) {  // Output::propose: the kept distribution, for the follower's verification
    const int n_keep = m2 <= kSamplerMaxTopK ? m2 : 0;
    for (int j = threadIdx.x; j < n_keep; j += kThreads) {
      p.propose->id[j] = key_id(s.buf[j]);
      p.propose->p[j] = p_of(j);
    }
    if (threadIdx.x == 0) p.propose->n = n_keep;
  }
  if (p.x && filters) pick = verify_pick(s, p, m2, p_of);
  const double log_sum = log(sum);
  const double dT = (double)T, dl0 = (double)l0;
  auto lp_of = [&](int j) {
    const float l = key_val(s.buf[j]);
    const double d = l == l0 ? 0.0 : ((double)l - dl0) / dT;
    return (float)(d - log_sum);
  };
  if (threadIdx.x == 0) {
    *o.token = key_id(s.buf[pick]);
    *o.logprob = lp_of(pick);
    *o.error = 0;
  }
  const int n_top = n_probs < m2 ? n_probs : m2;
  write_top(
      o, n_top, [&](int j) { return s.buf[j]; }, lp_of);
}

// ---- all-tokens path helpers

struct Kept {  // candidate filter of the all-tokens path: key >= lo and (min-p) e >= min_p or the best
  u64 lo;
  u64 best;  // key of the best candidate, always kept (min_p > 1 keeps it alone, as the prefix rule does)
  bool minp;
  float theta;  // logit prefilter: l < theta implies e < min_p
  float l0, T, min_p;
  __device__ __forceinline__ bool operator()(float v, u64 key) const {
    if (key < lo) return false;
    if (!minp || key == best) return true;
    return v >= theta && e_of(v, l0, T) >= min_p;
  }
};

// Collects the candidates with kept && (key & mask) == prefix into s.buf (their number is known to be
// <= kBuf) and sorts them; returns how many.
__device__ unsigned collect_sorted(Smem& s, const RowCtx& r, const Kept& kept, u64 mask, u64 prefix) {
  if (threadIdx.x == 0) s.count = 0;
  __syncthreads();
  for_each_elem(r, [&](float v, int id, bool ok) {
    const u64 key = make_key(v, id);
    append(s, key, ok && kept(v, key) && (key & mask) == prefix);
  });
  __syncthreads();
  const unsigned n = s.count;
  sort_desc(s, n);
  return n;
}

struct Cross {
  bool found;
  u64 key;        // the crossing candidate
  double before;  // weight of the candidates before it (real units)
  unsigned rank;  // its index in the kept order
};

// Finds, in the order of the kept candidates, the first j whose inclusive cumulative weight reaches the
// target: count mode (w = 1, target = k, cum >= k), or weight mode (w = weight(v) <= 1, target = frac *
// total weight, cum >= target when ge, else cum > target). Buckets by 8-bit digits of the key (fixed-point
// masses), the crossing bucket finished exactly once it holds <= kCollect candidates.
template <bool kCount, class W>
__device__ Cross cross_search(Smem& s, const RowCtx& r, const Kept& kept, W weight, double frac, unsigned k,
                              bool ge) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  u64 prefix = 0, above_fx = 0;
  unsigned above_cnt = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    hist_clear(s);
    __syncthreads();
    const u64 hm = hi_mask(shift);
    for_each_elem(r, [&](float v, int id, bool ok) {
      const u64 key = make_key(v, id);
      const bool in = ok && (key & hm) == prefix && kept(v, key);
      u64 w = 0;
      if (!kCount && in) w = (u64)llrint((double)weight(v) * kFxOne);
      hist_add<!kCount>(s, (int)((key >> shift) & 255), in, w);
    });
    __syncthreads();
    if (warp == 0) {
      if (shift == 56 && !kCount) {  // the target, from the total mass
        u64 t = 0;
        for (int b = 0; b < 8; ++b) t += s.hist_fx[lane * 8 + b];
        t = warp_sum<u64>(t);
        if (lane == 0) s.target_fx = frac * (double)t;
      }
      __syncwarp();
      const double target = kCount ? (double)k : s.target_fx;
      u64 c[8], sum = 0;
      unsigned cn[8];
#pragma unroll
      for (int b = 0; b < 8; ++b) {
        cn[b] = s.hist_cnt[lane * 8 + b];
        c[b] = kCount ? (u64)cn[b] : s.hist_fx[lane * 8 + b];
        sum += c[b];
      }
      u64 x = sum;
      unsigned xc = 0;
      for (int b = 0; b < 8; ++b) xc += cn[b];
      const unsigned sumc = xc;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const u64 y = __shfl_down_sync(kFullMask, x, o);
        const unsigned yc = __shfl_down_sync(kFullMask, xc, o);
        if (lane + o < 32) x += y, xc += yc;
      }
      u64 acc = above_fx + (x - sum);
      unsigned accc = above_cnt + (xc - sumc);
      int found = -1;
      u64 f_acc = 0;
      unsigned f_accc = 0, f_cnt = 0;
#pragma unroll
      for (int b = 7; b >= 0; --b) {
        const double hi = (double)(acc + c[b]);
        const bool cross = cn[b] > 0 && (ge || kCount ? hi >= target : hi > target);
        if (found < 0 && cross) found = lane * 8 + b, f_acc = acc, f_accc = accc, f_cnt = cn[b];
        acc += c[b];
        accc += cn[b];
      }
      // the crossing digit is the highest one with found >= 0
      const unsigned any = __ballot_sync(kFullMask, found >= 0);
      if (lane == 0) s.sel_digit = -1;
      __syncwarp();
      if (any) {
        const int src = 31 - __clz(any);
        if (lane == src) {
          s.sel_digit = found;
          s.sel_above_fx = f_acc;
          s.sel_above_cnt = f_accc;
          s.sel_cnt = f_cnt;
        }
      }
    }
    __syncthreads();
    const int d = s.sel_digit;
    if (d < 0) return Cross{false, 0, 0.0, 0};
    prefix |= (u64)d << shift;
    above_fx = s.sel_above_fx;
    above_cnt = s.sel_above_cnt;
    const unsigned bucket = s.sel_cnt;
    __syncthreads();
    if (bucket <= (unsigned)kCollect || shift == 0) {
      const u64 mask = ~0ull << shift;
      const unsigned n = collect_sorted(s, r, kept, mask, prefix);
      // exact scan of the bucket, after the weight above it
      const double above = kCount ? (double)above_cnt : (double)above_fx / kFxOne;
      const double target = kCount ? (double)k : s.target_fx / kFxOne;
      const int ch = (int)((n + kThreads - 1) / kThreads), j0 = threadIdx.x * ch;
      double loc = 0.0;
      for (int j = j0; j < j0 + ch && j < (int)n; ++j)
        loc += kCount ? 1.0 : (double)weight(key_val(s.buf[j]));
      double tot;
      const double ex = block_excl_scan(s, loc, &tot);
      if (threadIdx.x == 0) s.i0 = (int)n;
      __syncthreads();
      double run = above + ex;
      for (int j = j0; j < j0 + ch && j < (int)n; ++j) {
        run += kCount ? 1.0 : (double)weight(key_val(s.buf[j]));
        if (ge || kCount ? run >= target : run > target) {
          atomicMin(&s.i0, j);
          break;
        }
      }
      __syncthreads();
      const int j =
          s.i0 < (int)n ? s.i0 : (int)n - 1;  // none: rounding between the bucket masses and the scan
      // weight before j
      if (threadIdx.x == 0) s.d0 = 0.0;
      __syncthreads();
      run = above + ex;
      for (int jj = j0; jj < j0 + ch && jj < (int)n; ++jj) {
        if (jj == j) s.d0 = run;
        run += kCount ? 1.0 : (double)weight(key_val(s.buf[jj]));
      }
      __syncthreads();
      const Cross c{n > 0, n > 0 ? s.buf[j] : 0ull, s.d0, above_cnt + (unsigned)j};
      __syncthreads();
      return c;
    }
  }
  return Cross{false, 0, 0.0, 0};
}

struct PartMeta {  // one per (row, segment)
  unsigned count;  // candidates written
  int bad;         // a NaN / Inf logit in the segment
  float m;         // greedy: largest (penalised) logit of the segment
  float pad;
  double s;  // greedy: sum of expf(l - m) over the segment
};

struct SampArgs {
  const float* logits;
  int64_t ld;
  int n_sample;
  const SamplerRow* rows;
  SamplerOutputs out;
  uint8_t* ws;
  int vocab, max_hist;
  int part_blocks;      // row stride of part_meta (the most segments a row can have)
  int seg_max;          // segments per row at most in this launch (grid.x of sampler_part_kernel)
  int part_cap;         // candidate keys per row
  u64* part_keys;       // [rows][part_cap]
  PartMeta* part_meta;  // [rows][part_blocks]
};

// The row's parameters, read after pdl_wait through L2.
__device__ __forceinline__ SamplerRow load_row(const SamplerRow* p) {
  static_assert(sizeof(SamplerRow) % 8 == 0, "SamplerRow is read as 8-byte words");
  u64 w[sizeof(SamplerRow) / 8];
#pragma unroll
  for (int i = 0; i < (int)(sizeof(SamplerRow) / 8); ++i) w[i] = __ldcg(reinterpret_cast<const u64*>(p) + i);
  SamplerRow r;
  memcpy(&r, w, sizeof r);
  return r;
}

struct RowMode {
  bool greedy, fast;  // fast: 1 <= top_k <= 1024, top_k < n_sample
  int n_probs;        // clamped to [0, kSamplerMaxProbs]
  unsigned K;         // candidates kept by pass 1
};
__device__ __forceinline__ RowMode row_mode(const SamplerRow& p, int n) {
  RowMode m;
  m.greedy = !(p.temperature > 0.0f);
  m.fast = !m.greedy && p.top_k >= 1 && p.top_k <= kMaxK && p.top_k < n;
  m.n_probs = p.n_probs < 0 ? 0 : (p.n_probs > kSamplerMaxProbs ? kSamplerMaxProbs : p.n_probs);
  m.K = m.fast ? (unsigned)p.top_k : (unsigned)(m.n_probs > 1 ? m.n_probs : 1);
  return m;
}
// Segments of a greedy / top_k row: at most seg_max (the launch's grid: one wave of segment blocks over
// all rows, at most kPartBlocksMin per row) and at most kCandCap / K (the merge's buffer), never fewer than
// segments of kSegCap tokens need. Block b owns tokens [b seg, (b + 1) seg) and writes its candidates at
// part_keys[row][b K ...]; the plan sizes part_cap for the worst K.
__device__ __forceinline__ int part_segments(const SampArgs& a, unsigned K) {
  const int lo = (a.n_sample + kSegCap - 1) / kSegCap;
  const int by_k = (int)(kCandCap / K);
  int nb = by_k < a.seg_max ? by_k : a.seg_max;
  return nb > lo ? nb : lo;
}

__device__ __forceinline__ bool has_penalties(const SamplerRow& p) {
  return p.n_hist > 0 && p.hist &&
         (p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f);
}

struct PSmem {
  u64 keys[kSegCap];
  unsigned hist_cnt[256];
  u64 red_k[kPThreads / 32];
  double red_d[kPThreads / 32];
  unsigned count;
  int sel_digit;
  unsigned sel_cnt, sel_above_cnt;
};

// Pass 1 of a greedy / top_k row over one segment: NaN / Inf check, the segment's penalties (the counters
// of its tokens are this block's alone), its K best keys and (greedy) its log-sum-exp partial.
__global__ void __launch_bounds__(kPThreads) sampler_part_kernel(SampArgs a) {
  extern __shared__ u64 psmem_raw[];
  PSmem& s = *reinterpret_cast<PSmem*>(psmem_raw);
  pdl_trigger();
  pdl_wait();
  const int row = blockIdx.y, b = blockIdx.x, tid = threadIdx.x;
  const SamplerRow p = load_row(a.rows + row);
  if (p.logits_row < 0) return;
  const int n = a.n_sample;
  const RowMode md = row_mode(p, n);
  if (!md.greedy && !md.fast) return;  // all-tokens rows: sampler_kernel does everything
  const int nb = part_segments(a, md.K);
  if (b >= nb) return;
  const int seg = (n + nb - 1) / nb;
  const int s0 = b * seg;
  const int s1 = s0 + seg < n ? s0 + seg : n;
  const int cnt = s1 > s0 ? s1 - s0 : 0;
  PartMeta* meta = a.part_meta + (size_t)row * a.part_blocks + b;
  u64* out = a.part_keys + (size_t)row * a.part_cap + (size_t)b * md.K;
  const float* lg = a.logits + (int64_t)p.logits_row * a.ld;

  bool bad = false;
  constexpr int E = 8;
  for (int i0 = 0; i0 < cnt; i0 += kPThreads * E) {
    float v[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int i = i0 + e * kPThreads + tid;
      v[e] = i < cnt ? __ldcg(lg + s0 + i) : 0.0f;
    }
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int i = i0 + e * kPThreads + tid;
      if (i < cnt) {
        if (!isfinite(v[e]) && !(p.rules && v[e] == -INFINITY)) bad = true;
        s.keys[i] = make_key(v[e], s0 + i);
      }
    }
  }
  if (has_penalties(p) && cnt > 0) {
    uint32_t* counts =
        reinterpret_cast<uint32_t*>(a.ws + (size_t)row * ((size_t)a.vocab + 2 * (size_t)a.max_hist) * 4);
    const int nh = p.n_hist < a.max_hist ? p.n_hist : a.max_hist;
    for (int i = tid; i < nh; i += kPThreads) {
      const int t = __ldcg(p.hist + i);
      if (t >= s0 && t < s1) atomicAdd(&counts[t], 1u);
    }
    __syncthreads();
    for (int i = tid; i < nh; i += kPThreads) {
      const int t = __ldcg(p.hist + i);
      if (t < s0 || t >= s1) continue;
      const unsigned c = atomicExch(&counts[t], 0u);
      if (c == 0) continue;  // another thread owns this token
      s.keys[t - s0] = make_key(penalise(__ldcg(lg + t), c, p), t);
    }
  }
  bad = __syncthreads_or(bad);
  if (bad || cnt == 0) {
    if (tid == 0) *meta = PartMeta{0u, bad ? 1 : 0, -INFINITY, 0.0f, 0.0};
    return;
  }
  // the segment's best key
  u64 mx = 0;
  for (int i = tid; i < cnt; i += kPThreads) mx = s.keys[i] > mx ? s.keys[i] : mx;
  mx = warp_max_key(mx);
  if ((tid & 31) == 0) s.red_k[tid >> 5] = mx;
  __syncthreads();
  mx = s.red_k[0];
  for (int w = 1; w < kPThreads / 32; ++w) mx = s.red_k[w] > mx ? s.red_k[w] : mx;
  float m_b = -INFINITY;
  double s_b = 0.0;
  if (md.greedy) {
    m_b = key_val(mx);
    double loc = 0.0;
    if (m_b != -INFINITY)  // else a segment of refused tokens only (SamplerRow::rules): its sum is 0
      for (int i = tid; i < cnt; i += kPThreads) loc += (double)expf(key_val(s.keys[i]) - m_b);
    s_b = block_sum(loc, s.red_d);
  }
  unsigned kb;
  if ((unsigned)cnt <= md.K) {
    for (int i = tid; i < cnt; i += kPThreads) out[i] = s.keys[i];
    kb = (unsigned)cnt;
  } else if (md.K == 1) {
    if (tid == 0) out[0] = mx;
    kb = 1;
  } else {
    const u64 lo = radix_kth(s, s.keys, (unsigned)cnt, md.K);
    if (tid == 0) s.count = 0;
    __syncthreads();
    const int lane = tid & 31;
    for (int base = 0; base < cnt; base += kPThreads) {
      const int i = base + tid;
      const u64 key = i < cnt ? s.keys[i] : 0ull;
      const bool ok = i < cnt && key >= lo;
      const unsigned m = __ballot_sync(kFullMask, ok);
      if (m) {
        const int leader = __ffs(m) - 1;
        unsigned at = 0;
        if (lane == leader) at = atomicAdd(&s.count, (unsigned)__popc(m));
        at = __shfl_sync(kFullMask, at, leader);
        if (ok) out[at + __popc(m & lanemask_lt())] = key;
      }
    }
    kb = md.K;
  }
  if (tid == 0) *meta = PartMeta{kb, 0, m_b, 0.0f, s_b};
}

__device__ unsigned merge_candidates(Smem& s, const u64* keys, unsigned total, unsigned K);
__device__ void finish_merged(const SampArgs& a, const SamplerRow& p, const RowMode& md, Smem& s,
                              const OutPtrs& o, const PartMeta* meta, int nb, unsigned m0);

// Greedy and top_k <= 1024 rows: merge the segments' candidates (sampler_part_kernel) and finish.
__device__ void sample_row_merged(const SampArgs& a, int row, const SamplerRow& p, const RowMode& md, Smem& s,
                                  const OutPtrs& o) {
  const int nb = part_segments(a, md.K);
  const PartMeta* meta = a.part_meta + (size_t)row * a.part_blocks;
  int bad = 0;
  for (int b = threadIdx.x; b < nb; b += kThreads) {
    bad |= __ldcg(&meta[b].bad);
    s.pcnt[b] = __ldcg(&meta[b].count);
  }
  if (threadIdx.x == 0) s.count = 0, s.thr = 0;
  if (__syncthreads_or(bad)) {
    write_simple(o, 0, __int_as_float(0x7fc00000), 1);
    return;
  }
  const u64* keys = a.part_keys + (size_t)row * a.part_cap;
  const unsigned K = md.K;
  const unsigned total = (unsigned)nb * K;
  unsigned m0;
  if (total <= (unsigned)kThreads) {
    // At most one candidate per thread (greedy, K = max(1, n_probs) <= 16 with 64 segments): the K best by K
    // rounds of a block-wide maximum (keys are distinct: they hold the token id), two barriers per round,
    // instead of the buffer, compaction and bitonic sort below (~45 barriers).
    const unsigned i = threadIdx.x, b = i / K;
    u64 mine = i < total && i - b * K < s.pcnt[b] ? __ldcg(keys + i) : 0ull;
    const unsigned valid = (unsigned)__syncthreads_count(mine != 0ull);
    m0 = valid < K ? valid : K;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (unsigned j = 0; j < m0; ++j) {
      const u64 mx = warp_max_key(mine);
      if (lane == 0) s.hist_fx[warp] = mx;
      __syncthreads();
      if (warp == 0) {
        const u64 v = warp_max_key(lane < kWarps ? s.hist_fx[lane] : 0ull);
        if (lane == 0) s.buf[j] = v;
      }
      __syncthreads();
      if (mine == s.buf[j]) mine = 0ull;
    }
  } else {
    m0 = merge_candidates(s, keys, total, K);
  }
  finish_merged(a, p, md, s, o, meta, nb, m0);
}

// The general merge: candidates through the buffer with threshold admission and compaction, then sorted.
__device__ unsigned merge_candidates(Smem& s, const u64* keys, unsigned total, unsigned K) {
  constexpr int E = 2 * kSub;
  for (unsigned base = 0; base < total; base += kThreads * E) {
    u64 kv[E];
    bool ok[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const unsigned i = base + e * kThreads + threadIdx.x;
      const unsigned b = i / K;
      ok[e] = i < total && i - b * K < s.pcnt[b];
      kv[e] = ok[e] ? __ldcg(keys + i) : 0ull;
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      int my_max = -1;
#pragma unroll
      for (int e = half * kSub; e < half * kSub + kSub; ++e) {
        const int slot = append(s, kv[e], ok[e] && kv[e] >= s.thr);
        if (slot > my_max) my_max = slot;
      }
      if (__syncthreads_or(my_max >= kCompactAt)) compact(s, K);
    }
  }
  __syncthreads();
  compact(s, K);
  const unsigned m0 = s.count;  // >= 1
  sort_desc(s, m0);
  return m0;
}

// s.buf[0, m0): the row's best candidates, sorted descending.
__device__ void finish_merged(const SampArgs& a, const SamplerRow& p, const RowMode& md, Smem& s,
                              const OutPtrs& o, const PartMeta* meta, int nb, unsigned m0) {
  if (md.greedy) {
    const float M = key_val(s.buf[0]);
    for (int b = threadIdx.x; b < nb; b += kThreads)
      s.pterm[b] = s.pcnt[b] ? __ldcg(&meta[b].s) * exp((double)__ldcg(&meta[b].m) - (double)M) : 0.0;
    __syncthreads();
    if (threadIdx.x == 0) {  // in segment order
      double S = 0.0;
      for (int b = 0; b < nb; ++b) S += s.pterm[b];
      s.d0 = S;
    }
    __syncthreads();
    const double log_sum = log(s.d0);
    auto lp_of = [&](int j) {
      const float l = key_val(s.buf[j]);
      const double d = l == M ? 0.0 : (double)l - (double)M;
      return (float)(d - log_sum);
    };
    if (threadIdx.x == 0) {
      *o.token = key_id(s.buf[0]);
      *o.logprob = (float)(0.0 - log_sum);
      *o.error = 0;
    }
    write_top(
        o, md.n_probs < (int)m0 ? md.n_probs : (int)m0, [&](int j) { return s.buf[j]; }, lp_of);
    return;
  }
  const RowCtx r{nullptr, a.n_sample, nullptr, nullptr, nullptr, 0, p};
  finish(s, r, (int)m0, true, md.n_probs, o);
}

__device__ void sample_row(const SampArgs& a, int row, Smem& s, uint32_t* bitmap) {
  const SamplerRow p = load_row(a.rows + row);
  OutPtrs o{a.out.token + row, a.out.logprob + row,
            a.out.top_token ? a.out.top_token + (int64_t)row * kSamplerMaxProbs : nullptr,
            a.out.top_logprob ? a.out.top_logprob + (int64_t)row * kSamplerMaxProbs : nullptr,
            a.out.error + row};
  if (p.logits_row < 0) {
    write_simple(o, -1, __int_as_float(0x7fc00000), 0);
    return;
  }
  const int n = a.n_sample;
  const RowMode md = row_mode(p, n);
  if (md.greedy || md.fast) {
    sample_row_merged(a, row, p, md, s, o);
    return;
  }
  uint32_t* counts =
      reinterpret_cast<uint32_t*>(a.ws + (size_t)row * ((size_t)a.vocab + 2 * (size_t)a.max_hist) * 4);
  int32_t* ovr_tok = reinterpret_cast<int32_t*>(counts + a.vocab);
  float* ovr_val = reinterpret_cast<float*>(ovr_tok + a.max_hist);
  RowCtx r{a.logits + (int64_t)p.logits_row * a.ld, n, bitmap, ovr_tok, ovr_val, 0, p};

  const int n_words = (n + 31) / 32;
  for (int i = threadIdx.x; i < n_words; i += kThreads) bitmap[i] = 0;
  if (threadIdx.x == 0) s.count = 0, s.thr = 0, s.n_ovr = 0;
  __syncthreads();

  // ---- penalties: distinct window tokens with their counts -> override values + bitmap
  const bool pen = p.n_hist > 0 && p.hist &&
                   (p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f);
  if (pen) {
    const int nh = p.n_hist < a.max_hist ? p.n_hist : a.max_hist;
    for (int i = threadIdx.x; i < nh; i += kThreads) {
      const int t = __ldcg(p.hist + i);
      if (t >= 0 && t < n) atomicAdd(&counts[t], 1u);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nh; i += kThreads) {
      const int t = __ldcg(p.hist + i);
      if (t < 0 || t >= n) continue;
      const unsigned c = atomicExch(&counts[t], 0u);
      if (c == 0) continue;  // another thread owns this token
      const int k = atomicAdd(&s.n_ovr, 1);
      ovr_tok[k] = t;
      ovr_val[k] = penalise(__ldcg(r.logits + t), c, p);
      atomicOr(&bitmap[t >> 5], 1u << (t & 31));
    }
    __syncthreads();
    r.n_ovr = s.n_ovr;
  }

  // ---- pass 1: the max and the n_probs best keys
  const int n_probs = md.n_probs;
  const unsigned K = md.K;
  bool bad = false;
  {
    auto consider = [&](float v, int id, bool ok, int& my_max) {
      const u64 key = make_key(v, id);
      const int slot = append(s, key, ok && key >= s.thr);
      if (slot > my_max) my_max = slot;
    };
    constexpr int E = 2 * kSub;
    for (int base = 0; base < n; base += kThreads * E) {
      float v[E];
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int id = base + e * kThreads + (int)threadIdx.x;
        v[e] = id < n ? __ldcg(r.logits + id) : 0.0f;
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        int my_max = -1;
#pragma unroll
        for (int e = half * kSub; e < half * kSub + kSub; ++e) {
          const int id = base + e * kThreads + (int)threadIdx.x;
          bool ok = id < n;
          if (ok && !isfinite(v[e]) && !(p.rules && v[e] == -INFINITY)) bad = true;
          if (ok && ((bitmap[id >> 5] >> (id & 31)) & 1u)) ok = false;  // its override stands for it
          consider(v[e], id, ok, my_max);
        }
        if (__syncthreads_or(my_max >= kCompactAt)) compact(s, K);
      }
    }
    for (int base = 0; base < r.n_ovr; base += kThreads * kSub) {
      int my_max = -1;
#pragma unroll
      for (int e = 0; e < kSub; ++e) {
        const int i = base + e * kThreads + (int)threadIdx.x;
        const bool ok = i < r.n_ovr;
        consider(ok ? ovr_val[i] : 0.0f, ok ? ovr_tok[i] : 0, ok, my_max);
      }
      if (__syncthreads_or(my_max >= kCompactAt)) compact(s, K);
    }
  }
  if (__syncthreads_or(bad)) {
    write_simple(o, 0, __int_as_float(0x7fc00000), 1);
    return;
  }
  compact(s, K);
  const unsigned m0 = s.count;  // >= 1
  sort_desc(s, m0);

  // ---- all tokens (top_k <= 0, >= n_sample or > kMaxK)
  const int n_top0 = n_probs < (int)m0 ? n_probs : (int)m0;
  for (int j = threadIdx.x; j < n_top0; j += kThreads) s.top[j] = s.buf[j];
  const float T = p.temperature;
  const float l0 = key_val(s.buf[0]);
  Kept kept{0ull, s.buf[0], p.min_p > 0.0f, -INFINITY, l0, T, p.min_p};
  if (kept.minp && p.min_p <= 1.0f) {
    const float lg = T * logf(p.min_p);
    const float th = l0 + lg - 1e-3f * (1.0f + fabsf(l0) + fabsf(lg));
    if (isfinite(th)) kept.theta = th;
  }
  const unsigned k_eff = (p.top_k <= 0 || p.top_k >= n) ? 0xffffffffu : (unsigned)p.top_k;
  __syncthreads();

  // kept candidates (min-p)
  unsigned cnt_loc = 0;
  for_each_elem(r, [&](float v, int id, bool ok) { cnt_loc += (ok && kept(v, make_key(v, id))) ? 1u : 0u; });
  unsigned n0 = (unsigned)block_sum_d(s, (double)cnt_loc);

  if (k_eff < n0 && n0 > (unsigned)kCollect) {  // top-k cut by count over the vocabulary
    const Cross c = cross_search<true>(
        s, r, kept, [](float) { return 1.0f; }, 0.0, k_eff, true);
    if (c.found) kept.lo = c.key, n0 = k_eff;
  }
  if (n0 <= (unsigned)kCollect) {
    const unsigned m = collect_sorted(s, r, kept, 0ull, 0ull);
    finish(s, r, (int)(m < k_eff ? m : k_eff), true, n_probs, o);
    return;
  }

  // large kept set: top-p cut, then the draw, by threshold searches
  auto e_w = [&](float v) { return e_of(v, l0, T); };
  double S;
  unsigned n1 = n0;
  if (p.top_p < 1.0f) {
    const Cross c = cross_search<false>(s, r, kept, e_w, (double)p.top_p, 0, true);
    if (c.found) {
      kept.lo = c.key;
      S = c.before + (double)e_w(key_val(c.key));
      n1 = c.rank + 1;
      if (n1 <= (unsigned)kCollect) {
        const unsigned m = collect_sorted(s, r, kept, 0ull, 0ull);
        finish(s, r, (int)m, false, n_probs, o);
        return;
      }
    }
  }
  {  // sum of e over the kept set (deterministic block reduction)
    double loc = 0.0;
    for_each_elem(r, [&](float v, int id, bool ok) {
      if (ok && kept(v, make_key(v, id))) loc += (double)e_w(v);
    });
    S = block_sum_d(s, loc);
  }
  const double inv = 1.0 / S;
  auto p_w = [&](float v) { return (float)((double)e_w(v) * inv); };
  const double u = philox_uniform(p.seed, p.position, DrawStream::token);
  Cross c = cross_search<false>(s, r, kept, p_w, u, 0, false);
  u64 pick;
  if (c.found) {
    pick = c.key;
  } else {  // rounding: the last kept candidate with p > 0, i.e. the smallest such key
    u64 mn = ~0ull;
    for_each_elem(r, [&](float v, int id, bool ok) {
      const u64 key = make_key(v, id);
      if (ok && kept(v, key) && p_w(v) > 0.0f && key < mn) mn = key;
    });
    // block min via the candidate buffer's first slot
    if (threadIdx.x == 0) s.buf[0] = ~0ull;
    __syncthreads();
    atomicMin(&s.buf[0], mn);
    __syncthreads();
    pick = s.buf[0] == ~0ull ? s.top[0] : s.buf[0];
  }
  const double log_sum = log(S);
  auto lp_key = [&](u64 key) {
    const float l = key_val(key);
    const double d = l == l0 ? 0.0 : ((double)l - (double)l0) / (double)T;
    return (float)(d - log_sum);
  };
  if (threadIdx.x == 0) {
    *o.token = key_id(pick);
    *o.logprob = lp_key(pick);
    *o.error = 0;
  }
  const int n_top = n_top0 < (int)n1 ? n_top0 : (int)n1;
  write_top(
      o, n_top, [&](int j) { return s.top[j]; }, [&](int j) { return lp_key(s.top[j]); });
}

__global__ void __launch_bounds__(kThreads, 1) sampler_kernel(SampArgs a) {
  extern __shared__ u64 smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>(smem_raw);
  uint32_t* bitmap = reinterpret_cast<uint32_t*>(smem_raw + (sizeof(Smem) + 7) / 8);
  pdl_trigger();
  pdl_wait();
  sample_row(a, blockIdx.x, s, bitmap);
}

size_t smem_bytes_for(int vocab) {
  return (sizeof(Smem) + 7) / 8 * 8 + ((size_t)vocab + 31) / 32 * 4;
}

size_t round256(size_t v) {
  return (v + 255) / 256 * 256;
}

// Workspace: [rows][vocab + 2 max_hist] u32 (counters, override list), then the segments' candidate keys
// [rows][part_cap] u64 and their PartMeta [rows][part_blocks].
struct WsLayout {
  int part_blocks, part_cap;
  size_t keys_off, meta_off, total;
  WsLayout(int max_rows, int vocab, int max_hist) {
    const int lo = (vocab + kSegCap - 1) / kSegCap;
    part_blocks = lo > kPartBlocksMin ? lo : kPartBlocksMin;
    // segments x K <= max(kCandCap, lo x kMaxK) for every K (see part_segments)
    const size_t cap = (size_t)lo * kMaxK > kCandCap ? (size_t)lo * kMaxK : kCandCap;
    part_cap = (int)cap;
    keys_off = round256((size_t)max_rows * ((size_t)vocab + 2 * (size_t)max_hist) * 4);
    meta_off = round256(keys_off + (size_t)max_rows * cap * sizeof(u64));
    total = round256(meta_off + (size_t)max_rows * part_blocks * sizeof(PartMeta));
  }
};

}  // namespace

namespace tuning {
int g_sampler_stage = 0;
void set_sampler_stage(int stage) {
  g_sampler_stage = stage;
}
}  // namespace tuning

cudaError_t plan_sampler(const DeviceInfo& dev, int max_rows, int vocab, int max_hist, SamplerPlan* plan) {
  if (max_rows < 1 || vocab < 1 || max_hist < 0 || max_hist > kSamplerMaxHistory)
    return cudaErrorInvalidValue;
  const size_t smem = smem_bytes_for(vocab);
  if (dev.smem_optin_bytes && smem > dev.smem_optin_bytes) return cudaErrorInvalidValue;
  // The limit is per kernel, not per plan: raise it to the device's opt-in maximum (never lower it below
  // what another plan needs); each launch still asks for its plan's bytes only.
  const size_t limit = dev.smem_optin_bytes > smem ? dev.smem_optin_bytes : smem;
  if (cudaError_t e =
          cudaFuncSetAttribute(sampler_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)limit);
      e != cudaSuccess)
    return e;
  plan->max_rows = max_rows;
  plan->vocab = vocab;
  plan->max_hist = max_hist;
  if (cudaError_t e = cudaFuncSetAttribute(sampler_part_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)sizeof(PSmem));
      e != cudaSuccess)
    return e;
  const WsLayout ws(max_rows, vocab, max_hist);
  if (ws.part_blocks > kMaxPartBlocks) return cudaErrorInvalidValue;
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, sampler_part_kernel, kPThreads, sizeof(PSmem)) !=
          cudaSuccess ||
      per_sm < 1) {
    cudaGetLastError();
    per_sm = 1;
  }
  plan->part_slots = per_sm * (dev.n_sms > 0 ? dev.n_sms : 132);
  plan->smem_bytes = smem;
  plan->workspace_bytes = ws.total;
  return cudaSuccess;
}

cudaError_t sampler_workspace_init(const SamplerPlan& plan, void* workspace, cudaStream_t stream) {
  if (!workspace) return cudaErrorInvalidValue;
  return cudaMemsetAsync(workspace, 0, plan.workspace_bytes, stream);
}

cudaError_t sample(const SamplerPlan& plan, const float* logits, int64_t ld, int n_sample,
                   const SamplerRow* rows, int n_rows, const SamplerOutputs& out, void* workspace,
                   cudaStream_t stream) {
  if (n_rows < 0 || n_rows > plan.max_rows || n_sample < 1 || n_sample > plan.vocab || ld < n_sample ||
      !logits || !rows || !workspace || !out.token || !out.logprob || !out.error ||
      (!out.top_token != !out.top_logprob))
    return cudaErrorInvalidValue;
  if (n_rows == 0) return cudaSuccess;
  const WsLayout ws(plan.max_rows, plan.vocab, plan.max_hist);
  uint8_t* w = static_cast<uint8_t*>(workspace);
  SampArgs a{logits, ld, n_sample, rows, out, w, plan.vocab, plan.max_hist};
  a.part_blocks = ws.part_blocks;
  a.part_cap = ws.part_cap;
  {  // one wave of segment blocks over the rows, within [segments of kSegCap tokens, part_blocks]
    const int lo = (n_sample + kSegCap - 1) / kSegCap;
    const int wave = (plan.part_slots > 0 ? plan.part_slots : 396) / n_rows;
    int sm = wave < kPartBlocksMin ? wave : kPartBlocksMin;
    if (sm < lo) sm = lo;
    a.seg_max = sm < ws.part_blocks ? sm : ws.part_blocks;
  }
  a.part_keys = reinterpret_cast<u64*>(w + ws.keys_off);
  a.part_meta = reinterpret_cast<PartMeta*>(w + ws.meta_off);
  if (tuning::g_sampler_stage != 2)
    if (cudaError_t e = launch_ex(sampler_part_kernel, dim3(a.seg_max, n_rows), dim3(kPThreads),
                                  sizeof(PSmem), stream, 1, true, a);
        e != cudaSuccess)
      return e;
  if (tuning::g_sampler_stage != 1)
    if (cudaError_t e =
            launch_ex(sampler_kernel, dim3(n_rows), dim3(kThreads), plan.smem_bytes, stream, 1, true, a);
        e != cudaSuccess)
      return e;
  return cudaGetLastError();
}

}  // namespace ultra::cuda
