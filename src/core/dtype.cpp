#include "core/dtype.h"

namespace ultra {

std::optional<TypeTraits> type_traits(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
      return TypeTraits{"F32", 1, 4};
    case GgmlType::F16:
      return TypeTraits{"F16", 1, 2};
    case GgmlType::BF16:
      return TypeTraits{"BF16", 1, 2};
    case GgmlType::F64:
      return TypeTraits{"F64", 1, 8};
    case GgmlType::I8:
      return TypeTraits{"I8", 1, 1};
    case GgmlType::I16:
      return TypeTraits{"I16", 1, 2};
    case GgmlType::I32:
      return TypeTraits{"I32", 1, 4};
    case GgmlType::I64:
      return TypeTraits{"I64", 1, 8};
    case GgmlType::Q4_0:
      return TypeTraits{"Q4_0", 32, 18};
    case GgmlType::Q4_1:
      return TypeTraits{"Q4_1", 32, 20};
    case GgmlType::Q5_0:
      return TypeTraits{"Q5_0", 32, 22};
    case GgmlType::Q5_1:
      return TypeTraits{"Q5_1", 32, 24};
    case GgmlType::Q8_0:
      return TypeTraits{"Q8_0", 32, 34};
    case GgmlType::Q8_1:
      return TypeTraits{"Q8_1", 32, 36};
    case GgmlType::Q2_K:
      return TypeTraits{"Q2_K", 256, 84};
    case GgmlType::Q3_K:
      return TypeTraits{"Q3_K", 256, 110};
    case GgmlType::Q4_K:
      return TypeTraits{"Q4_K", 256, 144};
    case GgmlType::Q5_K:
      return TypeTraits{"Q5_K", 256, 176};
    case GgmlType::Q6_K:
      return TypeTraits{"Q6_K", 256, 210};
    case GgmlType::Q8_K:
      return TypeTraits{"Q8_K", 256, 292};
    case GgmlType::IQ2_XXS:
      return TypeTraits{"IQ2_XXS", 256, 66};
    case GgmlType::IQ2_XS:
      return TypeTraits{"IQ2_XS", 256, 74};
    case GgmlType::IQ3_XXS:
      return TypeTraits{"IQ3_XXS", 256, 98};
    case GgmlType::IQ1_S:
      return TypeTraits{"IQ1_S", 256, 50};
    case GgmlType::IQ4_NL:
      return TypeTraits{"IQ4_NL", 32, 18};
    case GgmlType::IQ3_S:
      return TypeTraits{"IQ3_S", 256, 110};
    case GgmlType::IQ2_S:
      return TypeTraits{"IQ2_S", 256, 82};
    case GgmlType::IQ4_XS:
      return TypeTraits{"IQ4_XS", 256, 136};
    case GgmlType::IQ1_M:
      return TypeTraits{"IQ1_M", 256, 56};
    case GgmlType::MXFP4:
      return TypeTraits{"MXFP4", 32, 17};
    case GgmlType::NVFP4:
      return TypeTraits{"NVFP4", 64, 36};
    case GgmlType::Q1_0:
      return TypeTraits{"Q1_0", 128, 18};
    case GgmlType::Q2_0:
      return TypeTraits{"Q2_0", 64, 18};
    case GgmlType::TQ1_0:
      return TypeTraits{"TQ1_0", 256, 54};
    case GgmlType::TQ2_0:
      return TypeTraits{"TQ2_0", 256, 66};
    case GgmlType::F8_E4M3:
      return TypeTraits{"F8_E4M3", 1, 1};
    case GgmlType::TERNARY:
      return TypeTraits{"TERNARY", 16, 4};
  }
  return std::nullopt;
}

bool to_f32(GgmlType t, const void* src, int64_t n, float* out) {
  const auto* p = static_cast<const uint8_t*>(src);
  uint16_t h;
  for (int64_t i = 0; i < n; ++i) {
    switch (t) {
      case GgmlType::F32:
        std::memcpy(&out[i], p + 4 * i, 4);
        break;
      case GgmlType::F16:
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = fp16_to_fp32(h);
        break;
      case GgmlType::BF16:
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = bf16_to_fp32(h);
        break;
      default:
        return false;
    }
  }
  return true;
}

std::string_view type_name(GgmlType t) {
  auto tt = type_traits(t);
  return tt ? tt->name : std::string_view("unknown");
}

}  // namespace ultra
