// rmsnorm and silu_mul: the scalar references, and the public kernels choosing between them and the AVX2
// bodies (norm_avx2.cpp).
#include <cmath>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/ops.h"

namespace ultra::cpu {

void rmsnorm(const float* x, const float* weight, int n_rows, int n, float eps, float* out) {
  if (detail::use_avx2()) return detail::rmsnorm_avx2(x, weight, n_rows, n, eps, out);
  rmsnorm_ref(x, weight, n_rows, n, eps, out);
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  if (detail::use_avx2()) return detail::silu_mul_avx2(gate, up, n, out);
  silu_mul_ref(gate, up, n, out);
}

void rmsnorm_ref(const float* x, const float* weight, int n_rows, int n, float eps, float* out) {
  for (int r = 0; r < n_rows; ++r) {
    const float* xr = x + (int64_t)r * n;
    double ss = 0;
    for (int i = 0; i < n; ++i) ss += (double)xr[i] * xr[i];
    const double scale = 1.0 / std::sqrt(ss / n + (double)eps);
    for (int i = 0; i < n; ++i) out[(int64_t)r * n + i] = (float)(xr[i] * scale * weight[i]);
  }
}

void silu_mul_ref(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = (float)(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

}  // namespace ultra::cpu
