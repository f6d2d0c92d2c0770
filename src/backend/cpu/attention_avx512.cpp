// AVX-512 body of attention() (compiled with ULTRA_AVX512_ISA; called by attention.cpp when active_isa()
// is AVX-512): attention_kernel.h's loop on 16-float vectors (half the loads and FMAs of the AVX2 one for
// the scores and the weighted sum of v).
// GCC 12's avx512fintrin.h initialises its "undefined" vectors from themselves, which trips these
// (false-positive) warnings once the intrinsics are inlined (as in matmul_avx512.cpp).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/attention_kernel.h"
#include "backend/cpu/cpu_internal.h"

namespace ultra::cpu::detail {

namespace {

struct V512 {
  using R = __m512;
  static constexpr int W = 16;
  static R zero() { return _mm512_setzero_ps(); }
  static R set1(float v) { return _mm512_set1_ps(v); }
  static R load(const float* p) { return _mm512_loadu_ps(p); }
  static R load(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
  static R fmadd(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
  static R add(R a, R b) { return _mm512_add_ps(a, b); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static void store(float* p, R v) { _mm512_storeu_ps(p, v); }
  static float hsum(R v) { return _mm512_reduce_add_ps(v); }
  // Each vector's 256-bit halves added, then the AVX2 scheme (hadd pairs, 128-bit halves added).
  static __m128 sum4(R a0, R a1, R a2, R a3) {
    auto half = [](R v) { return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)); };
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(half(a0), half(a1)), _mm256_hadd_ps(half(a2), half(a3)));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  }
};

}  // namespace

void attention_thread_avx512(const AttentionArgs& a, int ith, int nth) {
  attention_thread<V512>(a, ith, nth);
}

}  // namespace ultra::cpu::detail
