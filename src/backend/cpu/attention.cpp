// kv_write and causal GQA attention over the slotted KV cache (F32 or F16 elements).
// attention: (token, head) pairs (the SIMD loops: tiles of up to 4 consecutive tokens of a sequence, one
// head) dealt round-robin to the threads (prefill tokens have growing context lengths, so contiguous ranges
// would be unbalanced). Per pair: scores s[p] = q.k_p * scale
// for p <= pos[t] into the thread's scratch row (four positions per pass: one reduction for four dot
// products), max-subtracted exp (vectorised, ~2 ulp), sum, then out = sum_p s[p] v_p / sum, accumulated in
// registers (8 vectors of out at a time: 64 elements with AVX2, 128 with AVX-512).
// The SIMD versions of that per-thread loop are attention_kernel.h's (AVX2 and AVX-512 files); the one here
// (dot products in double, scalar exp) runs on CPUs without AVX2 and under ULTRA_NO_SIMD=1.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/ops.h"

namespace ultra::cpu {

namespace {

[[noreturn]] void bad_cache_type(const char* what, GgmlType t) {
  std::fprintf(stderr, "ultra: %s: unsupported KV cache type %s\n", what, std::string(type_name(t)).c_str());
  std::abort();
}

using detail::cache_index;

inline float cache_elem(const KvLayerView& kv, const void* base, size_t i) {
  return kv.type == GgmlType::F32 ? ((const float*)base)[i] : fp16_to_fp32(((const uint16_t*)base)[i]);
}

// attend_one without SIMD (the fallback on CPUs without AVX2): the same steps, dot products in double.
// Positions first..first+n_pos-1 of the cache; sink: the head's sink logit (-infinity: none).
void attend_one_scalar(const KvLayerView& kv, const float* q, int first, int n_pos, int slot, int kvh,
                       float scale, float softcap, float* out, float* sc, float sink) {
  const int hd = kv.head_dim;
  const size_t base = cache_index(kv, slot, kvh, first);
  float m = -INFINITY;
  for (int p = 0; p < n_pos; ++p) {
    double d = 0;
    for (int i = 0; i < hd; ++i) d += (double)q[i] * cache_elem(kv, kv.k, base + (size_t)p * hd + i);
    sc[p] = (float)(d * scale);
    if (softcap > 0) sc[p] = std::tanh(sc[p] / softcap) * softcap;
    m = sc[p] > m ? sc[p] : m;
  }
  m = sink > m ? sink : m;
  double sum = 0;
  for (int p = 0; p < n_pos; ++p) {
    sc[p] = std::exp(sc[p] - m);
    sum += sc[p];
  }
  sum += std::exp(sink - m);  // 0 without a sink
  for (int i = 0; i < hd; ++i) {
    double o = 0;
    for (int p = 0; p < n_pos; ++p) o += (double)sc[p] * cache_elem(kv, kv.v, base + (size_t)p * hd + i);
    out[i] = (float)(o / sum);
  }
}

}  // namespace

namespace detail {

void attention_thread_scalar(const AttentionArgs& a, int ith, int nth) {
  for_each_attention_pair(
      a, ith, nth,
      [&](const float* q, float* out, int first, int n_pos, int slot, int kvh, float* sc, float sink) {
        attend_one_scalar(*a.kv, q, first, n_pos, slot, kvh, a.scale, a.softcap, out, sc, sink);
      });
}

void attention_isa(Isa isa, ThreadPool& pool, const AttentionArgs& args) {
  struct Job {
    void (*fn)(const AttentionArgs&, int, int);
    const AttentionArgs* args;
  } job{isa == Isa::Avx512 ? attention_thread_avx512
        : isa == Isa::Avx2 ? attention_thread_avx2
                           : attention_thread_scalar,
        &args};
  pool.run(
      [](void* c, int ith, int nth) {
        const Job& j = *static_cast<const Job*>(c);
        j.fn(*j.args, ith, nth);
      },
      &job);
}

}  // namespace detail

void kv_write(const KvLayerView& kv, const float* k, const float* v, int n_tokens, const int32_t* pos,
              const int32_t* slot) {
  const int hd = kv.head_dim;
  const bool simd = detail::use_avx2();
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
        if (simd) {
          detail::f32_to_f16_row_avx2(k + src, kd, hd);
          detail::f32_to_f16_row_avx2(v + src, vd, hd);
        } else {
          for (int i = 0; i < hd; ++i) {
            kd[i] = fp32_to_fp16(k[src + i]);
            vd[i] = fp32_to_fp16(v[src + i]);
          }
        }
      } else {
        bad_cache_type("kv_write", kv.type);
      }
    }
  }
}

size_t attention_scratch_floats(int max_ctx, int n_threads) {
  return detail::attention_scratch_stride(max_ctx) * n_threads;
}

void attention(ThreadPool& pool, const KvLayerView& kv, const float* q, int n_tokens, int n_heads,
               const int32_t* pos, const int32_t* slot, float scale, float* out, float* scratch,
               float softcap, int window, const float* sinks) {
  if (kv.type != GgmlType::F32 && kv.type != GgmlType::F16) bad_cache_type("attention", kv.type);
  detail::AttentionArgs args{&kv,   q,   n_tokens, n_heads, pos,    slot,
                             scale, out, scratch,  softcap, window, sinks};
  detail::attention_isa(detail::active_isa(), pool, args);
}

void attention_ref(const KvLayerView& kv, const float* q, int n_tokens, int n_heads, const int32_t* pos,
                   const int32_t* slot, float scale, float* out, float softcap, int window,
                   const float* sinks) {
  const int hd = kv.head_dim;
  const int group = n_heads / kv.n_kv_heads;
  auto elem = [&](const void* base, size_t i) -> double {
    if (kv.type == GgmlType::F32) return ((const float*)base)[i];
    if (kv.type == GgmlType::F16) return fp16_to_fp32(((const uint16_t*)base)[i]);
    bad_cache_type("attention_ref", kv.type);
  };
  for (int t = 0; t < n_tokens; ++t) {
    const int first = window > 0 && pos[t] + 1 > window ? pos[t] + 1 - window : 0;  // j > pos - window
    const int n_pos = pos[t] + 1;
    std::vector<double> s(n_pos);
    for (int h = 0; h < n_heads; ++h) {
      const float* qh = q + ((size_t)t * n_heads + h) * hd;
      const size_t base = cache_index(kv, slot[t], h / group, 0);
      double m = -INFINITY;
      for (int p = first; p < n_pos; ++p) {
        double d = 0;
        for (int i = 0; i < hd; ++i) d += (double)qh[i] * elem(kv.k, base + (size_t)p * hd + i);
        s[p] = d * scale;
        if (softcap > 0) s[p] = std::tanh(s[p] / softcap) * softcap;
        m = std::max(m, s[p]);
      }
      const double sink = sinks ? (double)sinks[h] : -INFINITY;
      m = std::max(m, sink);
      double sum = std::exp(sink - m);  // 0 without a sink
      for (int p = first; p < n_pos; ++p) {
        s[p] = std::exp(s[p] - m);
        sum += s[p];
      }
      for (int i = 0; i < hd; ++i) {
        double o = 0;
        for (int p = first; p < n_pos; ++p) o += s[p] * elem(kv.v, base + (size_t)p * hd + i);
        out[((size_t)t * n_heads + h) * hd + i] = (float)(o / sum);
      }
    }
  }
}

}  // namespace ultra::cpu
