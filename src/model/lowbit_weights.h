// Low-bit matrices of GGUF files (docs/QUANTIZATION.md): F8_E4M3 and TERNARY tensors with their F32 scale
// tensor "<base>.scale", and llama.cpp's TQ1_0 / TQ2_0, which are repacked at load into TERNARY with one
// scale per 256 columns (one kernel for all ternary weights; TQ1_0's base-3 bytes are slow to decode).
#pragma once

#include <string>

#include "core/views.h"
#include "io/gguf.h"

namespace ultra {

struct ModelData;

// "blk.0.attn_q.weight" -> "blk.0.attn_q.scale" (llama.cpp's BitNet files name their scales this way).
std::string scale_tensor_name(const std::string& weight_name);

// Whether a tensor of this type needs a scale tensor.
inline bool has_scale_tensor(GgmlType t) {
  return t == GgmlType::F8_E4M3 || t == GgmlType::TERNARY;
}

// A view of the 2-D tensor t [rows, cols] with the scales of F8_E4M3 / TERNARY attached (the scale tensor
// must be F32 of shape [rows], or [1] for TERNARY; its name is returned in scale_name). TQ1_0 / TQ2_0
// views are raw: dequant_row reads them, matmul needs prepare_lowbit() first.
WeightView gguf_matrix_view(const gguf::Reader& r, const gguf::TensorInfo& t, std::string* scale_name);

// For the kernels: refuses FP8 NaN codes and ternary 11 codes (and TQ2_0's code 3, which ggml decodes as
// +2), and repacks TQ1_0 / TQ2_0 into TERNARY (memory owned by m). Other types pass through.
WeightView prepare_lowbit(ModelData& m, const WeightView& w, const std::string& where);

}  // namespace ultra
