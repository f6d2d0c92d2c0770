// The per-thread attention loop of attention() for one SIMD level, shared by attention_avx2.cpp (8-float
// vectors) and attention_avx512.cpp (16-float vectors), each of which instantiates it with its vector traits
// V of simd_traits.h (internal linkage: this header opens an anonymous namespace), using: F, W, zero(),
// set1(float), load(const float*), load(const uint16_t*) (F16 -> f32), fmadd(a, b, c), add(a, b),
// mul(a, b), store(float*, F), hsum(F) and sum4(F, F, F, F) (the four vectors' sums, an __m128).
// Prefill: query tiles of up to kAttentionTile consecutive tokens of one sequence and one head (attend_tile),
// so that each k and v row is read once per tile (per query, attention is load-bound: ~1 load per FMA from
// L2; the tiles cut pp512 attention from 21% to 11% of an F32 110M prefill on a Skylake-class Xeon).
// A lone token (decode): one (token, head) pair (attend_one): scores four positions per pass, the
// max-subtracted exp (exp256, ~2 ulp), the weighted sum of v accumulated in up to 8 vectors over all
// positions.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/simd_math.h"

namespace ultra::cpu::detail {
namespace {

inline float to_f32(float v) {
  return v;
}
inline float to_f32(uint16_t v) {
  return _cvtsh_ss(v);
}

template <class V, class E>
inline float dot_row(const float* q, const E* k, int n) {
  typename V::F a0 = V::zero(), a1 = V::zero();
  int i = 0;
  for (; i + 2 * V::W <= n; i += 2 * V::W) {
    a0 = V::fmadd(V::load(q + i), V::load(k + i), a0);
    a1 = V::fmadd(V::load(q + i + V::W), V::load(k + i + V::W), a1);
  }
  for (; i + V::W <= n; i += V::W) a0 = V::fmadd(V::load(q + i), V::load(k + i), a0);
  float s = V::hsum(V::add(a0, a1));
  for (; i < n; ++i) s += q[i] * to_f32(k[i]);
  return s;
}

// q . k_j for the 4 consecutive rows k_j = k + j * n (j < 4): one q load per vector for the four, and one
// horizontal reduction (V::sum4) for the four sums instead of four.
template <class V, class E>
inline __m128 dot_rows4(const float* q, const E* k, int n) {
  typename V::F a0 = V::zero(), a1 = a0, a2 = a0, a3 = a0;
  int i = 0;
  for (; i + V::W <= n; i += V::W) {
    const typename V::F qv = V::load(q + i);
    a0 = V::fmadd(qv, V::load(k + i), a0);
    a1 = V::fmadd(qv, V::load(k + n + i), a1);
    a2 = V::fmadd(qv, V::load(k + 2 * n + i), a2);
    a3 = V::fmadd(qv, V::load(k + 3 * n + i), a3);
  }
  __m128 s = V::sum4(a0, a1, a2, a3);
  if (i < n) {
    alignas(16) float tail[4] = {0, 0, 0, 0};
    for (int j = 0; j < 4; ++j)
      for (int e = i; e < n; ++e) tail[j] += q[e] * to_f32(k[(size_t)j * n + e]);
    s = _mm_add_ps(s, _mm_load_ps(tail));
  }
  return s;
}

// outs[i][d0 .. d0 + C W) = inv[i] * sum_p w[i * ld + p] v_p[d0 ..] for queries i < nq (v rows of hd elements
// at vrows): the Q x C accumulators stay in registers over all positions, and each v vector is loaded once
// for the Q queries. Rows nq .. Q-1 are computed (their weights must be finite) but not stored.
template <class V, int Q, int C, class E>
inline void wsum_chunk(const E* vrows, int hd, int n, const float* w, size_t ld, const float* inv, int nq,
                       int d0, float* const* outs) {
  typename V::F acc[Q][C];
  for (int i = 0; i < Q; ++i)
    for (int c = 0; c < C; ++c) acc[i][c] = V::zero();
  for (int p = 0; p < n; ++p) {
    typename V::F v[C];
    const E* vr = vrows + (size_t)p * hd + d0;
    for (int c = 0; c < C; ++c) v[c] = V::load(vr + V::W * c);
    for (int i = 0; i < Q; ++i) {
      const typename V::F wp = V::set1(w[i * ld + p]);
      for (int c = 0; c < C; ++c) acc[i][c] = V::fmadd(wp, v[c], acc[i][c]);
    }
  }
  for (int i = 0; i < nq; ++i) {
    const typename V::F vi = V::set1(inv[i]);
    for (int c = 0; c < C; ++c) V::store(outs[i] + d0 + V::W * c, V::mul(acc[i][c], vi));
  }
}

// wsum_chunk<V, Q, nc> for a run-time nc in [1, C] (nothing for nc = 0).
template <class V, int Q, int C, class E>
inline void wsum_last(int nc, const E* vrows, int hd, int n, const float* w, size_t ld, const float* inv,
                      int nq, int d0, float* const* outs) {
  if constexpr (C > 0) {
    if (nc == C) return wsum_chunk<V, Q, C>(vrows, hd, n, w, ld, inv, nq, d0, outs);
    wsum_last<V, Q, C - 1>(nc, vrows, hd, n, w, ld, inv, nq, d0, outs);
  }
}

// All hd elements of the nq outputs: chunks of C vectors, one shorter chunk, then the last hd % W elements.
template <class V, int Q, int C, class E>
void wsum(const E* vrows, int hd, int n, const float* w, size_t ld, const float* inv, int nq,
          float* const* outs) {
  int d0 = 0;
  for (; d0 + C * V::W <= hd; d0 += C * V::W) wsum_chunk<V, Q, C>(vrows, hd, n, w, ld, inv, nq, d0, outs);
  wsum_last<V, Q, C - 1>((hd - d0) / V::W, vrows, hd, n, w, ld, inv, nq, d0, outs);
  d0 += (hd - d0) / V::W * V::W;
  for (int i = 0; i < nq; ++i)
    for (int e = d0; e < hd; ++e) {
      float o = 0;
      for (int p = 0; p < n; ++p) o += w[i * ld + p] * to_f32(vrows[(size_t)p * hd + e]);
      outs[i][e] = o * inv[i];
    }
}

// Scores s[0, n) -> exp(s - m) in place (soft-capped first when softcap > 0), m the max of the scores and the
// sink logit; returns their sum plus exp(sink - m) (sink -infinity: none, nothing added).
inline float softmax_weights(float* s, int n, float softcap, float sink) {
  if (softcap > 0)
    for (int p = 0; p < n; ++p) s[p] = __builtin_tanhf(s[p] / softcap) * softcap;
  int p = 0;
  __m256 vm = _mm256_set1_ps(-INFINITY);
  for (; p + 8 <= n; p += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + p));
  float m = hmax256(vm);
  for (; p < n; ++p) m = s[p] > m ? s[p] : m;
  m = sink > m ? sink : m;
  const __m256 vmax = _mm256_set1_ps(m);
  __m256 vs = _mm256_setzero_ps();
  for (p = 0; p + 8 <= n; p += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + p), vmax));
    _mm256_storeu_ps(s + p, e);
    vs = _mm256_add_ps(vs, e);
  }
  float sum = hsum256(vs);
  for (; p < n; ++p) {
    s[p] = __builtin_expf(s[p] - m);  // (not std::exp: no inline function shared across ISA flags)
    sum += s[p];
  }
  if (sink != -INFINITY) sum += __builtin_expf(sink - m);
  return sum;
}

