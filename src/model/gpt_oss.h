// gpt-oss's experts in HF checkpoints. transformers keeps each layer's experts as fused tensors:
//   mlp.experts.gate_up_proj       [n_expert, dim, 2 * ffn]  (x @ W; gate in the even columns, up in the odd)
//   mlp.experts.gate_up_proj_bias  [n_expert, 2 * ffn]       (interleaved alike)
//   mlp.experts.down_proj          [n_expert, ffn, dim]      (x @ W)
//   mlp.experts.down_proj_bias     [n_expert, dim]
// (dequantised checkpoints, F32 / F16 / BF16), or, as openai/gpt-oss-20b ships them, MXFP4:
//   mlp.experts.{gate_up,down}_proj_blocks  [n_expert, rows, cols / 32, 16] uint8: E2M1 codes, two a byte,
//                                           element 2j in the low nibble of byte j, 2j + 1 in the high one
//   mlp.experts.{gate_up,down}_proj_scales  [n_expert, rows, cols / 32] uint8: E8M0 exponents, 2^(s - 127)
// with rows the output features (gate_up: 2 * ffn interleaved as above) and cols the input ones.
// The engine's experts are llama.cpp's [rows = out, cols = in] matrices, so these are rearranged at load into
// memory the ModelData owns, in the checkpoint's own type: the dense ones transposed and de-interleaved, the
// MXFP4 ones repacked into ggml's block_mxfp4 (the exponent byte, then element j in the low nibble of byte j
// and j + 16 in the high one: the same codes, exactly), the way llama.cpp's converter does.
#pragma once

#include <string>
#include <unordered_set>

#include "io/safetensors.h"
#include "model/model.h"

namespace ultra {

// Fills every layer's gate_exps, up_exps, down_exps and their biases from the checkpoint (m.hp is gpt-oss's
// and m.layers sized); the tensors taken are added to used. Throws ultra::Error naming the tensor on a
// missing tensor, a wrong shape or dtype, or a row length that is not a multiple of 32 (MXFP4).
void load_gpt_oss_hf_experts(ModelData& m, const safetensors::Checkpoint& ck,
                             std::unordered_set<std::string>& used, const std::string& dir);

}  // namespace ultra
