// kv_write and causal GQA attention over the slotted KV cache (F32 or F16 elements).
// attention: one (token, head) pair at a time, pairs dealt round-robin to the threads (prefill tokens have
// growing context lengths, so contiguous ranges would be unbalanced). Per pair: scores s[p] = q.k_p * scale
// for p <= pos[t] into the thread's scratch row, max-subtracted exp (vectorised, ~2 ulp), sum, then
// out = sum_p s[p] v_p / sum, accumulated in the output row (in L1).
#include <immintrin.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/simd_math.h"

namespace ultra::cpu {

using detail::exp256;
using detail::hmax256;
using detail::hsum256;

namespace {

[[noreturn]] void bad_cache_type(const char* what, GgmlType t) {
  std::fprintf(stderr, "ultra: %s: unsupported KV cache type %s\n", what, std::string(type_name(t)).c_str());
  std::abort();
}

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
void attend_one(const KvLayerView& kv, const float* q, int n_pos, int slot, int kvh, float scale, float* out,
                float* sc) {
  using E = typename L::E;
  const int hd = kv.head_dim;
  const E* K = (const E*)kv.k + cache_index(kv, slot, kvh, 0);
  const E* V = (const E*)kv.v + cache_index(kv, slot, kvh, 0);
  for (int p = 0; p < n_pos; ++p) sc[p] = dot_row<L>(q, K + (size_t)p * hd, hd) * scale;
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
    sc[p] = std::exp(sc[p] - m);
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

inline size_t scratch_stride(int max_ctx) {
  return ((size_t)max_ctx + 15) / 16 * 16;
}

struct AttnCtx {
  const KvLayerView* kv;
  const float* q;
  int n_tokens, n_heads;
  const int32_t* pos;
  const int32_t* slot;
  float scale;
  float* out;
  float* scratch;
};

}  // namespace

void kv_write(const KvLayerView& kv, const float* k, const float* v, int n_tokens, const int32_t* pos,
              const int32_t* slot) {
  const int hd = kv.head_dim;
  for (int t = 0; t < n_tokens; ++t) {
    for (int h = 0; h < kv.n_kv_heads; ++h) {
      const size_t src = ((size_t)t * kv.n_kv_heads + h) * hd;
      const size_t dst = cache_index(kv, slot[t], h, pos[t]);
      if (kv.type == GgmlType::F32) {
        std::memcpy((float*)kv.k + dst, k + src, sizeof(float) * hd);
        std::memcpy((float*)kv.v + dst, v + src, sizeof(float) * hd);
      } else if (kv.type == GgmlType::F16) {
        uint16_t* kd = (uint16_t*)kv.k + dst;
        uint16_t* vd = (uint16_t*)kv.v + dst;
        int i = 0;
        for (; i + 8 <= hd; i += 8) {
          _mm_storeu_si128((__m128i*)(kd + i),
                           _mm256_cvtps_ph(_mm256_loadu_ps(k + src + i), _MM_FROUND_TO_NEAREST_INT));
          _mm_storeu_si128((__m128i*)(vd + i),
                           _mm256_cvtps_ph(_mm256_loadu_ps(v + src + i), _MM_FROUND_TO_NEAREST_INT));
        }
        for (; i < hd; ++i) {
          kd[i] = fp32_to_fp16(k[src + i]);
          vd[i] = fp32_to_fp16(v[src + i]);
        }
      } else {
        bad_cache_type("kv_write", kv.type);
      }
    }
  }
}

size_t attention_scratch_floats(int max_ctx, int n_threads) {
  return scratch_stride(max_ctx) * n_threads;
}

void attention(ThreadPool& pool, const KvLayerView& kv, const float* q, int n_tokens, int n_heads,
               const int32_t* pos, const int32_t* slot, float scale, float* out, float* scratch) {
  if (kv.type != GgmlType::F32 && kv.type != GgmlType::F16) bad_cache_type("attention", kv.type);
  AttnCtx ctx{&kv, q, n_tokens, n_heads, pos, slot, scale, out, scratch};
  pool.run(
      [](void* c, int ith, int nth) {
        const AttnCtx& a = *(const AttnCtx*)c;
        const KvLayerView& kv = *a.kv;
        const int hd = kv.head_dim;
        const int group = a.n_heads / kv.n_kv_heads;
        float* sc = a.scratch + scratch_stride(kv.max_ctx) * ith;
        const int n_pairs = a.n_tokens * a.n_heads;
        for (int pr = ith; pr < n_pairs; pr += nth) {
          const int t = pr / a.n_heads, h = pr % a.n_heads;
          const float* qh = a.q + (size_t)pr * hd;
          float* oh = a.out + (size_t)pr * hd;
          if (kv.type == GgmlType::F32)
            attend_one<RowF32>(kv, qh, a.pos[t] + 1, a.slot[t], h / group, a.scale, oh, sc);
          else
            attend_one<RowF16>(kv, qh, a.pos[t] + 1, a.slot[t], h / group, a.scale, oh, sc);
        }
      },
      &ctx);
}

void attention_ref(const KvLayerView& kv, const float* q, int n_tokens, int n_heads, const int32_t* pos,
                   const int32_t* slot, float scale, float* out) {
  const int hd = kv.head_dim;
  const int group = n_heads / kv.n_kv_heads;
  auto elem = [&](const void* base, size_t i) -> double {
    if (kv.type == GgmlType::F32) return ((const float*)base)[i];
    if (kv.type == GgmlType::F16) return fp16_to_fp32(((const uint16_t*)base)[i]);
    bad_cache_type("attention_ref", kv.type);
  };
  for (int t = 0; t < n_tokens; ++t) {
    const int n_pos = pos[t] + 1;
    std::vector<double> s(n_pos);
    for (int h = 0; h < n_heads; ++h) {
      const float* qh = q + ((size_t)t * n_heads + h) * hd;
      const size_t base = cache_index(kv, slot[t], h / group, 0);
      double m = -INFINITY;
      for (int p = 0; p < n_pos; ++p) {
        double d = 0;
        for (int i = 0; i < hd; ++i) d += (double)qh[i] * elem(kv.k, base + (size_t)p * hd + i);
        s[p] = d * scale;
        m = std::max(m, s[p]);
      }
      double sum = 0;
      for (int p = 0; p < n_pos; ++p) {
        s[p] = std::exp(s[p] - m);
        sum += s[p];
      }
      for (int i = 0; i < hd; ++i) {
        double o = 0;
        for (int p = 0; p < n_pos; ++p) o += s[p] * elem(kv.v, base + (size_t)p * hd + i);
        out[((size_t)t * n_heads + h) * hd + i] = (float)(o / sum);
      }
    }
  }
}

}  // namespace ultra::cpu
