// AVX2+FMA+F16C body of attention() (compiled with ULTRA_AVX2_ISA; called by attention.cpp after the
// run-time check): one (token, head) pair at a time, see attention.cpp.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/simd_math.h"

namespace ultra::cpu::detail {

namespace {

inline size_t cache_index(const KvLayerView& kv, int slot, int head, int pos) {
  return (((size_t)slot * kv.n_kv_heads + head) * kv.max_ctx + pos) * kv.head_dim;
}

// Row loaders for the two cache element types.
struct RowF32 {
  using E = float;
  static __m256 load8(const E* p) { return _mm256_loadu_ps(p); }
  static float scalar(E v) { return v; }
};
struct RowF16 {
  using E = uint16_t;
  static __m256 load8(const E* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
  static float scalar(E v) { return _cvtsh_ss(v); }
};

template <class L>
inline float dot_row(const float* q, const typename L::E* k, int n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), L::load8(k + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), L::load8(k + i + 8), a1);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), L::load8(k + i), a0);
  float s = hsum256(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) s += q[i] * L::scalar(k[i]);
  return s;
}

// q . k_j for the 4 consecutive rows k_j = k + j * n (j < 4): one q load per 8 elements for the four, and
// one horizontal reduction (three hadd and an add) for the four sums instead of four.
template <class L>
inline __m128 dot_rows4(const float* q, const typename L::E* k, int n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    a0 = _mm256_fmadd_ps(qv, L::load8(k + i), a0);
    a1 = _mm256_fmadd_ps(qv, L::load8(k + n + i), a1);
    a2 = _mm256_fmadd_ps(qv, L::load8(k + 2 * n + i), a2);
    a3 = _mm256_fmadd_ps(qv, L::load8(k + 3 * n + i), a3);
  }
  // [a0 a1 a2 a3] lane sums: hadd pairs within 128-bit halves, then the halves added
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  if (i < n) {
    alignas(16) float tail[4] = {0, 0, 0, 0};
    for (int j = 0; j < 4; ++j)
      for (int e = i; e < n; ++e) tail[j] += q[e] * L::scalar(k[(size_t)j * n + e]);
    s = _mm_add_ps(s, _mm_load_ps(tail));
  }
  return s;
}

// out[d0 .. d0 + 8C) = inv * sum_p w[p] v_p[d0 ..]: the C accumulators stay in registers for all positions
// (v rows of hd elements at V).
template <class L, int C>
inline void weighted_sum_chunk(const typename L::E* V, int hd, int n_pos, const float* w, float inv, int d0,
                               float* out) {
  __m256 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
  for (int p = 0; p < n_pos; ++p) {
    const __m256 wp = _mm256_set1_ps(w[p]);
    const typename L::E* v = V + (size_t)p * hd + d0;
    for (int c = 0; c < C; ++c) acc[c] = _mm256_fmadd_ps(wp, L::load8(v + 8 * c), acc[c]);
  }
  const __m256 vi = _mm256_set1_ps(inv);
  for (int c = 0; c < C; ++c) _mm256_storeu_ps(out + d0 + 8 * c, _mm256_mul_ps(acc[c], vi));
}

// weighted_sum_chunk<L, nc> for a run-time nc in [1, C] (nothing for nc = 0).
template <class L, int C>
inline void weighted_sum_last(int nc, const typename L::E* V, int hd, int n_pos, const float* w, float inv,
                              int d0, float* out) {
  if constexpr (C > 0) {
    if (nc == C) return weighted_sum_chunk<L, C>(V, hd, n_pos, w, inv, d0, out);
    weighted_sum_last<L, C - 1>(nc, V, hd, n_pos, w, inv, d0, out);
  }
}

template <class L>
void weighted_sum(const typename L::E* V, int hd, int n_pos, const float* w, float inv, float* out) {
  int d0 = 0;
  for (; d0 + 64 <= hd; d0 += 64) weighted_sum_chunk<L, 8>(V, hd, n_pos, w, inv, d0, out);
  weighted_sum_last<L, 7>((hd - d0) / 8, V, hd, n_pos, w, inv, d0, out);
  d0 += (hd - d0) / 8 * 8;
  for (int i = d0; i < hd; ++i) {  // the last hd % 8 elements
    float o = 0;
    for (int p = 0; p < n_pos; ++p) o += w[p] * L::scalar(V[(size_t)p * hd + i]);
    out[i] = o * inv;
  }
}

template <class L>
void attend_one(const KvLayerView& kv, const float* q, int first, int n_pos, int slot, int kvh, float scale,
                float softcap, float* out, float* sc) {
  using E = typename L::E;
  const int hd = kv.head_dim;
  const E* K = (const E*)kv.k + cache_index(kv, slot, kvh, first);
  const E* V = (const E*)kv.v + cache_index(kv, slot, kvh, first);
  int p = 0;
  const __m128 vscale = _mm_set1_ps(scale);
  for (; p + 4 <= n_pos; p += 4)
    _mm_storeu_ps(sc + p, _mm_mul_ps(dot_rows4<L>(q, K + (size_t)p * hd, hd), vscale));
  for (; p < n_pos; ++p) sc[p] = dot_row<L>(q, K + (size_t)p * hd, hd) * scale;
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
  weighted_sum<L>(V, hd, n_pos, sc, 1.0f / sum, out);
}

}  // namespace

void attention_thread_avx2(const AttentionArgs& a, int ith, int nth) {
  const KvLayerView& kv = *a.kv;
  const int hd = kv.head_dim;
  const int group = a.n_heads / kv.n_kv_heads;
  float* sc = a.scratch + attention_scratch_stride(kv.max_ctx) * ith;
  const int n_pairs = a.n_tokens * a.n_heads;
  for (int pr = ith; pr < n_pairs; pr += nth) {
    const int t = pr / a.n_heads, h = pr % a.n_heads;
    const float* qh = a.q + (size_t)pr * hd;
    float* oh = a.out + (size_t)pr * hd;
    const int first = attention_first(a.pos[t], a.window), n_pos = a.pos[t] + 1 - first;
    if (kv.type == GgmlType::F32)
      attend_one<RowF32>(kv, qh, first, n_pos, a.slot[t], h / group, a.scale, a.softcap, oh, sc);
    else
      attend_one<RowF16>(kv, qh, first, n_pos, a.slot[t], h / group, a.scale, a.softcap, oh, sc);
  }
}

}  // namespace ultra::cpu::detail
