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
  // "f32", "f16", "bf16", "q8_0", or the low-bit types of `ultra quantize` (docs/QUANTIZATION.md): "fp8"
  // (F8_E4M3, one scale per row), "ternary" (BitNet b1.58), "tq1_0", "tq2_0" (llama.cpp's). Case-insensitive.
  std::string out_type = "f16";
  // Leave token_embd and output (the LM head) in their input type instead of out_type.
  bool keep_embeddings = false;
  // ternary: one scale per output row instead of one per tensor.
  bool ternary_per_row = false;
  // quantize_model in one of llama.cpp's mixes (out_type "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k_s",
  // "q3_k_m", "q3_k_l", "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m", "q6_k", "iq4_nl", "iq4_xs"; GGUF input):
  // llama.cpp's importance matrix file (GGUF or legacy .dat), or empty for none.
  std::string imatrix;
  // Threads converting the rows of a matrix (mixes only); 0: one per hardware thread.
  int threads = 0;
  // Called with (tensors done, tensors total, name) as conversion proceeds (progress output); for the mixes
  // of quantize_model, instead of the name a line: name, shape, input type -> output type, sizes.
  std::function<void(int, int, const std::string&)> progress;
  // Called with warnings (e.g. no tokenizer found); may be empty.
  std::function<void(const std::string&)> warn;
};

// Writes out_path (a new path, or a regular file that is not one of the inputs: refused before any work
// otherwise) through a temporary file in its directory. Returns the number of tensors written. Throws
// ultra::Error on bad input or I/O failure, leaving nothing behind.
int convert_hf_to_gguf(const std::string& hf_dir, const std::string& out_path,
                       const ConvertOptions& opt = {});

// `ultra quantize`: a GGUF file or an HF directory -> GGUF with every 2-D weight matrix in opt.out_type
// (token_embd / output kept with keep_embeddings). For llama.cpp's mixes (q4_k_m, ...; an HF directory goes
// through a temporary F32 GGUF beside the output, as convert_hf_to_gguf.py then llama-quantize) the
// tensor types are the ones llama-quantize chooses for the same file, the blocks are the bytes its
// quantizers write (core/quantize_blocks.h), and progress reports a line per tensor (name, shape, input
// type -> output type, sizes). From GGUF, the metadata (tokenizer included) and the
// 1-D tensors are copied as they are. A matrix whose row length the type cannot hold (TQ1_0 / TQ2_0: a
// multiple of 256; ternary: 16) is written as Q8_0 (F16 when not a multiple of 32) with a warning, as
// llama.cpp's quantize falls back. Same output-path rules and return value as convert_hf_to_gguf.
int quantize_model(const std::string& in_path, const std::string& out_path, const ConvertOptions& opt);

// For programs: installs handlers for SIGINT, SIGTERM and SIGHUP that remove the temporary file of a
// conversion in progress (up to a model's size) and then end the process as the signal would have (the
// exit status still names the signal). Once; later calls do nothing; a signal ignored when the program
// started stays ignored. Without it an exception still removes the file, a signal does not.
void remove_partial_output_on_signals();

}  // namespace ultra