template <class V, class E>
void attend_one(const KvLayerView& kv, const float* q, int first, int n_pos, int slot, int kvh, float scale,
                float softcap, float sink, float* out, float* sc) {
  const int hd = kv.head_dim;
  const E* K = (const E*)kv.k + cache_index(kv, slot, kvh, first);
  const E* Vr = (const E*)kv.v + cache_index(kv, slot, kvh, first);
  int p = 0;
  const __m128 vscale = _mm_set1_ps(scale);
  for (; p + 4 <= n_pos; p += 4)
    _mm_storeu_ps(sc + p, _mm_mul_ps(dot_rows4<V>(q, K + (size_t)p * hd, hd), vscale));
  for (; p < n_pos; ++p) sc[p] = dot_row<V>(q, K + (size_t)p * hd, hd) * scale;
  const float sum = softmax_weights(sc, n_pos, softcap, sink);
  // weighted sum of v, accumulated in registers
  const float inv = 1.0f / sum;
  wsum<V, 1, 8>(Vr, hd, n_pos, sc, 0, &inv, 1, &out);
}

// ---- Query tiles: up to kAttentionTile consecutive tokens of one sequence, one head, in one pass over the
// positions, so that each k and v row is read once per tile instead of once per token (prefill).

// sc[i * ld + p] = (q_i . k_p) * scale for the 4 queries qs[i] and positions p < n (rows of hd at K): each
// k vector loaded once for the 4 queries, P positions per pass (16 or 8 accumulators), one V::sum4 per
// position (lanes = the 4 queries, the same reduction as dot_rows4's).
template <class V, class E>
inline void scores_tile(const float* const* qs, const E* K, int hd, int n, float scale, float* sc,
                        size_t ld) {
  constexpr int P = V::W == 16 ? 4 : 2;
  const __m128 vscale = _mm_set1_ps(scale);
  const int dv = hd / V::W * V::W;
  auto tail = [&](const E* k, __m128 s) {  // the last hd % W elements of the 4 dot products
    if (dv == hd) return s;
    alignas(16) float t[4] = {0, 0, 0, 0};
    for (int i = 0; i < 4; ++i)
      for (int e = dv; e < hd; ++e) t[i] += qs[i][e] * to_f32(k[e]);
    return _mm_add_ps(s, _mm_load_ps(t));
  };
  auto put = [&](int p, __m128 s) {
    alignas(16) float t[4];
    _mm_store_ps(t, _mm_mul_ps(s, vscale));
    for (int i = 0; i < 4; ++i) sc[i * ld + p] = t[i];
  };
  int p = 0;
  for (; p + P <= n; p += P) {
    typename V::F acc[P][4];
    for (int j = 0; j < P; ++j)
      for (int i = 0; i < 4; ++i) acc[j][i] = V::zero();
    const E* k = K + (size_t)p * hd;
    for (int d = 0; d < dv; d += V::W) {
      typename V::F q[4];
      for (int i = 0; i < 4; ++i) q[i] = V::load(qs[i] + d);
      for (int j = 0; j < P; ++j) {
        const typename V::F kv = V::load(k + (size_t)j * hd + d);
        for (int i = 0; i < 4; ++i) acc[j][i] = V::fmadd(q[i], kv, acc[j][i]);
      }
    }
    if constexpr (P == 4) {
      __m128 s0 = tail(k, V::sum4(acc[0][0], acc[0][1], acc[0][2], acc[0][3]));
      __m128 s1 = tail(k + hd, V::sum4(acc[1][0], acc[1][1], acc[1][2], acc[1][3]));
      __m128 s2 = tail(k + 2 * hd, V::sum4(acc[2][0], acc[2][1], acc[2][2], acc[2][3]));
      __m128 s3 = tail(k + 3 * hd, V::sum4(acc[3][0], acc[3][1], acc[3][2], acc[3][3]));
      _MM_TRANSPOSE4_PS(s0, s1, s2, s3);  // now lanes = positions, one vector per query
      _mm_storeu_ps(sc + p, _mm_mul_ps(s0, vscale));
      _mm_storeu_ps(sc + ld + p, _mm_mul_ps(s1, vscale));
      _mm_storeu_ps(sc + 2 * ld + p, _mm_mul_ps(s2, vscale));
      _mm_storeu_ps(sc + 3 * ld + p, _mm_mul_ps(s3, vscale));
    } else {
      for (int j = 0; j < P; ++j)
        put(p + j, tail(k + (size_t)j * hd, V::sum4(acc[j][0], acc[j][1], acc[j][2], acc[j][3])));
    }
  }
  for (; p < n; ++p) {
    typename V::F acc[4];
    for (int i = 0; i < 4; ++i) acc[i] = V::zero();
    const E* k = K + (size_t)p * hd;
    for (int d = 0; d < dv; d += V::W) {
      const typename V::F kv = V::load(k + d);
      for (int i = 0; i < 4; ++i) acc[i] = V::fmadd(V::load(qs[i] + d), kv, acc[i]);
    }
    put(p, tail(k, V::sum4(acc[0], acc[1], acc[2], acc[3])));
  }
}

