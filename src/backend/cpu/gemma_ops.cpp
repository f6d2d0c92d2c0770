// The element-wise ops of Gemma 2/3: tanh-GELU gating, soft-capping, scaling, each beside its
// double-precision reference. Plain loops in f32 (as PyTorch computes them; the compiler vectorises the
// arithmetic, tanh stays a libm call), except the GELU gating, which on AVX2 machines computes
// 0.5 (1 + tanh y) as sigmoid(2 y) with a vector exp (norm_avx2.cpp).
#include <cmath>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/ops.h"

namespace ultra::cpu {

namespace {
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
}  // namespace

void gelu_mul(const float* gate, const float* up, int64_t n, float* out) {
  if (detail::use_avx2()) return detail::gelu_mul_avx2(gate, up, n, out);
  const float c = (float)kSqrt2OverPi;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.0f + std::tanh(c * (g + 0.044715f * g * g * g))) * up[i];
  }
}

void gelu_mul_ref(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = (float)(0.5 * g * (1.0 + std::tanh(kSqrt2OverPi * (g + 0.044715 * g * g * g))) * up[i]);
  }
}

void softcap(float* x, int64_t n, float cap) {
  const float inv = 1.0f / cap;
  for (int64_t i = 0; i < n; ++i) x[i] = std::tanh(x[i] * inv) * cap;
}

void softcap_ref(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = (float)(std::tanh((double)x[i] / cap) * cap);
}

void scale(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace ultra::cpu
