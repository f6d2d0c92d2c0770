// HF model directory -> GGUF, following llama.cpp's conventions (tensor names token_embd, blk.N.attn_q...,
// keys llama.* / qwen2.* / qwen3.* / gemma2.* / gemma3.* / phi3.*, Q/K rows permuted for interleaved RoPE in
// arch "llama", rope_freqs for Llama-3 rope scaling, Gemma norms stored as 1 + w, Phi-3's fused attn_qkv and
// ffn_up with rope_factors_short/long, the tokenizer as tokenizer.ggml.* keys), so that the file loads in
// llama.cpp too. 2-D weight matrices are written in the chosen type; norms and biases stay F32. Tensors are
// streamed: one converted tensor is in memory at a time.
#pragma once

#include <functional>
#include <string>

#include "ultra/error.h"

namespace ultra {

struct ConvertOptions {
  std::string out_type = "f16";  // "f32", "f16", "bf16" or "q8_0" (case-insensitive)
  // Called with (tensors done, tensors total, name) as conversion proceeds (progress output).
  std::function<void(int, int, const std::string&)> progress;
  // Called with warnings (e.g. no tokenizer found); may be empty.
  std::function<void(const std::string&)> warn;
};

// Writes out_path (a new path, or a regular file that is not one of the inputs: refused before any work
// otherwise) through a temporary file in its directory. Returns the number of tensors written. Throws
// ultra::Error on bad input or I/O failure, leaving nothing behind.
int convert_hf_to_gguf(const std::string& hf_dir, const std::string& out_path,
                       const ConvertOptions& opt = {});

}  // namespace ultra
