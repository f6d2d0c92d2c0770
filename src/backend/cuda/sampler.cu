// Fused token sampler: one block of 1024 threads per output row (the function is specified in kernels.h).
//
// Candidates are 64-bit keys (order-preserving bits of the penalised logit << 32 | ~id): one unsigned
// compare orders them by (logit desc, id asc), and the id comes back from the key.
//
// Pass 1 (every path) streams the row once: NaN / Inf check, penalties (tokens of the window are marked in
// a shared-memory bitmap and stand in the stream through their precomputed override values), and a
// threshold filter that keeps the K best keys in a shared buffer: a key enters when it is >= the current
// threshold; whenever the buffer may overflow, a block-wide radix select finds the K-th key, the buffer is
// compacted to the K best and the threshold raised to it. Greedy also accumulates an online log-sum-exp.
// The sorted (bitonic) K best then either finish the row in shared memory (greedy, top_k <= 1024) or seed
// the all-tokens path (see kernels.h and docs/CUDA.md for its passes).
//
// Penalty counts use a per-row u32 array over the vocabulary in the workspace: atomicAdd per window token,
// then atomicExch(0) hands each distinct token's count to exactly one thread, which leaves the array zero
// for the next launch.
#include <cfloat>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
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

struct Smem {
  u64 buf[kBuf];    // candidates
  u64 keep[kMaxK];  // compaction output
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
__device__ __forceinline__ void hist_add(Smem& s, int d, bool ok, u64 w, bool with_mass) {
  unsigned todo = __ballot_sync(kFullMask, ok);
  const int lane = threadIdx.x & 31;
  while (todo) {
    const int leader = __ffs(todo) - 1;
    const int dl = __shfl_sync(kFullMask, d, leader);
    const bool mine = ok && d == dl;
    const unsigned mm = __ballot_sync(kFullMask, mine);
    if (with_mass) {
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
      v[e] = ok[e] ? __ldg(r.logits + id) : 0.0f;
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

// ---- radix select over s.buf[0, cnt): a key L such that exactly k entries are >= L (1 <= k <= cnt; keys
// distinct). Early exit when the bucket holding the k-th key is kept whole.
__device__ u64 radix_kth(Smem& s, unsigned cnt, unsigned k) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  u64 prefix = 0;
  unsigned need = k;
  for (int shift = 56; shift >= 0; shift -= 8) {
    hist_clear(s);
    __syncthreads();
    const u64 hm = hi_mask(shift);
    for (unsigned base = 0; base < cnt; base += kThreads) {
      const unsigned i = base + threadIdx.x;
      const u64 key = i < cnt ? s.buf[i] : 0ull;
      const bool ok = i < cnt && (key & hm) == prefix;
      hist_add(s, (int)((key >> shift) & 255), ok, 0, false);
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
  const u64 lo = radix_kth(s, cnt, k);
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
  double lp = 0.0;
  for (int j = j0; j < j0 + ch && j < m2; ++j)
    lp += (double)(float)((double)e_of(key_val(s.buf[j]), l0, T) * inv);
  double total;
  const double exp_ = block_excl_scan(s, lp, &total);
  const double target = philox_uniform(p.seed, p.position, DrawStream::token) * total;
  if (threadIdx.x == 0) s.i0 = m2, s.i1 = -1;
  __syncthreads();
  double run = exp_;
  bool found = false;
  for (int j = j0; j < j0 + ch && j < m2; ++j) {
    const float pj = (float)((double)e_of(key_val(s.buf[j]), l0, T) * inv);
    run += (double)pj;
    if (!found && target < run) {
      atomicMin(&s.i0, j);
      found = true;
    }
    if (pj > 0.0f) atomicMax(&s.i1, j);
  }
  __syncthreads();
  const int pick = s.i0 < m2 ? s.i0 : (s.i1 >= 0 ? s.i1 : 0);
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
      hist_add(s, (int)((key >> shift) & 255), in, w, !kCount);
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

struct SampArgs {
  const float* logits;
  int64_t ld;
  int n_sample;
  const SamplerRow* rows;
  SamplerOutputs out;
  uint8_t* ws;
  int vocab, max_hist;
};

__device__ void sample_row(const SampArgs& a, int row, Smem& s, uint32_t* bitmap) {
  const SamplerRow p = a.rows[row];
  OutPtrs o{a.out.token + row, a.out.logprob + row,
            a.out.top_token ? a.out.top_token + (int64_t)row * kSamplerMaxProbs : nullptr,
            a.out.top_logprob ? a.out.top_logprob + (int64_t)row * kSamplerMaxProbs : nullptr,
            a.out.error + row};
  if (p.logits_row < 0) {
    write_simple(o, -1, __int_as_float(0x7fc00000), 0);
    return;
  }
  const int n = a.n_sample;
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
      const int t = p.hist[i];
      if (t >= 0 && t < n) atomicAdd(&counts[t], 1u);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nh; i += kThreads) {
      const int t = p.hist[i];
      if (t < 0 || t >= n) continue;
      const unsigned c = atomicExch(&counts[t], 0u);
      if (c == 0) continue;  // another thread owns this token
      const int k = atomicAdd(&s.n_ovr, 1);
      ovr_tok[k] = t;
      ovr_val[k] = penalise(r.logits[t], c, p);
      atomicOr(&bitmap[t >> 5], 1u << (t & 31));
    }
    __syncthreads();
    r.n_ovr = s.n_ovr;
  }

  // ---- pass 1
  const bool greedy = !(p.temperature > 0.0f);
  const bool fast = !greedy && p.top_k >= 1 && p.top_k <= kMaxK && p.top_k < n;
  const int n_probs = p.n_probs < 0 ? 0 : (p.n_probs > kSamplerMaxProbs ? kSamplerMaxProbs : p.n_probs);
  const unsigned K = fast ? (unsigned)p.top_k : (unsigned)(n_probs > 1 ? n_probs : 1);
  bool bad = false;
  float m_t = -INFINITY;  // greedy: online log-sum-exp of this thread's candidates
  double s_t = 0.0;
  {
    auto consider = [&](float v, int id, bool ok, int& my_max) {
      const u64 key = make_key(v, id);
      const int slot = append(s, key, ok && key >= s.thr);
      if (slot > my_max) my_max = slot;
      if (greedy && ok) {
        if (v > m_t) {
          s_t = s_t * (double)expf(m_t - v) + 1.0;
          m_t = v;
        } else {
          s_t += (double)expf(v - m_t);
        }
      }
    };
    constexpr int E = 2 * kSub;
    for (int base = 0; base < n; base += kThreads * E) {
      float v[E];
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int id = base + e * kThreads + (int)threadIdx.x;
        v[e] = id < n ? __ldg(r.logits + id) : 0.0f;
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        int my_max = -1;
#pragma unroll
        for (int e = half * kSub; e < half * kSub + kSub; ++e) {
          const int id = base + e * kThreads + (int)threadIdx.x;
          bool ok = id < n;
          if (ok && !isfinite(v[e])) bad = true;
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

  if (greedy) {
    const float M = key_val(s.buf[0]);
    const double part = m_t == -INFINITY ? 0.0 : s_t * exp((double)m_t - (double)M);
    const double log_sum = log(block_sum_d(s, part));
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
        o, n_probs < (int)m0 ? n_probs : (int)m0, [&](int j) { return s.buf[j]; }, lp_of);
    return;
  }
  if (fast) {
    finish(s, r, (int)m0, true, n_probs, o);
    return;
  }

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
  sample_row(a, blockIdx.x, s, bitmap);
}

size_t smem_bytes_for(int vocab) {
  return (sizeof(Smem) + 7) / 8 * 8 + ((size_t)vocab + 31) / 32 * 4;
}

}  // namespace

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
  plan->smem_bytes = smem;
  plan->workspace_bytes = (size_t)max_rows * ((size_t)vocab + 2 * (size_t)max_hist) * 4;
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
  const SampArgs a{logits,     ld,           n_sample, rows, out, static_cast<uint8_t*>(workspace),
                   plan.vocab, plan.max_hist};
  sampler_kernel<<<n_rows, kThreads, plan.smem_bytes, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace ultra::cuda
