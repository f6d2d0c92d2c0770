// AVX2+FMA bodies of rmsnorm and silu_mul (compiled with ULTRA_AVX2_ISA; called by norm.cpp after the
// run-time check).
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/simd_math.h"

namespace ultra::cpu::detail {

void rmsnorm_avx2(const float* x, const float* weight, int n_rows, int n, float eps, float* out) {
  for (int r = 0; r < n_rows; ++r) {
    const float* xr = x + (int64_t)r * n;
    float* o = out + (int64_t)r * n;
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m256 a = _mm256_loadu_ps(xr + i), b = _mm256_loadu_ps(xr + i + 8);
      s0 = _mm256_fmadd_ps(a, a, s0);
      s1 = _mm256_fmadd_ps(b, b, s1);
    }
    float ss = hsum256(_mm256_add_ps(s0, s1));
    for (; i < n; ++i) ss += xr[i] * xr[i];
    const float scale = 1.0f / __builtin_sqrtf(ss / (float)n + eps);
    const __m256 vs = _mm256_set1_ps(scale);
    i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(
          o + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), vs), _mm256_loadu_ps(weight + i)));
    for (; i < n; ++i) o[i] = xr[i] * scale * weight[i];
  }
}

// silu(g) = g * sigmoid(g), sigmoid from e = exp(-|g|) (in (0, 1], never overflows): 1/(1+e) for g >= 0,
// e/(1+e) for g < 0. Below g = -87.3 the true value (|g| e^g < 1e-36) is flushed to 0.
void silu_mul_avx2(const float* gate, const float* up, int64_t n, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 lo = _mm256_set1_ps(-87.3f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp256(_mm256_or_ps(g, sign));  // exp(-|g|)
    const __m256 neg = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
    __m256 sig = _mm256_div_ps(_mm256_blendv_ps(one, e, neg), _mm256_add_ps(one, e));
    sig = _mm256_and_ps(sig, _mm256_cmp_ps(g, lo, _CMP_GE_OQ));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sig), _mm256_loadu_ps(up + i)));
  }
  // (__builtin_expf, not std::exp: no inline function shared with files of other flags.)
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + __builtin_expf(-gate[i])) * up[i];
}

void gelu_mul_avx2(const float* gate, const float* up, int64_t n, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 lo = _mm256_set1_ps(-87.3f);
  const __m256 c2 = _mm256_set1_ps(2.0f * 0.79788456080286535588f);  // 2 sqrt(2 / pi)
  const __m256 k = _mm256_set1_ps(0.044715f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 z = _mm256_mul_ps(c2, _mm256_fmadd_ps(_mm256_mul_ps(k, g), _mm256_mul_ps(g, g), g));  // 2y
    const __m256 e = exp256(_mm256_or_ps(z, sign));  // exp(-|z|)
    const __m256 neg = _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ);
    __m256 sig = _mm256_div_ps(_mm256_blendv_ps(one, e, neg), _mm256_add_ps(one, e));  // sigmoid(z)
    sig = _mm256_and_ps(sig, _mm256_cmp_ps(z, lo, _CMP_GE_OQ));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sig), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) {
    const float g = gate[i], z = 2.0f * 0.79788456080286535588f * (g + 0.044715f * g * g * g);
    out[i] = g / (1.0f + __builtin_expf(-z)) * up[i];
  }
}

// Round to nearest even, as fp32_to_fp16.
void f32_to_f16_row_avx2(const float* x, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i*)(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) out[i] = (uint16_t)_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

void f16_to_f32_row_avx2(const uint16_t* x, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(x + i))));
  for (; i < n; ++i) out[i] = _cvtsh_ss(x[i]);
}

}  // namespace ultra::cpu::detail
