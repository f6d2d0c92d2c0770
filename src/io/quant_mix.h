// llama.cpp's quantization mixes ("file types" of llama-quantize: q4_k_m, q5_k_s, q6_k, iq4_xs, ...): which
// type each tensor of a model gets, following src/llama-quant.cpp (llama_tensor_get_type) rule for rule, so
// that `ultra quantize --type X` writes the tensor types `llama-quantize IN OUT X` writes for the same file:
//   - only weights of 2+ dimensions whose name ends in "weight" are quantized (not *_norm.weight,
//     ffn_gate_inp, position / token-type embeddings, conv1d and a few other small ones);
//   - output.weight (and token_embd.weight when the embeddings are tied) -> Q6_K, or Q8_0 when its rows are
//     not a multiple of the base type's block;
//   - attn_v / ffn_down get more bits in the *_M mixes (Q6_K in "use_more_bits" layers: the first and last
//     eighth and every third in between), Q3_K_L / Q3_K_M / Q4_K_S and the IQ4 mixes have their own bumps,
//     attn_output in Q2_K / Q3_K_M / Q3_K_L;
//   - a row length that the chosen type's block does not divide falls back: IQ4_XS -> IQ4_NL, Q2_K / Q3_K ->
//     Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, and F16 when even that does not divide it.
// The counters behind the per-layer rules run over the tensors in llama.cpp's order (by layer, then name).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace ultra {

struct QuantMix {
  const char* name;  // "q4_k_m"
  uint32_t ftype;    // llama.cpp's LLAMA_FTYPE_MOSTLY_* (general.file_type)
  GgmlType base;     // the type of the tensors no rule changes
};

// The mix named s (case-insensitive; llama-quantize's aliases q3_k / q4_k / q5_k are the *_M mixes), or
// nullptr.
const QuantMix* find_quant_mix(std::string_view s);
// "q4_0, q4_1, ..." for messages.
std::string quant_mix_names();

// What the rules read from the model (GGUF keys <arch>.block_count, .attention.head_count(_kv),
// .expert_count) and whether importance weights are given.
struct MixModel {
  std::string arch;
  int n_layer = 0;
  int n_head = 0, n_head_kv = 0;
  int n_expert = 0;
  bool has_imatrix = false;
};

struct MixTensor {
  std::string name;
  std::vector<uint64_t> ne;  // ggml order: ne[0] is the row length
  GgmlType type;             // its type in the input
};

struct MixChoice {
  GgmlType type;        // the output type (the input type when not quantized)
  bool quantize;        // a weight llama.cpp quantizes (it is rewritten when type differs from the input's)
  std::string warning;  // non-empty: the row-length fallback that was taken
};

// The output type of each tensor (same order as `tensors`).
std::vector<MixChoice> choose_tensor_types(const QuantMix& mix, const MixModel& model,
                                           const std::vector<MixTensor>& tensors);

}  // namespace ultra
