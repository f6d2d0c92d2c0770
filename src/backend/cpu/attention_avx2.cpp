// AVX2+FMA+F16C body of attention() (compiled with ULTRA_AVX2_ISA; called by attention.cpp after the
// run-time check): attention_kernel.h's loop on 8-float vectors.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/attention_kernel.h"
#include "backend/cpu/cpu_internal.h"

namespace ultra::cpu::detail {

namespace {

struct V256 {
  using R = __m256;
  static constexpr int W = 8;
  static R zero() { return _mm256_setzero_ps(); }
  static R set1(float v) { return _mm256_set1_ps(v); }
  static R load(const float* p) { return _mm256_loadu_ps(p); }
  static R load(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
  static R fmadd(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static void store(float* p, R v) { _mm256_storeu_ps(p, v); }
  static float hsum(R v) { return hsum256(v); }
  // [a0 a1 a2 a3] lane sums: hadd pairs within 128-bit halves, then the halves added
  static __m128 sum4(R a0, R a1, R a2, R a3) {
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  }
};

}  // namespace

void attention_thread_avx2(const AttentionArgs& a, int ith, int nth) {
  attention_thread<V256>(a, ith, nth);
}

}  // namespace ultra::cpu::detail
