// CPU kernels of the forward pass. Every op has a plain scalar reference (`*_ref`, used by the tests as
// the oracle) and a fast path (AVX2+FMA+F16C, AVX-512 for matmul) chosen at run time: on a CPU without
// AVX2, or with ULTRA_NO_SIMD=1, the public kernels below run the scalar code (ULTRA_NO_AVX512=1 stops at
// AVX2). Kernels take their outputs and scratch from the caller and never allocate.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "core/views.h"

namespace ultra::cpu {

// The instruction set the kernels run: "avx512", "avx2" or "scalar" (fixed at the first kernel call).
const char* kernel_isa();
// Whether Q8_0 weights multiply int8-quantised activations (AVX512-VNNI CPUs, unless ULTRA_Q8_INT8=0) rather
// than f32 ones exactly.
bool q8_int8_activations();

// y[t, r] = sum_c W[r, c] * x[t, c] (+ bias[r]) for t < n_tokens.
//   x: [n_tokens, cols] f32, y: [n_tokens, rows] f32, bias: [rows] f32 or nullptr.
// n_tokens == 1 is the decode matrix x vector; n_tokens > 1 runs a blocked matrix x matrix (prefill) that
// reads each weight row once per block of tokens. Work is split over the pool's threads by rows.
// scratch: at least matmul_scratch_floats(W, n_tokens) floats (the packed activations of a prefill step's
// panel GEMM; 0 for decode); may be nullptr (the GEMM then packs them per row block, slower).
size_t matmul_scratch_floats(const WeightView& w, int n_tokens, int n_threads);
void matmul(ThreadPool& pool, const WeightView& w, const float* x, int n_tokens, float* y, const float* bias,
            float* scratch);
// Scalar reference (accumulates in double).
void matmul_ref(const WeightView& w, const float* x, int n_tokens, float* y, const float* bias);

// Dequantise/convert row r of W into f32 out[cols] (embedding lookup, tests).
void dequant_row(const WeightView& w, int64_t r, float* out);

// out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i], for each of n_rows rows of length n.
void rmsnorm(const float* x, const float* weight, int n_rows, int n, float eps, float* out);
void rmsnorm_ref(const float* x, const float* weight, int n_rows, int n, float eps, float* out);

// RoPE in place on x [n_tokens, n_heads, head_dim] at positions pos[n_tokens].
// inv_freq [head_dim/2]: angle of pair i at position p is p * inv_freq[i] (computed in f32 as HF does);
// mscale multiplies cos and sin (longrope's attention factor; 1 otherwise).
// interleaved = true: pairs are (x[2i], x[2i+1]) (llama.cpp "norm" mode, GGUF llama files with permuted Q/K);
// interleaved = false: pairs are (x[i], x[i + head_dim/2]) (HF rotate_half, "neox" mode).
void rope(float* x, int n_tokens, int n_heads, int head_dim, const int32_t* pos, const float* inv_freq,
          bool interleaved, float mscale = 1.0f);
void rope_ref(float* x, int n_tokens, int n_heads, int head_dim, const int32_t* pos, const float* inv_freq,
              bool interleaved, float mscale = 1.0f);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)).
void silu_mul(const float* gate, const float* up, int64_t n, float* out);
void silu_mul_ref(const float* gate, const float* up, int64_t n, float* out);

// gpt-oss's expert activation (transformers' GptOssExperts, llama.cpp's swiglu_oai): with g = min(gate[i],
// limit) and u = clamp(up[i], -limit, limit), out[i] = (u + 1) * g * sigmoid(1.702 * g). out may be up.
constexpr float kSwigluOaiAlpha = 1.702f;
void swiglu_oai(const float* gate, const float* up, int64_t n, float limit, float* out);

// Gemma 2/3 (gemma_ops.cpp).
// out[i] = gelu_tanh(gate[i]) * up[i], gelu_tanh(g) = g/2 * (1 + tanh(sqrt(2/pi) * (g + 0.044715 g^3))).
void gelu_mul(const float* gate, const float* up, int64_t n, float* out);
void gelu_mul_ref(const float* gate, const float* up, int64_t n, float* out);
// x[i] = tanh(x[i] / cap) * cap in place (attention and final logit soft-capping).
void softcap(float* x, int64_t n, float cap);
void softcap_ref(float* x, int64_t n, float cap);
// x[i] *= s in place.
void scale(float* x, int64_t n, float s);

// Writes k/v rows of n_tokens tokens into the cache at (slot[t], head, pos[t]).
//   k, v: [n_tokens, n_kv_heads, head_dim] f32 (converted to the cache type).
void kv_write(const KvLayerView& kv, const float* k, const float* v, int n_tokens, const int32_t* pos,
              const int32_t* slot);

// Causal attention over the cache: token t, head h attends to positions [0, pos[t]] of slot[t] (window > 0:
// only (pos[t] - window, pos[t]]), kv head h / (n_heads / n_kv_heads) (GQA). Scores are q.k * scale, then
// tanh(s / softcap) * softcap when softcap > 0. sinks [n_heads] or null: head h's softmax denominator also
// holds exp(sinks[h] - m), m the max of the scores and the sink (gpt-oss's attention sinks; transformers
// appends the sink as one more score and drops its weight). Assumes kv_write already stored this step's
// tokens.
//   q: [n_tokens, n_heads, head_dim], out: [n_tokens, n_heads, head_dim]
//   scratch: at least attention_scratch_floats(...) floats.
size_t attention_scratch_floats(int max_ctx, int n_threads);
void attention(ThreadPool& pool, const KvLayerView& kv, const float* q, int n_tokens, int n_heads,
               const int32_t* pos, const int32_t* slot, float scale, float* out, float* scratch,
               float softcap = 0, int window = 0, const float* sinks = nullptr);
void attention_ref(const KvLayerView& kv, const float* q, int n_tokens, int n_heads, const int32_t* pos,
                   const int32_t* slot, float scale, float* out, float softcap = 0, int window = 0,
                   const float* sinks = nullptr);

// Quantise f32 rows to Q8_0 (used by `ultra quantize`/convert and tests): n % 32 == 0.
void quantize_row_q8_0(const float* x, int64_t n, BlockQ8_0* out);

}  // namespace ultra::cpu
