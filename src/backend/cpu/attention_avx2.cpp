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

template <class L>
void attend_one(const KvLayerView& kv, const float* q, int first, int n_pos, int slot, int kvh, float scale,
                float softcap, float* out, float* sc) {
  using E = typename L::E;
  const int hd = kv.head_dim;
  const E* K = (const E*)kv.k + cache_index(kv, slot, kvh, first);
  const E* V = (const E*)kv.v + cache_index(kv, slot, kvh, first);
  for (int p = 0; p < n_pos; ++p) sc[p] = dot_row<L>(q, K + (size_t)p * hd, hd) * scale;
  if (softcap > 0)
    for (int p = 0; p < n_pos; ++p) sc[p] = __builtin_tanhf(sc[p] / softcap) * softcap;
  // max
  int p = 0;
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
  // weighted sum of v
  std::memset(out, 0, sizeof(float) * hd);
  for (p = 0; p < n_pos; ++p) {
    const E* v = V + (size_t)p * hd;
    const __m256 w = _mm256_set1_ps(sc[p]);
    int i = 0;
    for (; i + 8 <= hd; i += 8)
      _mm256_storeu_ps(out + i, _mm256_fmadd_ps(w, L::load8(v + i), _mm256_loadu_ps(out + i)));
    for (; i < hd; ++i) out[i] += sc[p] * L::scalar(v[i]);
  }
  const float inv = 1.0f / sum;
  for (int i = 0; i < hd; ++i) out[i] *= inv;
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
