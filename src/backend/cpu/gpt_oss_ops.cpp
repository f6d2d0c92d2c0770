// The op of gpt-oss only (ops.h): the clamped SwiGLU of its experts. Plain scalar code: it runs on an
// expert's [rows, expert_ffn] activations, small beside the matmuls around it.
#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.h"

namespace ultra::cpu {

void swiglu_oai(const float* gate, const float* up, int64_t n, float limit, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = std::min(gate[i], limit);          // transformers: gate.clamp(max=limit)
    const float u = std::clamp(up[i], -limit, limit);  // up.clamp(-limit, limit)
    const float glu = g * (1.0f / (1.0f + std::exp(-(g * kSwigluOaiAlpha))));  // gate * sigmoid(gate * alpha)
    out[i] = (u + 1.0f) * glu;
  }
}

}  // namespace ultra::cpu
