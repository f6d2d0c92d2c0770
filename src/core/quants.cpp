#include "core/quants.h"

#include <cmath>

#include "core/quants_iq.h"

namespace ultra {

namespace {

template <class B>
void rows(const void* src, int64_t n, int block, float* out) {
  const B* b = static_cast<const B*>(src);
  for (int64_t i = 0; i < n / block; ++i) dequant_block(b[i], out + i * block);
}

bool finite_f16(uint16_t h) {
  return (h & 0x7c00) != 0x7c00;
}

}  // namespace

bool is_block_weight_type(GgmlType t) {
  return is_block_quant(t) && t != GgmlType::Q8_0 && t != GgmlType::Q8_1 && t != GgmlType::Q8_K;
}

bool is_block_quant(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q8_0:
    case GgmlType::Q8_1:
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::Q8_K:
    case GgmlType::IQ4_NL:
    case GgmlType::IQ4_XS:
    case GgmlType::MXFP4:
    case GgmlType::IQ2_XXS:
    case GgmlType::IQ2_XS:
    case GgmlType::IQ2_S:
    case GgmlType::IQ3_XXS:
    case GgmlType::IQ3_S:
    case GgmlType::IQ1_S:
    case GgmlType::IQ1_M:
      return true;
    default:
      return false;
  }
}

bool dequantize(GgmlType t, const void* src, int64_t n, float* out) {
  switch (t) {
    case GgmlType::Q4_0:
      return rows<BlockQ4_0>(src, n, kQK4, out), true;
    case GgmlType::Q4_1:
      return rows<BlockQ4_1>(src, n, kQK4, out), true;
    case GgmlType::Q5_0:
      return rows<BlockQ5_0>(src, n, kQK4, out), true;
    case GgmlType::Q5_1:
      return rows<BlockQ5_1>(src, n, kQK4, out), true;
    case GgmlType::Q8_0: {
      const BlockQ8_0* b = static_cast<const BlockQ8_0*>(src);
      for (int64_t i = 0; i < n / kQ8_0Block; ++i) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < kQ8_0Block; ++j) out[i * kQ8_0Block + j] = b[i].qs[j] * d;
      }
      return true;
    }
    case GgmlType::Q8_1:
      return rows<BlockQ8_1>(src, n, kQK4, out), true;
    case GgmlType::Q2_K:
      return rows<BlockQ2_K>(src, n, kQK_K, out), true;
    case GgmlType::Q3_K:
      return rows<BlockQ3_K>(src, n, kQK_K, out), true;
    case GgmlType::Q4_K:
      return rows<BlockQ4_K>(src, n, kQK_K, out), true;
    case GgmlType::Q5_K:
      return rows<BlockQ5_K>(src, n, kQK_K, out), true;
    case GgmlType::Q6_K:
      return rows<BlockQ6_K>(src, n, kQK_K, out), true;
    case GgmlType::Q8_K:
      return rows<BlockQ8_K>(src, n, kQK_K, out), true;
    case GgmlType::IQ4_NL:
      return rows<BlockIQ4_NL>(src, n, kQK4, out), true;
    case GgmlType::IQ4_XS:
      return rows<BlockIQ4_XS>(src, n, kQK_K, out), true;
    case GgmlType::MXFP4:
      return rows<BlockMXFP4>(src, n, kQK4, out), true;
    case GgmlType::IQ2_XXS:
      return rows<BlockIQ2_XXS>(src, n, kQK_K, out), true;
    case GgmlType::IQ2_XS:
      return rows<BlockIQ2_XS>(src, n, kQK_K, out), true;
    case GgmlType::IQ2_S:
      return rows<BlockIQ2_S>(src, n, kQK_K, out), true;
    case GgmlType::IQ3_XXS:
      return rows<BlockIQ3_XXS>(src, n, kQK_K, out), true;
    case GgmlType::IQ3_S:
      return rows<BlockIQ3_S>(src, n, kQK_K, out), true;
    case GgmlType::IQ1_S:
      return rows<BlockIQ1_S>(src, n, kQK_K, out), true;
    case GgmlType::IQ1_M:
      return rows<BlockIQ1_M>(src, n, kQK_K, out), true;
    default:
      return false;
  }
}

int64_t first_nonfinite_block(GgmlType t, const void* src, int64_t n_blocks) {
  const auto tt = type_traits(t);
  if (!tt || !is_block_quant(t)) return -1;
  const uint8_t* p = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n_blocks; ++i) {
    const uint8_t* b = p + i * tt->block_bytes;
    auto h = [&](size_t off) {
      uint16_t v;
      std::memcpy(&v, b + off, 2);
      return finite_f16(v);
    };
    bool ok = true;
    switch (t) {
      case GgmlType::Q4_0:
      case GgmlType::Q5_0:
      case GgmlType::Q8_0:
      case GgmlType::IQ4_NL:
      case GgmlType::IQ4_XS:
      case GgmlType::IQ2_XXS:
      case GgmlType::IQ2_XS:
      case GgmlType::IQ2_S:
      case GgmlType::IQ3_XXS:
      case GgmlType::IQ3_S:
      case GgmlType::IQ1_S:
        ok = h(0);
        break;
      case GgmlType::IQ1_M: {
        BlockIQ1_M m;
        std::memcpy(&m, b, sizeof m);
        ok = finite_f16(iq1m_d(m));
        break;
      }
      case GgmlType::Q4_1:
      case GgmlType::Q5_1:
      case GgmlType::Q8_1:
      case GgmlType::Q4_K:
      case GgmlType::Q5_K:
        ok = h(0) && h(2);
        break;
      case GgmlType::Q2_K:
        ok = h(offsetof(BlockQ2_K, d)) && h(offsetof(BlockQ2_K, dmin));
        break;
      case GgmlType::Q3_K:
        ok = h(offsetof(BlockQ3_K, d));
        break;
      case GgmlType::Q6_K:
        ok = h(offsetof(BlockQ6_K, d));
        break;
      case GgmlType::Q8_K: {
        float d;
        std::memcpy(&d, b, 4);
        ok = std::isfinite(d);
        break;
      }
      default:  // MXFP4: every E8M0 byte is a power of two here (ggml does not treat 0xFF as NaN)
        break;
    }
    if (!ok) return i;
  }
  return -1;
}

}  // namespace ultra