// Queries i < nq (nq in [2, 4]) of kv head kvh in one slot at consecutive positions pos0 + i: query i attends
// [first_i, pos0 + i]. The 4 score rows cover the union [first_0, pos0 + nq - 1] (all written: the tile's
// last position is the highest); each row's positions outside its own range get weight 0 (exactly nothing
// added: those v rows are finite). Rows i >= nq repeat query 0 and are not stored.
template <class V, class E>
void attend_tile(const AttentionArgs& a, const float* const* qs, float* const* outs, int nq, int pos0,
                 int slot, int kvh, float sink, float* sc, size_t ld) {
  const KvLayerView& kv = *a.kv;
  const int hd = kv.head_dim;
  const int F = attention_first(pos0, a.window), n = pos0 + nq - F;
  const E* K = (const E*)kv.k + cache_index(kv, slot, kvh, F);
  const E* Vr = (const E*)kv.v + cache_index(kv, slot, kvh, F);
  scores_tile<V>(qs, K, hd, n, a.scale, sc, ld);
  float inv[4] = {1, 1, 1, 1};
  for (int i = 0; i < nq; ++i) {
    float* s = sc + i * ld;
    const int lo = attention_first(pos0 + i, a.window) - F, hi = pos0 + i + 1 - F;  // [lo, hi) of [0, n)
    for (int p = 0; p < lo; ++p) s[p] = 0.0f;
    for (int p = hi; p < n; ++p) s[p] = 0.0f;
    const float sum = softmax_weights(s + lo, hi - lo, a.softcap, sink);
    inv[i] = 1.0f / sum;
  }
  for (int i = nq; i < 4; ++i)  // the repeated rows: any finite weights (not stored)
    for (int p = 0; p < n; ++p) sc[i * ld + p] = 0.0f;
  wsum<V, 4, V::W == 16 ? 4 : 2>(Vr, hd, n, sc, ld, inv, nq, outs);
}

