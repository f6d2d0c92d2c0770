// HF model directory -> GGUF, following llama.cpp's conventions (tensor names token_embd, blk.N.attn_q...,
// keys llama.* / qwen2.*, Q/K rows permuted for interleaved RoPE in arch "llama", rope_freqs for Llama-3
// rope scaling). 2-D weight matrices are written in the chosen type; norms and biases stay F32.
#pragma once

#include <functional>
#include <string>

#include "core/dtype.h"

namespace ultra {

struct ConvertOptions {
  GgmlType out_type = GgmlType::F16;  // F32, F16, BF16 or Q8_0
  // Called with (tensors done, tensors total, name) as conversion proceeds (progress output).
  std::function<void(int, int, const std::string&)> progress;
  // Called with warnings (e.g. no tokenizer found); may be empty.
  std::function<void(const std::string&)> warn;
};

// Returns the number of tensors written. Throws ultra::Error on bad input or I/O failure.
int convert_hf_to_gguf(const std::string& hf_dir, const std::string& out_path, const ConvertOptions& opt);

GgmlType parse_out_type(const std::string& s);  // "f32" | "f16" | "bf16" | "q8_0" (case-insensitive)

}  // namespace ultra
