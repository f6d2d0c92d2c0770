// quantize_row_q8_0 (bit-exact with llama.cpp's quantize_row_q8_0_ref) and dequant_row.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/ops.h"
#include "core/fp8.h"
#include "core/lowbit.h"
#include "core/quants.h"
#include "core/ternary.h"

namespace ultra::cpu {

void quantize_row_q8_0(const float* x, int64_t n, BlockQ8_0* out) {
  const int64_t nb = n / kQ8_0Block;
  for (int64_t i = 0; i < nb; ++i) {
    float amax = 0.0f;
    for (int j = 0; j < kQ8_0Block; ++j) amax = std::max(amax, std::fabs(x[i * kQ8_0Block + j]));
    const float d = amax / ((1 << 7) - 1);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[i].d = fp32_to_fp16(d);
    for (int j = 0; j < kQ8_0Block; ++j) out[i].qs[j] = (int8_t)std::roundf(x[i * kQ8_0Block + j] * id);
  }
}

void dequant_row(const WeightView& w, int64_t r, float* out) {
  const uint8_t* row = (const uint8_t*)w.data + r * w.row_bytes;
  const int64_t n = w.cols;
  switch (w.type) {
    case GgmlType::F32:
      std::memcpy(out, row, n * sizeof(float));
      return;
    case GgmlType::F16: {
      const uint16_t* p = (const uint16_t*)row;
      if (detail::use_avx2()) return detail::f16_to_f32_row_avx2(p, out, n);
      for (int64_t c = 0; c < n; ++c) out[c] = fp16_to_fp32(p[c]);
      return;
    }
    case GgmlType::BF16: {
      const uint16_t* p = (const uint16_t*)row;
      for (int64_t c = 0; c < n; ++c) out[c] = bf16_to_fp32(p[c]);
      return;
    }
    case GgmlType::Q8_0: {
      const BlockQ8_0* b = (const BlockQ8_0*)row;
      for (int64_t i = 0; i < n / kQ8_0Block; ++i) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < kQ8_0Block; ++j) out[i * kQ8_0Block + j] = d * b[i].qs[j];
      }
      return;
    }
    case GgmlType::F8_E4M3: {
      const float* s = w.scale + r * w.scale_row_stride;
      for (int64_t c = 0; c < n; ++c) out[c] = fp8_e4m3_to_fp32(row[c]) * s[c / w.scale_group];
      return;
    }
    case GgmlType::TERNARY: {
      const uint32_t* words = (const uint32_t*)row;
      const float* s = w.scale + r * w.scale_row_stride;
      for (int64_t c = 0; c < n; ++c)
        out[c] = (float)ternary_trit(words[c / kTernaryPerWord], (int)(c % kTernaryPerWord)) *
                 s[c / w.scale_group];
      return;
    }
    case GgmlType::TQ1_0:
      return dequantize_row_tq1_0((const BlockTQ1_0*)row, n, out);
    case GgmlType::TQ2_0:
      return dequantize_row_tq2_0((const BlockTQ2_0*)row, n, out);
    default:
      if (dequantize(w.type, row, n, out)) return;
      std::fprintf(stderr, "ultra: dequant_row: unsupported type %s\n",
                   std::string(type_name(w.type)).c_str());
      std::abort();
  }
}

}  // namespace ultra::cpu