// A thread's share: the tokens are cut into tiles of up to kAttentionTile consecutive tokens of one slot at
// consecutive positions (every thread cuts them the same way), and (tile, head) units ith, ith + nth, ... are
// this thread's. A tile of one token (decode, or a lone token) takes attend_one.
template <class V>
void attention_thread(const AttentionArgs& a, int ith, int nth) {
  const KvLayerView& kv = *a.kv;
  const int hd = kv.head_dim, group = a.n_heads / kv.n_kv_heads;
  const size_t ld = attention_score_row(kv.max_ctx);
  float* sc = a.scratch + attention_scratch_stride(kv.max_ctx) * ith;
  int64_t unit = 0;
  for (int t0 = 0; t0 < a.n_tokens;) {
    int nq = 1;
    while (nq < kAttentionTile && t0 + nq < a.n_tokens && a.slot[t0 + nq] == a.slot[t0] &&
           a.pos[t0 + nq] == a.pos[t0] + nq)
      ++nq;
    for (int h = 0; h < a.n_heads; ++h, ++unit) {
      if (unit % nth != ith) continue;
      const size_t r0 = (size_t)t0 * a.n_heads + h;  // (token t0, head h)'s row of q and out
      if (nq == 1) {
        const int first = attention_first(a.pos[t0], a.window);
        const int n_pos = a.pos[t0] + 1 - first;
        if (kv.type == GgmlType::F32)
          attend_one<V, float>(kv, a.q + r0 * hd, first, n_pos, a.slot[t0], h / group, a.scale, a.softcap,
                               attention_sink(a, h), a.out + r0 * hd, sc);
        else
          attend_one<V, uint16_t>(kv, a.q + r0 * hd, first, n_pos, a.slot[t0], h / group, a.scale, a.softcap,
                                  attention_sink(a, h), a.out + r0 * hd, sc);
        continue;
      }
      const float* qs[4];
      float* outs[4];
      for (int i = 0; i < 4; ++i) {
        const size_t r = r0 + (size_t)(i < nq ? i : 0) * a.n_heads;
        qs[i] = a.q + r * hd;
        outs[i] = a.out + r * hd;
      }
      if (kv.type == GgmlType::F32)
        attend_tile<V, float>(a, qs, outs, nq, a.pos[t0], a.slot[t0], h / group, attention_sink(a, h), sc,
                              ld);
      else
        attend_tile<V, uint16_t>(a, qs, outs, nq, a.pos[t0], a.slot[t0], h / group, attention_sink(a, h), sc,
                                 ld);
    }
    t0 += nq;
  }
}

}  // namespace
}  // namespace ultra::cpu::detail
