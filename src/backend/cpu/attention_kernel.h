// The per-thread attention loop of attention() for one SIMD level, shared by attention_avx2.cpp (8-float
// vectors) and attention_avx512.cpp (16-float vectors), each of which includes it once with its own
// policy V (internal linkage: this header opens an anonymous namespace, as matmul_panel_avx512.h does):
//   using R = the vector type; static constexpr int W = floats per vector;
//   R zero(), set1(float), load(const float*), load(const uint16_t*) (F16 -> f32), fmadd(a, b, c),
//   add(a, b), mul(a, b); void store(float*, R); float hsum(R); __m128 sum4(R, R, R, R) (the four vectors'
//   sums).
// One (token, head) pair at a time (attention.cpp): scores four positions per pass, the max-subtracted exp
// (exp256, ~2 ulp), the weighted sum of v accumulated in up to 8 vectors over all positions.
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
  typename V::R a0 = V::zero(), a1 = V::zero();
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
  typename V::R a0 = V::zero(), a1 = a0, a2 = a0, a3 = a0;
  int i = 0;
  for (; i + V::W <= n; i += V::W) {
    const typename V::R qv = V::load(q + i);
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

// out[d0 .. d0 + C W) = inv * sum_p w[p] v_p[d0 ..]: the C accumulators stay in registers for all positions
// (v rows of hd elements at vrows).
template <class V, int C, class E>
inline void weighted_sum_chunk(const E* vrows, int hd, int n_pos, const float* w, float inv, int d0,
                               float* out) {
  typename V::R acc[C];
  for (int c = 0; c < C; ++c) acc[c] = V::zero();
  for (int p = 0; p < n_pos; ++p) {
    const typename V::R wp = V::set1(w[p]);
    const E* v = vrows + (size_t)p * hd + d0;
    for (int c = 0; c < C; ++c) acc[c] = V::fmadd(wp, V::load(v + V::W * c), acc[c]);
  }
  const typename V::R vi = V::set1(inv);
  for (int c = 0; c < C; ++c) V::store(out + d0 + V::W * c, V::mul(acc[c], vi));
}

// weighted_sum_chunk<V, nc> for a run-time nc in [1, C] (nothing for nc = 0).
template <class V, int C, class E>
inline void weighted_sum_last(int nc, const E* vrows, int hd, int n_pos, const float* w, float inv, int d0,
                              float* out) {
  if constexpr (C > 0) {
    if (nc == C) return weighted_sum_chunk<V, C>(vrows, hd, n_pos, w, inv, d0, out);
    weighted_sum_last<V, C - 1>(nc, vrows, hd, n_pos, w, inv, d0, out);
  }
}

template <class V, class E>
void weighted_sum(const E* vrows, int hd, int n_pos, const float* w, float inv, float* out) {
  int d0 = 0;
  for (; d0 + 8 * V::W <= hd; d0 += 8 * V::W) weighted_sum_chunk<V, 8>(vrows, hd, n_pos, w, inv, d0, out);
  weighted_sum_last<V, 7>((hd - d0) / V::W, vrows, hd, n_pos, w, inv, d0, out);
  d0 += (hd - d0) / V::W * V::W;
  for (int i = d0; i < hd; ++i) {  // the last hd % W elements
    float o = 0;
    for (int p = 0; p < n_pos; ++p) o += w[p] * to_f32(vrows[(size_t)p * hd + i]);
    out[i] = o * inv;
  }
}

template <class V, class E>
void attend_one(const KvLayerView& kv, const float* q, int first, int n_pos, int slot, int kvh, float scale,
                float softcap, float* out, float* sc) {
  const int hd = kv.head_dim;
  const E* K = (const E*)kv.k + cache_index(kv, slot, kvh, first);
  const E* Vr = (const E*)kv.v + cache_index(kv, slot, kvh, first);
  int p = 0;
  const __m128 vscale = _mm_set1_ps(scale);
  for (; p + 4 <= n_pos; p += 4)
    _mm_storeu_ps(sc + p, _mm_mul_ps(dot_rows4<V>(q, K + (size_t)p * hd, hd), vscale));
  for (; p < n_pos; ++p) sc[p] = dot_row<V>(q, K + (size_t)p * hd, hd) * scale;
  if (softcap > 0)
    for (p = 0; p < n_pos; ++p) sc[p] = __builtin_tanhf(sc[p] / softcap) * softcap;
  // max
  p = 0;
  __m256 vm = _mm256_set1_ps(-INFINITY);
  for (; p + 8 <= n_pos; p += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(sc + p));
  float m = hmax256(vm);
  for (; p < n_pos; ++p) m = sc[p] > m ? sc[p] : m;
  // exp and sum
  const __m256 vmax = _mm256_set1_ps(m);
  __m256 vs = _mm256_setzero_ps();
  p = 0;
  for (; p + 8 <= n_pos; p += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sc + p), vmax));
    _mm256_storeu_ps(sc + p, e);
    vs = _mm256_add_ps(vs, e);
  }
  float sum = hsum256(vs);
  for (; p < n_pos; ++p) {
    sc[p] = __builtin_expf(sc[p] - m);  // (not std::exp: no inline function shared across ISA flags)
    sum += sc[p];
  }
  // weighted sum of v, accumulated in registers
  weighted_sum<V>(Vr, hd, n_pos, sc, 1.0f / sum, out);
}

template <class V>
void attention_thread(const AttentionArgs& a, int ith, int nth) {
  const KvLayerView& kv = *a.kv;
  for_each_attention_pair(
      a, ith, nth, [&](const float* q, float* out, int first, int n_pos, int slot, int kvh, float* sc) {
        if (kv.type == GgmlType::F32)
          attend_one<V, float>(kv, q, first, n_pos, slot, kvh, a.scale, a.softcap, out, sc);
        else
          attend_one<V, uint16_t>(kv, q, first, n_pos, slot, kvh, a.scale, a.softcap, out, sc);
      });
}

}  // namespace
}  // namespace ultra::cpu::detail
